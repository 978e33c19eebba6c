"""A self-managed or plain ASG whose desired counts weight units (mixed-instances WeightedCapacity) is not
sized by demand: its demand is not read, it is told once, no node of it is removed; and what an ASG's tags
say that its node shape does not use is told once, not every tick (issue 30, item 0, the probe's findings)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpufleet.aws.groups.asg import asg_observation as _asg_observation
from gpufleet.domain.models import Action, GroupState
from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.pods import ClusterPods, WaitingPod
from gpufleet.policy.fleet import DemandSource, GroupSettings, KubernetesDemand, QueueDemand
from gpufleet.scaling.core import decide_reconcile
from gpufleet.scaling.demand_source import DemandReader
from tests.adapters.scaling.wiring import Pods, shapes

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
PODS = GroupSettings(
    min=0, scale_in_cooldown_s=0, scale_out_cooldown_s=0, demand=DemandSource(kubernetes=KubernetesDemand())
)
TAGS = [{"Key": "kubernetes.io/cluster/ml", "Value": "owned"}]


def g5(cluster: str, name: str) -> NodeShape:
    return NodeShape(gpus=4, name="g5.12xlarge")


def described(name: str, weights: tuple[str, ...], desired: int, *ids: str) -> dict[str, Any]:
    """A DescribeAutoScalingGroups item: a mixed-instances group with these override weights."""
    overrides = [{"InstanceType": f"g5.{i}2xlarge", "WeightedCapacity": w} for i, w in enumerate(weights)]
    return {
        "AutoScalingGroupName": name,
        "MinSize": 0,
        "MaxSize": 40,
        "DesiredCapacity": desired,
        "Tags": TAGS,
        "MixedInstancesPolicy": {"LaunchTemplate": {"Overrides": overrides}},
        "Instances": [{"InstanceId": i, "LifecycleState": "InService", "InstanceType": "g5.12xlarge"} for i in ids],
    }


class Told:
    """A logger that keeps what it was told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, message: str, extra: dict[str, Any] | None = None) -> None:
        self.lines.append((message, extra or {}))

    def exception(self, message: str, extra: dict[str, Any] | None = None) -> None:
        self.lines.append((message, extra or {}))


def reader(pods: ClusterPods, logger: Told, shape: Any = None, type_gpus: Any = None) -> tuple[DemandReader, list[str]]:
    listed: list[str] = []

    def cluster_pods(cluster: str, resources: Any, nodes: Any = None, **_: Any) -> ClusterPods:
        listed.append(cluster)
        return pods

    found = DemandReader(
        sqs=None,
        cloudwatch=None,
        cluster_pods=Pods(cluster_pods),
        groups=shapes(g5, shape or (lambda name, tell: NodeShape(gpus=4, name="g5.12xlarge"))),
        instances_of=lambda names: {},
        logger=logger,  # type: ignore[arg-type]
        type_gpus=type_gpus,
    )
    return found, listed


def test_a_weighted_group_is_not_sized_by_demand_and_keeps_its_nodes() -> None:
    """One g5.12xlarge of weight 4 in service, desired 4 (units): read as instances, 3 nodes would be on
    the way and a waiting pod held forever; now the group says why it is not sized, once."""
    obs = _asg_observation(described("w", ("1", "4"), 4, "i-1"))
    assert obs.instance_metrics_loaded is False and obs.scale_in_closed is not None
    obs = obs.model_copy(update={"instance_metrics_loaded": True})
    told = Told()
    demand, listed = reader(ClusterPods(cluster="ml", waiting=(WaitingPod(namespace="a", name="p", gpus=4),)), told)
    for _ in range(2):
        [(seen, s)] = demand.attach([(obs, PODS)], NOW)
    assert listed == []  # its pods are not read at all
    assert seen.demand is not None and str(seen.demand.unreadable).startswith("weighted capacity")
    assert len(told.lines) == 1 and "WeightedCapacity 1, 4" in told.lines[0][1]["cause"]
    d = decide_reconcile(seen, s, GroupState(), NOW, event_id="t")
    assert d.action is Action.HOLD and d.victims == ()


def test_a_weighted_plain_asg_with_a_queue_is_not_sized_either() -> None:
    queue = GroupSettings(demand=DemandSource(sqs=QueueDemand(queue_url="https://sqs/q"), gpus_per_node=4))
    obs = _asg_observation(described("q", ("2", "2"), 4, "i-1"))
    [(seen, _)] = reader(ClusterPods(cluster="ml"), Told())[0].attach([(obs, queue)], NOW)
    assert seen.demand is not None and "weighted capacity" in str(seen.demand.unreadable)


def test_an_unweighted_group_is_read_as_before() -> None:
    obs = _asg_observation(described("u", ("1", "1"), 1, "i-1"))
    assert obs.scale_in_closed is None
    [(seen, _)] = reader(ClusterPods(cluster="ml"), Told())[0].attach([(obs, PODS)], NOW)
    assert seen.demand is not None and seen.demand.unreadable is None


def test_what_a_self_managed_asgs_tags_say_unused_is_told_once() -> None:
    def shape(name: str, tell: Any) -> NodeShape:
        tell("ASG u: k8s.io/cluster-autoscaler/node-template/taint/x='y': no taint")
        return NodeShape(gpus=4, name="g5.12xlarge")

    told = Told()
    demand, _ = reader(ClusterPods(cluster="ml"), told, shape)
    obs = _asg_observation(described("u", ("1",), 0))
    for _ in range(3):
        demand.attach([(obs, PODS)], NOW)
    assert [(m, e["source"]) for m, e in told.lines] == [
        ("ASG tags not used for its node shape", "node template of asg:u")
    ]
    assert "no taint" in told.lines[0][1]["cause"]


def test_an_asgs_gpus_per_node_are_never_guessed_from_the_instances_it_runs() -> None:
    """Second probe: GPUs per node taken from running instances worked at 1 node and hung at 0 (a launch
    template only), and kept an old type's count after the template moved on. An ASG's queue or metric
    needs demand.gpus_per_node, as validate-policy says; a HyperPod group's comes from its one type."""
    queue = GroupSettings(demand=DemandSource(sqs=QueueDemand(queue_url="https://sqs/q")))
    one = described("lt", (), 1, "i-1") | {"MixedInstancesPolicy": {}}
    # EC2 would say g5.12xlarge has 4: not asked for an ASG
    demand = reader(ClusterPods(cluster="ml"), Told(), type_gpus=lambda types: 4.0)[0]
    [(seen, _)] = demand.attach([(_asg_observation(one), queue)], NOW)
    assert seen.demand is not None and "set demand.gpus_per_node" in str(seen.demand.unreadable)
