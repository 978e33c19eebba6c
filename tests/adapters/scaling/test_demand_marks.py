"""The Kubernetes demand source tells consolidation what each node holds and whether it is closed: node
name, GPUs held, whose cordon; a cordoned node is never room for waiting work; a node listing that fails
leaves the marks unknown (the group drains nothing) while the pods' demand still works."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    MarkChannel,
    NodeMark,
)
from gpufleet.kubernetes.pods import ClusterPods, NodeListing, NodeState, WaitingPod
from gpufleet.policy.fleet import Consolidation, DemandSource, GroupSettings, KubernetesDemand
from gpufleet.scaling.core import decide_reconcile
from gpufleet.scaling.demand import NodeShape
from gpufleet.scaling.demand_source import DemandReader
from tests.adapters.scaling.wiring import Pods, shapes

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
PLAIN = GroupSettings(demand=DemandSource(kubernetes=KubernetesDemand()))
ATTRITION = PLAIN.model_copy(update={"consolidate": Consolidation.ATTRITION})
OFF = PLAIN.model_copy(update={"consolidate": Consolidation.OFF})
IDS = {"n1": "i-1", "n2": "i-2", "n3": "i-3", "n4": "i-4"}


class Told:
    """A logger that keeps its warnings."""

    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any]]] = []

    def warning(self, message: str, extra: dict[str, Any]) -> None:
        self.warnings.append((message, extra))

    def exception(self, message: str, extra: dict[str, Any]) -> None:  # pragma: no cover (a bug would show)
        raise AssertionError(message)


def group() -> GroupObservation:
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="gpu"),
        min_size=0,
        max_size=4,
        desired=4,
        instances=tuple(InstanceObservation(instance_id=i) for i in IDS.values()),
    )


def listing(nodes: dict[str, NodeState] | None, unreadable: str | None = None) -> ClusterPods:
    """n1 runs 3 GPUs of work; n2 idle and cordoned by gpufleet; n3 idle and cordoned by someone else; n4 idle."""
    return ClusterPods(
        cluster="ml",
        waiting=(WaitingPod(namespace="a", name="wait", gpus=8),),
        gpu_nodes=frozenset({"n1"}),
        gpus_held={"n1": 3.0},
        nodes=nodes,
        nodes_unreadable=unreadable,
    )


NODES = {
    "n1": NodeState(name="n1", instance_id="i-1"),
    "n2": NodeState(name="n2", unschedulable=True, ours=True, instance_id="i-2"),
    "n3": NodeState(name="n3", unschedulable=True, instance_id="i-3"),
    "n4": NodeState(name="n4", instance_id="i-4"),
}


def attach(
    pods: ClusterPods, settings: GroupSettings, told: Told | None = None
) -> tuple[GroupObservation, list[NodeListing]]:
    asked: list[NodeListing] = []

    def cluster_pods(
        cluster: str, resources: object, nodes: NodeListing = NodeListing.NONE, **_: object
    ) -> ClusterPods:
        asked.append(nodes)
        return pods

    reader = DemandReader(
        sqs=None,
        cloudwatch=None,
        cluster_pods=Pods(cluster_pods),
        groups=shapes(lambda cluster, nodegroup: NodeShape(gpus=8)),
        instances_of=lambda names: {n: IDS[n] for n in names if n in IDS},
        logger=told or Told(),  # type: ignore[arg-type]
    )
    [(obs, _)] = reader.attach([(group(), settings)], NOW)
    return obs, asked


def test_each_node_says_its_name_what_it_holds_and_whose_cordon_it_is() -> None:
    obs, asked = attach(listing(NODES), ATTRITION)
    assert asked == [NodeListing.ALL]  # a group of the cluster consolidates: all its nodes are listed
    assert obs.marks is MarkChannel.KUBERNETES and obs.cluster == "ml"
    seen = {i.instance_id: (i.node_name, i.gpus_held, i.mark) for i in obs.instances}
    assert seen == {
        "i-1": ("n1", 3.0, NodeMark.NONE),
        "i-2": ("n2", 0.0, NodeMark.GPUFLEET),
        "i-3": ("n3", 0.0, NodeMark.OTHER),
        "i-4": ("n4", 0.0, NodeMark.NONE),
    }


def test_a_cordoned_node_is_never_room_for_waiting_work() -> None:
    obs, _ = attach(listing(NODES), ATTRITION)
    assert obs.demand is not None
    assert obs.demand.free_gpus == (8.0,)  # n4 only: n2 and n3 are cordoned (whoever did it), n1 is busy
    assert [w.name for w in obs.demand.waiting] == ["a/wait"]


def test_a_node_listing_that_fails_leaves_the_marks_unknown_and_the_demand_working() -> None:
    told = Told()
    obs, asked = attach(listing(None, "listing nodes failed: HTTP 403 Forbidden"), ATTRITION, told)
    assert asked == [NodeListing.ALL]
    assert obs.marks is None  # fail closed: the core drains nothing here
    assert obs.demand is not None and obs.demand.known and [w.name for w in obs.demand.waiting] == ["a/wait"]
    # Only n1's node is known (a GPU pod is bound to it); the others map to no node: unknown, unmarkable.
    assert [(i.node_name, i.gpus_held) for i in obs.instances] == [("n1", 3.0), *[(None, None)] * 3]
    [(message, extra)] = told.warnings
    assert "node marks unknown" in message and "403" in extra["cause"]
    # An idle node may be one gpufleet cordoned (no pod lands there, nothing reopens it): none is room, so
    # the 8-GPU pod gets a launch instead of waiting on it.
    assert obs.demand.free_gpus == ()


def test_without_attrition_only_gpufleets_labelled_nodes_are_listed_and_its_cordons_are_known() -> None:
    drained = {"n2": NODES["n2"]}  # what `labelSelector=gpufleet.io/drained` answers: n2 only
    obs, asked = attach(listing(drained), OFF)
    assert asked == [NodeListing.DRAINED]
    assert obs.marks is MarkChannel.KUBERNETES
    seen = {i.instance_id: (i.node_name, i.gpus_held, i.mark) for i in obs.instances}
    assert seen == {
        "i-1": ("n1", 3.0, NodeMark.NONE),
        "i-2": ("n2", 0.0, NodeMark.GPUFLEET),
        "i-3": (None, None, NodeMark.NONE),  # not listed: no node known, nothing bound to it known
        "i-4": (None, None, NodeMark.NONE),
    }
    assert obs.demand is not None and obs.demand.free_gpus == (8.0, 8.0)  # n3, n4: n2 is closed, not room


def test_consolidation_switched_off_reopens_gpufleets_cordon_the_waiting_pod_would_use() -> None:
    """n2 was closed while consolidation was on; with it off, the real reader lists only labelled nodes:
    n2 is gpufleet's, so it is not room and the core reopens it for the pod that waits."""
    one = group().model_copy(update={"instances": group().instances[:2], "desired": 2})
    pods = listing({"n2": NODES["n2"]})
    reader = DemandReader(
        sqs=None,
        cloudwatch=None,
        cluster_pods=Pods(
            lambda cluster, resources, nodes=NodeListing.NONE, **_: pods if nodes == "drained" else listing(None)
        ),
        groups=shapes(lambda cluster, nodegroup: NodeShape(gpus=8)),
        instances_of=lambda names: {n: IDS[n] for n in names if n in IDS},
        logger=Told(),  # type: ignore[arg-type]
    )
    [(obs, _)] = reader.attach([(one, OFF)], NOW)
    assert obs.marks is MarkChannel.KUBERNETES and obs.demand is not None and obs.demand.free_gpus == ()
    decision = decide_reconcile(obs, OFF, GroupState(), NOW, event_id="e1")
    assert "i-2" in decision.undrain or decision.action is Action.SCALE_OUT, decision.reason


