"""Self-managed node groups (issue 30, item 0): an ASG whose nodes join an EKS cluster reads that cluster's
pods like a managed node group of it: one pod listing for both, its share of the waiting pods, and a node
running a GPU pod never a victim. Its cluster comes from the rule or its tags; none or two: fail closed."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import pytest
from aws_lambda_powertools import Logger

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Action, GroupObservation, GroupRef, GroupState, InstanceObservation
from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.pods import ClusterPods, Toleration, WaitingPod
from gpufleet.policy.fleet import DemandSource, GroupSettings, KubernetesDemand
from gpufleet.scaling.core import decide_reconcile
from gpufleet.scaling.demand_source import DemandReader
from tests.adapters.scaling.wiring import Pods, shapes

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
PODS = GroupSettings(
    min=0, scale_in_cooldown_s=0, scale_out_cooldown_s=0, demand=DemandSource(kubernetes=KubernetesDemand())
)
OWNED = {"kubernetes.io/cluster/ml": "owned"}
TAINT = ("nvidia.com/gpu", "true", "NoSchedule")


def asg(name: str, tags: Mapping[str, str], *ids: str) -> GroupObservation:
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name=name),
        min_size=0,
        max_size=10,
        desired=len(ids),
        asg_tags=dict(tags),
        instance_metrics_loaded=True,
        instances=tuple(InstanceObservation(instance_id=i, gpu_utilization=0.0, gpu_memory_percent=0.0) for i in ids),
    )


def managed(name: str) -> GroupObservation:
    return GroupObservation(ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name=name), min_size=0,
                            max_size=10, desired=0)  # fmt: skip


class Calls:
    """The reader's adapters, recording what they were asked."""

    def __init__(self, pods: ClusterPods, nodes: Mapping[str, str] | None = None) -> None:
        self.pods, self.nodes = pods, dict(nodes or {})
        self.listed: list[str] = []
        self.shaped: list[tuple[Any, ...]] = []
        self.tell: Any = None

    def cluster_pods(
        self, cluster: str, resources: Mapping[str, float], nodes: object = None, **_: object
    ) -> ClusterPods:
        self.listed.append(cluster)
        return self.pods

    def managed(self, cluster: str, name: str) -> NodeShape:
        self.shaped.append(("node group", cluster, name))
        return NodeShape(gpus=8, name="p4d.24xlarge")

    def self_managed(self, name: str, tell: Any) -> NodeShape:
        self.tell = tell  # where the shape tells its unused tags
        self.shaped.append(("asg", name))  # what asg_node_shape makes of Cluster Autoscaler's tags
        return NodeShape(gpus=4, taints=(TAINT,), labels=(("workload", "train"),), name="g5.12xlarge")

    def reader(self) -> DemandReader:
        return DemandReader(
            sqs=None,
            cloudwatch=None,
            cluster_pods=Pods(self.cluster_pods),
            groups=shapes(self.managed, self.self_managed),
            instances_of=lambda names: {n: self.nodes[n] for n in names if n in self.nodes},
            logger=Logger(service="test", level="CRITICAL"),
        )


TOLERATES = (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"),)


def test_an_asg_tagged_for_the_cluster_shares_its_pod_listing_with_a_managed_node_group() -> None:
    pods = ClusterPods(
        cluster="ml",
        waiting=(
            WaitingPod(
                namespace="a", name="small", gpus=4, node_selector=(("workload", "train"),), tolerations=TOLERATES
            ),
            WaitingPod(namespace="a", name="big", gpus=8),
        ),
    )
    calls = Calls(pods)
    pairs = [(asg("gpu-spot", OWNED), PODS), (managed("p4d"), PODS)]
    found = {o.ref.key: o for o, _ in calls.reader().attach(pairs, NOW)}
    assert calls.listed == ["ml"]  # one pod listing for the cluster, whatever the kinds of its groups
    assert ("asg", "gpu-spot") in calls.shaped and ("node group", "ml", "p4d") in calls.shaped
    spot, p4d = found["asg:gpu-spot"].demand, found["eks:ml/p4d"].demand
    assert spot is not None and p4d is not None
    assert [w.name for w in spot.waiting] == ["a/small"] and [w.name for w in p4d.waiting] == ["a/big"]
    assert spot.gpus_per_node == 4 and spot.knows_nodes


def test_a_node_of_a_self_managed_asg_running_a_gpu_pod_is_never_a_victim() -> None:
    """Nothing waits, every GPU reads idle: the idle nodes go, the one running a GPU pod (loading its
    weights) is passed over."""
    calls = Calls(ClusterPods(cluster="ml", gpu_nodes=frozenset({"ip-10-0-0-1.ec2.internal"})),
                  {"ip-10-0-0-1.ec2.internal": "i-busy"})  # fmt: skip
    group = asg("gpu-spot", OWNED, "i-busy", "i-idle1", "i-idle2")
    [(obs, s)] = calls.reader().attach([(group, PODS)], NOW)
    assert [i.runs_work for i in obs.instances] == [True, False, False]
    d = decide_reconcile(obs, s, GroupState(), NOW, event_id="t")
    assert d.action is Action.SCALE_IN and d.victims and "i-busy" not in d.victims
    assert "passed over 1 running work" in d.reason


def test_the_rule_names_the_cluster_when_the_tags_do_not() -> None:
    calls = Calls(ClusterPods(cluster="ml"))
    named = GroupSettings(demand=DemandSource(kubernetes=KubernetesDemand(cluster="ml")))
    [(obs, _)] = calls.reader().attach([(asg("plain", {}), named)], NOW)
    assert calls.listed == ["ml"] and obs.demand is not None and obs.demand.unreadable is None


@pytest.mark.parametrize(
    ("tags", "why"),
    [
        ({}, "no cluster"),
        ({"kubernetes.io/cluster/ml": "owned", "eks:cluster-name": "prod"}, "name 2 clusters"),
    ],
)
def test_an_asg_whose_cluster_cannot_be_told_fails_closed(tags: dict[str, str], why: str) -> None:
    calls = Calls(ClusterPods(cluster="ml"))
    [(obs, s)] = calls.reader().attach([(asg("gpu-spot", tags, "i-1"), PODS)], NOW)
    assert calls.listed == []
    assert obs.demand is not None and why in str(obs.demand.unreadable)
    assert decide_reconcile(obs, s, GroupState(), NOW, event_id="t").victims == ()


def test_a_hyperpod_group_joins_no_cluster() -> None:
    calls = Calls(ClusterPods(cluster="ml"))
    group = GroupObservation(ref=GroupRef(kind=GroupKind.HYPERPOD, cluster="ml", name="workers"), min_size=0,
                             max_size=2, desired=0)  # fmt: skip
    [(obs, _)] = calls.reader().attach([(group, PODS)], NOW)
    assert calls.listed == [] and obs.demand is not None and "joins no EKS cluster" in str(obs.demand.unreadable)
