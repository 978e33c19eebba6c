"""The last look before a removal call (scaling/last_look.py), with the group's kind and the cluster faked:
a victim a fresh read finds not free is dropped and kept, with its reason; a read that fails raises (the
executor then removes nothing and keeps the intent). The defects it reproduces (issue 40): a pod created
with `spec.nodeName`, or tolerating everything, bound to a cordoned idle victim inside the tick and the node
was terminated with it; a node someone uncordoned was still removed as gpufleet's drained node."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Decision,
    Demand,
    GroupObservation,
    GroupRef,
    InstanceObservation,
    NodeMark,
    Trigger,
    TriggerKind,
)
from gpufleet.kubernetes.pods import ClusterPods, NodeState, cluster_pods
from gpufleet.scaling.last_look import LastLook, PodsLook
from tests.adapters.scaling.wiring import Pods

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="batch")
IDS = ("i-0000000000000000a", "i-0000000000000000b", "i-0000000000000000c")


@dataclass
class Kind:
    """The group's kind: what its ASG says of each victim now (`busy`), or a read that fails."""

    busy: dict[str, str] = field(default_factory=dict)
    fails: bool = False
    asked: list[tuple[str, ...]] = field(default_factory=list)
    launched: tuple[str, ...] = ()  # instances that came up since the decision's read
    gone: bool = False  # the group was deleted since the read
    group_reads: int = 0

    def observe_one(self, ref: GroupRef) -> GroupObservation | None:
        self.group_reads += 1
        if self.gone:
            return None
        obs = observe()
        more = tuple(InstanceObservation(instance_id=i, lifecycle_state="Pending") for i in self.launched)
        return obs.model_copy(update={"instances": obs.instances + more})

    def last_look(self, obs: GroupObservation, victims: Sequence[str]) -> dict[str, str]:
        self.asked.append(tuple(victims))
        if self.fails:
            raise RuntimeError("Throttling: Rate exceeded")
        return {v: why for v, why in self.busy.items() if v in victims}


@dataclass
class Registry:
    kind: Kind

    def provider(self, kind: GroupKind) -> Kind:
        return self.kind


@dataclass
class Cluster:
    """The cluster's API: its pods (documents as the API serves them) and nodes, one read per call
    (`reader`: the demand path's own test adapter over it)."""

    pods: list[dict[str, Any]] = field(default_factory=list)
    nodes: dict[str, NodeState] = field(default_factory=dict)
    reads: int = 0

    def listing(self, cluster: str, resources: Mapping[str, float], **_: Any) -> ClusterPods:
        self.reads += 1
        return cluster_pods(cluster, self.pods, 1).model_copy(update={"nodes": dict(self.nodes)})

    @property
    def reader(self) -> Pods:
        return Pods(self.listing)


def node_name(iid: str) -> str:
    return f"ip-10-0-0-{iid[-1]}.ec2.internal"


def bound(iid: str, owner: str = "Job", name: str = "p", **spec: Any) -> dict[str, Any]:
    meta = {"name": name, "namespace": "batch", "uid": f"u-{name}",
            "ownerReferences": [{"kind": owner, "name": "o", "uid": f"u-o-{name}", "controller": True}]}  # fmt: skip
    body = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}], "nodeName": node_name(iid), **spec}
    return {"metadata": meta, "spec": body, "status": {"phase": "Running"}}


def nodes(cordoned: Iterable[str] = (), ours: bool = True) -> dict[str, NodeState]:
    closed = set(cordoned)
    return {
        node_name(i): NodeState(name=node_name(i), unschedulable=i in closed, ours=ours and i in closed, instance_id=i)
        for i in IDS
    }


def observe(marked: Iterable[str] = ()) -> GroupObservation:
    closed = set(marked)
    instances = tuple(
        InstanceObservation(
            instance_id=i, node_name=node_name(i), mark=NodeMark.GPUFLEET if i in closed else NodeMark.NONE
        )
        for i in IDS
    )
    demand = Demand(source="cluster ml", knows_nodes=True, cluster="ml")
    return GroupObservation(ref=REF, min_size=0, max_size=6, desired=3, instances=instances, demand=demand)


def scale_in(victims: tuple[str, ...]) -> Decision:
    return Decision(
        group=REF.key, action=Action.SCALE_IN, current=3, desired=3 - len(victims), victims=victims,
        reason="no pods waiting (cluster ml): scale in", trigger=Trigger(kind=TriggerKind.DEMAND, name="cluster ml"),
        event_id="tick", at=NOW,
    )  # fmt: skip


def look(kind: Kind, cluster: Cluster) -> LastLook:
    return LastLook(Registry(kind), PodsLook(cluster.reader, instances_of=lambda names: {}))  # type: ignore[arg-type]