def test_a_drained_listing_that_is_refused_is_told_once_and_leaves_the_marks_unknown() -> None:
    told = Told()
    obs, _ = attach(listing(None, "listing nodes failed: HTTP 403 Forbidden"), OFF, told)
    assert obs.marks is None
    [(message, extra)] = told.warnings
    assert "a node gpufleet closed is not reopened" in message and "403" in extra["cause"]


def test_an_instance_with_no_node_yet_holds_an_unknown_amount_and_has_no_name() -> None:
    """With every node listed, an instance the cluster has no node for (its kubelet has not registered)
    is not 'known to hold nothing': it cannot be marked, so consolidation must not pick it."""
    listed = {k: v for k, v in NODES.items() if k != "n4"}
    obs, _ = attach(listing(listed), ATTRITION)
    i4 = obs.instances[3]
    assert (i4.instance_id, i4.node_name, i4.gpus_held) == ("i-4", None, None)


def test_gpus_held_are_unknown_when_a_gpu_pods_node_is_not_mapped() -> None:
    pods = listing(NODES).model_copy(
        update={"gpu_nodes": frozenset({"n1", "custom-7"}), "gpus_held": {"n1": 3.0, "custom-7": 1.0}}
    )
    obs, _ = attach(pods, ATTRITION)
    # A GPU pod on a node name EC2 does not map: the nodes it is not known to be off hold an unknown amount.
    assert [i.gpus_held for i in obs.instances] == [3.0, None, None, None]