def test_a_pod_bound_by_node_name_to_a_cordoned_victim_keeps_it() -> None:
    cluster = Cluster(pods=[bound(IDS[1], nodeName=node_name(IDS[1]))], nodes=nodes(cordoned=IDS[1:]))
    d = look(Kind(), cluster)(scale_in(IDS[1:]), observe(marked=IDS[1:]), NOW)
    assert (d.victims, d.desired) == ((IDS[2],), 2)
    assert f"{IDS[1]}: pods run on its node {node_name(IDS[1])} now" in d.reason
    assert cluster.reads == 1  # one pod read of the cluster for the change, not one per victim


def test_a_pod_tolerating_every_taint_bound_to_a_victim_keeps_it() -> None:
    pod = bound(IDS[2], tolerations=[{"operator": "Exists"}])
    d = look(Kind(), Cluster(pods=[pod], nodes=nodes()))(scale_in(IDS[1:]), observe(), NOW)
    assert d.victims == (IDS[1],) and d.desired == 2


def test_a_daemonset_pod_keeps_no_victim() -> None:
    pods = [bound(i, owner="DaemonSet", name=f"ds-{i[-1]}") for i in IDS]
    d = look(Kind(), Cluster(pods=pods, nodes=nodes()))(scale_in(IDS[1:]), observe(), NOW)
    assert d.victims == IDS[1:] and d.desired == 1


def test_a_victim_someone_uncordoned_is_no_longer_gpufleets_and_is_kept() -> None:
    cluster = Cluster(nodes=nodes(cordoned=[IDS[2]]))  # IDS[1] was uncordoned since the decision
    d = look(Kind(), cluster)(scale_in(IDS[1:]), observe(marked=IDS[1:]), NOW)
    assert d.victims == (IDS[2],)
    assert f"its node {node_name(IDS[1])} is no longer closed by gpufleet" in d.reason


def test_protection_set_since_the_decision_keeps_the_victim_before_any_pod_read() -> None:
    cluster = Cluster(nodes=nodes())
    kind = Kind(busy={IDS[1]: "scale-in protected now", IDS[2]: "scale-in protected now"})
    d = look(kind, cluster)(scale_in(IDS[1:]), observe(), NOW)
    assert (d.action, d.victims, d.desired) == (Action.HOLD, (), 3)
    assert cluster.reads == 0  # nothing left to look at in the cluster


def test_a_read_that_fails_raises_so_nothing_is_removed() -> None:
    with pytest.raises(RuntimeError, match="Throttling"):
        look(Kind(fails=True), Cluster())(scale_in(IDS[1:]), observe(), NOW)


def test_a_node_running_pods_that_maps_to_no_instance_keeps_every_victim() -> None:
    stray = bound(IDS[0])
    stray["spec"]["nodeName"] = "custom-hostname-7"  # not in the node listing, no EC2 name matches
    d = look(Kind(), Cluster(pods=[stray], nodes=nodes()))(scale_in(IDS[1:]), observe(), NOW)
    assert (d.action, d.victims) == (Action.HOLD, ())
    assert "map to no instance (custom-hostname-7...)" in d.reason


def test_a_count_below_the_instances_held_is_raised_to_name_every_node() -> None:
    """desired 3 -> 1 naming one victim would leave EC2 Auto Scaling or EKS to pick one more."""
    d = scale_in((IDS[2],)).model_copy(update={"desired": 1})
    out = look(Kind(), Cluster(nodes=nodes()))(d, observe(), NOW)
    assert (out.desired, out.victims) == (2, (IDS[2],))
    assert "gpufleet removes only nodes it names" in out.reason


def test_a_launch_that_came_up_since_the_read_raises_a_lowered_count() -> None:
    """A launch still owed comes up between the decision's read and the call: the group is read again for
    every change that lowers its count, so the count still names every node it removes."""
    kind = Kind(launched=("i-0000000000000000d",))
    owed = observe().model_copy(update={"desired": 4})  # 3 instances, a 4th still owed at the read
    d = scale_in((IDS[2],)).model_copy(update={"current": 4, "desired": 2})  # the owed one cancelled, c removed
    assert look(Kind(), Cluster(nodes=nodes()))(d, owed, NOW) == d  # as read: the count names every node
    out = look(kind, Cluster(nodes=nodes()))(d, owed, NOW)
    assert (out.action, out.desired, out.victims) == (Action.SCALE_IN, 3, (IDS[2],))
    assert "held at 3, not 2" in out.reason and kind.group_reads == 1


def test_a_group_gone_since_the_read_raises_so_nothing_is_removed() -> None:
    with pytest.raises(LookupError, match="cannot be read again"):
        look(Kind(gone=True), Cluster(nodes=nodes()))(scale_in((IDS[2],)), observe(), NOW)


def test_a_raise_is_not_read_again() -> None:
    kind = Kind()
    up = scale_in(()).model_copy(update={"action": Action.SCALE_OUT, "desired": 4})
    assert look(kind, Cluster())(up, observe(), NOW) == up and kind.group_reads == 0
