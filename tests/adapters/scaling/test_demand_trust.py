"""Issue 28's failures of the demand path, each as it was found, through the reader's glue (fakes for SQS,
CloudWatch and the cluster) and the decision core. Each test failed on the code before the issue, except
where its docstring says it guards a behaviour that held."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aws_lambda_powertools import Logger

from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Demand,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    WaitingWork,
)
from gpufleet.domain.nodes import NodeReadiness
from gpufleet.kubernetes.pods import ClusterPods, WaitingPod
from gpufleet.policy.fleet import (
    DemandSource,
    GroupSettings,
    KubernetesDemand,
    MetricDemand,
    QueueDemand,
    TargetBand,
)
from gpufleet.scaling.core import decide_reconcile
from gpufleet.scaling.demand import NodeShape, pack
from gpufleet.scaling.demand_source import DemandReader
from tests.adapters.scaling.wiring import Pods, shapes

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/train-jobs"
QUIET = Logger(service="test", level="CRITICAL")


class FakeSqs:
    """GetQueueAttributes as SQS answers it: both counts as strings (or whatever a test sets)."""

    def __init__(self, visible: int = 0, in_flight: int = 0, answer: dict[str, Any] | None = None) -> None:
        self.attributes = {
            "ApproximateNumberOfMessages": str(visible),
            "ApproximateNumberOfMessagesNotVisible": str(in_flight),
        }
        self.answer = answer
        self.calls = 0

    def get_queue_attributes(self, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:  # noqa: N803
        self.calls += 1
        return self.answer if self.answer is not None else {"Attributes": dict(self.attributes)}


class FakeCloudWatch:
    def __init__(self, value: float) -> None:
        self.value = value

    def get_metric_data(self, **kw: Any) -> dict[str, Any]:
        return {"MetricDataResults": [{"Id": "m0", "Values": [self.value], "Timestamps": [NOW]}]}


def instances(n: int, util: float = 0.0, **kw: Any) -> tuple[InstanceObservation, ...]:
    return tuple(
        InstanceObservation(instance_id=f"i-{i:02d}", gpu_utilization=util, gpu_memory_percent=0.0, **kw)
        for i in range(n)
    )


def asg(name: str, desired: int, max_size: int = 20, util: float = 0.0) -> GroupObservation:
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name=name),
        min_size=0,
        max_size=max_size,
        desired=desired,
        instances=instances(desired, util),
        instance_metrics_loaded=True,
    )


def eks_gpu(desired: int, name: str = "gpu", **fields: Any) -> GroupObservation:
    """The EKS node group ml/`name` (min 0, max 10) at `desired`; `fields` set the rest of the observation."""
    return GroupObservation(
        ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name=name),
        min_size=0,
        max_size=10,
        desired=desired,
        **fields,
    )


def queue_settings(order: int | None = None, band: bool = True) -> GroupSettings:
    source = DemandSource(sqs=QueueDemand(queue_url=QUEUE, gpus_per_message=8), gpus_per_node=8, order=order)
    return GroupSettings(min=0, max=20, demand=source, target=TargetBand(enabled=band))


def reader(**kw: Any) -> DemandReader:
    base: dict[str, Any] = {
        "sqs": FakeSqs(),
        "cloudwatch": None,
        "cluster_pods": lambda cluster, resources, nodes=None, **_: ClusterPods(cluster=cluster),
        "groups": shapes(lambda cluster, nodegroup: NodeShape(gpus=8)),
        "instances_of": lambda names: {},
        "logger": QUIET,
    }
    merged = {**base, **kw}
    return DemandReader(**{**merged, "cluster_pods": Pods(merged["cluster_pods"])})


def decide(obs: GroupObservation, s: GroupSettings, state: GroupState | None = None) -> Any:
    return decide_reconcile(obs, s, state or GroupState(), NOW, event_id="tick")


# ---- SQS: visible messages wait, in-flight ones run ----


def test_jobs_being_worked_on_never_count_as_waiting_again_after_the_warm_up() -> None:
    """Before: with `in_flight: true`, 5 jobs being worked on asked for 5 more nodes after every warm-up:
    5 -> 10 -> 15 -> 20 for the same 5 jobs."""
    s = queue_settings()
    state = GroupState(last_scale_out_at=NOW - timedelta(hours=1), last_scale_out_added=5)
    obs = asg("runners", 5, util=90)
    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=5)).attach([(obs, s)], NOW)
    d = decide(seen, s, state)
    assert d.action is not Action.SCALE_OUT and d.desired == 5
    assert seen.demand is not None and seen.demand.waiting == () and seen.demand.held_nodes == 5


def test_runners_holding_jobs_with_idle_gpus_are_kept() -> None:
    """Before (in_flight: false, the default): 5 runners that took their message and are downloading have
    idle GPUs and the queue looks empty: 4 of 5 were terminated in one change."""
    s = queue_settings().model_copy(update={"min": 1})
    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=5)).attach([(asg("runners", 5), s)], NOW)
    d = decide(seen, s)
    assert d.action is not Action.SCALE_IN and d.victims == ()


def test_idle_runners_go_once_their_jobs_are_done_even_with_the_band_off() -> None:
    """Before: with `target: {enabled: false}` (the spot docs' advice for fallback groups) queue nodes
    never left. Now: once nothing waits or runs, idle nodes go whatever the band's switch."""
    s = queue_settings(band=False)
    obs = asg("fallback", 3).model_copy(update={"instance_metrics_loaded": False})
    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=0)).attach([(obs, s)], NOW)
    first = decide(seen, s)
    assert first.action is Action.SCALE_IN and first.needs_instance_metrics
    loaded = seen.model_copy(update={"instance_metrics_loaded": True})
    d = decide(loaded, s)
    assert (d.action, d.desired) == (Action.SCALE_IN, 0)


def test_one_held_runner_keeps_one_node_and_the_idle_rest_go() -> None:
    s = queue_settings(band=False)
    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=1)).attach([(asg("runners", 4), s)], NOW)
    d = decide(seen, s)
    assert (d.action, d.desired) == (Action.SCALE_IN, 1)


def test_two_groups_on_one_queue_split_it_instead_of_each_taking_all() -> None:
    """Before: spot and fallback groups on one queue each scaled to the whole queue (10 messages: 10 + 10
    nodes). Now the spot group (order 0, or a spot group before its fallback) takes what it can grow by,
    the fallback the rest."""
    spot, fallback = queue_settings(), queue_settings()
    spot = spot.model_copy(update={"max": 6})
    a = asg("spot", 0, max_size=6)
    b = asg("on-demand", 0)
    pairs = [(b, fallback), (a, spot)]
    seen = {o.ref.name: o for o, _ in reader(sqs=FakeSqs(visible=10)).attach(pairs, NOW, frozenset({b.ref.key}))}
    ds = {name: decide(o, spot if name == "spot" else fallback) for name, o in seen.items()}
    assert (ds["spot"].desired, ds["on-demand"].desired) == (6, 4)


def test_free_runners_take_visible_messages_before_any_launch() -> None:
    s = queue_settings()
    [(seen, _)] = reader(sqs=FakeSqs(visible=3, in_flight=2)).attach([(asg("runners", 5, util=50), s)], NOW)
    assert seen.demand is not None and seen.demand.waiting == ()  # 3 free runners take the 3 messages


@pytest.mark.parametrize(
    "answer",
    [
        {},  # no Attributes at all (a KeyError before: the whole tick stopped)
        {"Attributes": {}},  # no counts: read as "nothing waits" before
        {"Attributes": {"ApproximateNumberOfMessages": "4"}},
        {"Attributes": {"ApproximateNumberOfMessages": "1e20", "ApproximateNumberOfMessagesNotVisible": "0"}},
        {"Attributes": {"ApproximateNumberOfMessages": "-3", "ApproximateNumberOfMessagesNotVisible": "0"}},
    ],
)
def test_an_sqs_answer_without_whole_counts_is_unreadable_and_closes_scale_in(answer: dict[str, Any]) -> None:
    s = queue_settings()
    [(seen, _)] = reader(sqs=FakeSqs(answer=answer)).attach([(asg("runners", 3, util=1), s)], NOW)
    assert seen.demand is not None and not seen.demand.known
    d = decide(seen, s)
    assert d.action is Action.HOLD and d.victims == ()


def test_a_huge_queue_asks_for_max_not_memory() -> None:
    s = queue_settings()
    [(seen, _)] = reader(sqs=FakeSqs(visible=10**30)).attach([(asg("runners", 0), s)], NOW)
    assert (decide(seen, s).desired) == 20


def test_sqs_demand_on_an_eks_node_group_takes_its_gpus_from_the_instance_type() -> None:
    """Before: without gpus_per_node it passed validate-policy and was unreadable at run time."""
    s = GroupSettings(min=0, max=10, demand=DemandSource(sqs=QueueDemand(queue_url=QUEUE, gpus_per_message=4)))
    obs = GroupObservation(ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="runners"), min_size=0,
                           max_size=10, desired=0)  # fmt: skip
    [(seen, _)] = reader(sqs=FakeSqs(visible=4)).attach([(obs, s)], NOW)
    assert seen.demand is not None and seen.demand.known and seen.demand.gpus_per_node == 8
    assert decide(seen, s).desired == 2


# ---- a cluster that cannot be read fails closed ----


def test_an_unreadable_cluster_never_lets_the_band_scale_in_a_node_bound_to_a_gpu_pod() -> None:
    """Before: 5xx/timeout/410 left every node runs_work=False and the band scaled in the node bound
    to a GPU pod."""

    def down(cluster: str, resources: Any, nodes: Any = None, **_: Any) -> ClusterPods:
        raise ClusterUnreadable(cluster, "HTTP 503 Service Unavailable", "http")

    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    obs = eks_gpu(2, instances=instances(2, util=1.0), instance_metrics_loaded=True, gpu_utilization=1.0)
    [(seen, _)] = reader(cluster_pods=down).attach([(obs, s)], NOW)
    d = decide(seen, s)
    assert d.action is Action.HOLD and d.victims == ()
    assert "no node may be removed" in d.reason and "503" in d.reason


def test_an_unmapped_node_name_does_not_launch_a_node_a_tick() -> None:
    """Before: one GPU pod on a node name EC2 no longer maps made every node look full: 6 nodes for one
    waiting pod, one more each tick up to max."""
    pods = ClusterPods(
        cluster="ml",
        waiting=(WaitingPod(namespace="a", name="p", gpus=1),),
        gpu_nodes=frozenset({"gone-node"}),
    )
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    obs = eks_gpu(5, instances=instances(5), instance_metrics_loaded=True)
    [(seen, _)] = reader(cluster_pods=lambda c, r, nodes=None, **_: pods).attach([(obs, s)], NOW)
    d = decide(seen, s)
    assert d.action is Action.HOLD and d.desired == 5


# ---- one bad input never stops every group ----


def test_a_source_that_raises_is_its_groups_alone() -> None:
    """Before: `attach` ran outside the per-group isolation: an SQS answer without Attributes (KeyError) or
    an OverflowError stopped every group's decision."""

    class Broken:
        def get_queue_attributes(self, **kw: Any) -> Any:
            raise KeyError("Attributes")

    cw = FakeCloudWatch(3.0)
    metric = DemandSource(metric=MetricDemand(namespace="Slurm", metric_name="PendingGPUs"), gpus_per_node=8)
    ms = GroupSettings(min=0, max=10, demand=metric)
    pairs = [(asg("runners", 2), queue_settings()), (asg("slurm", 0), ms)]
    found = {o.ref.name: o for o, _ in reader(sqs=Broken(), cloudwatch=cw).attach(pairs, NOW)}
    assert found["runners"].demand is not None and "KeyError" in str(found["runners"].demand.unreadable)
    assert decide(found["slurm"], ms).desired == 1


@pytest.mark.parametrize("value", [1e20, 2.5e9, 1e308, float("inf")])
def test_a_backlog_metric_of_any_size_gives_a_bounded_answer(value: float) -> None:
    """Before: 1e20 raised OverflowError, 2.5e9 a MemoryError, in the core, and no group scaled."""
    metric = DemandSource(metric=MetricDemand(namespace="Slurm", metric_name="PendingGPUs"), gpus_per_node=8)
    ms = GroupSettings(min=0, max=10, demand=metric)
    [(seen, _)] = reader(cloudwatch=FakeCloudWatch(value)).attach([(asg("slurm", 0), ms)], NOW)
    d = decide(seen, ms)
    if math.isfinite(value):
        assert (d.action, d.desired) == (Action.SCALE_OUT, 10)
    else:  # CloudWatch cannot hold infinity; a non-finite datum is no datum
        assert seen.demand is not None and not seen.demand.known


def test_pack_is_closed_form_for_any_backlog() -> None:
    """Before: `pack` made one bin per node asked for: 1e8 items took 240 MB."""
    assert pack(Counter({1.0: 10**20}), 8).new_nodes == 10**20 // 8
    assert pack(Counter({1e-320: 5}), 8).new_nodes == 1  # a vanishing quantity is a thousandth of a GPU


def test_pods_that_need_a_node_each_come_in_one_change() -> None:
    """Before: required anti-affinity / a hostPort: 4 pods = 4 sequential boots."""
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    waiting = tuple(WaitingWork(name=f"p{i}", gpus=1, whole_node=True) for i in range(4))
    obs = eks_gpu(0, demand=Demand(source="cluster ml", waiting=waiting, gpus_per_node=8, knows_nodes=True))
    assert decide(obs, s).desired == 4


# ---- GPU-ready nodes ----


def test_a_node_not_gpu_ready_is_on_the_way_and_past_the_timeout_an_incident_not_capacity() -> None:
    """A 10-minute boot then a 3-minute device-plugin delay: the node is InService without GPUs. It is
    not room and no second node is launched for the pod it will take; at 16 minutes it is told."""
    pods = ClusterPods(cluster="ml", waiting=(WaitingPod(namespace="a", name="p", gpus=8),))
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    obs = eks_gpu(1, instances=instances(1))

    def probe(age_min: int) -> Any:
        return lambda ids, now, young: {
            i: NodeReadiness(launched_at=NOW - timedelta(minutes=age_min), gpus_reported=False) for i in ids
        }

    state = GroupState(last_scale_out_at=NOW - timedelta(minutes=11), last_scale_out_added=1)
    for age in (10, 12):  # booted, device plugin not up yet: past the 5-minute warm-up, not room, on the way
        [(seen, _)] = reader(cluster_pods=lambda c, r, nodes=None, **_: pods, readiness=probe(age)).attach(
            [(obs, s)], NOW
        )
        assert seen.demand is not None and seen.demand.not_ready == ("i-00",) and seen.demand.free_gpus == ()
        d = decide(seen, s, state)
        assert d.action is Action.HOLD and d.desired == 1, d.reason
    [(late, _)] = reader(cluster_pods=lambda c, r, nodes=None, **_: pods, readiness=probe(16)).attach([(obs, s)], NOW)
    assert late.demand is not None and late.demand.not_ready == () and late.demand.free_gpus == ()
    [notice] = late.demand.never_ready
    assert "i-00" in notice.text and "16 min" in notice.text
    assert decide(late, s, state).desired == 2  # it no longer counts: the pod gets a node that can serve it


def test_one_gpu_is_said_in_the_singular() -> None:
    """Before: "1x1 GPUs" and "1 GPUs per node"."""
    from gpufleet.scaling.demand import describe_waiting

    assert describe_waiting((WaitingWork(name="p", gpus=1),), NOW) == "1 pod (1x1 GPU) unschedulable"
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    obs = eks_gpu(
        0,
        demand=Demand(source="cluster ml", waiting=(WaitingWork(name="p", gpus=1),), gpus_per_node=1),
    )
    assert "(1 GPU per node)" in decide(obs, s).reason


def test_pods_that_fit_no_group_are_said_in_the_decision_and_told_once() -> None:
    """Before: a pod too big for the node got a node launched, kept idle, told to nobody. Now the group's
    decision says it (what `gpufleet explain` shows) and one notification per pod set is built, whose id
    does not change from tick to tick."""
    from gpufleet.domain.models import UnfitWork
    from gpufleet.scaling.notes import demand_notes

    text = (
        "3 pods of serving/infer (cpu 4, memory 16Gi, 1 GPU) fit no group: eks:ml/gpu-infer's g5.xlarge has "
        "3.92 CPU and 14.5 GiB allocatable"
    )
    unfit = (UnfitWork(key="serving/infer|cpu=4", count=3, text=text),)
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    obs = eks_gpu(
        0,
        name="gpu-infer",
        demand=Demand(source="cluster ml", gpus_per_node=1, knows_nodes=True, unfit=unfit),
    )
    d = decide(obs, s)
    assert d.action is Action.HOLD and d.desired == 0 and text in d.reason
    first, again = (
        demand_notes([obs, obs], NOW, "us-east-1"),
        demand_notes([obs], NOW + timedelta(minutes=1), "us-east-1"),
    )
    assert len(first) == 1 and first[0].notification_id == again[0].notification_id
    assert "3.92 CPU" in first[0].reason


def test_a_ten_minute_boot_and_a_three_minute_device_plugin_launch_no_duplicate() -> None:
    """Minute by minute: one 8-GPU pod waits at 0 nodes. The node launched for it is Pending for 10
    minutes (boot), then InService without GPUs for 3 (driver and device plugin), then reports GPUs and
    takes the pod. Elsewhere this launches duplicates (gpu-operator#708: ~4 nodes for one pod); here the
    group stays at 1 throughout. (The code before the issue passed this too, by counting the not-ready node
    as room, which is what kept a node that never becomes ready as room forever: the test above.)"""
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    ref = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="gpu")
    launched: datetime | None = None
    desired, state, scale_outs = 0, GroupState(), 0
    for minute in range(20):
        now = NOW + timedelta(minutes=minute)
        age = None if launched is None else (now - launched).total_seconds() / 60
        bound = age is not None and age >= 13
        pods = ClusterPods(
            cluster="ml",
            waiting=() if bound else (WaitingPod(namespace="a", name="p", gpus=8),),
            gpu_nodes=frozenset({"ip-1.ec2.internal"}) if bound else frozenset(),
        )
        state_name = "Pending" if age is not None and age < 10 else "InService"
        obs = GroupObservation(
            ref=ref,
            min_size=0,
            max_size=10,
            desired=desired,
            instances=tuple(InstanceObservation(instance_id="i-1", lifecycle_state=state_name) for _ in range(desired)),
        )
        ready = {"i-1": NodeReadiness(launched_at=launched, gpus_reported=age is not None and age >= 13)}
        r = reader(
            cluster_pods=lambda c, res, nodes=None, pods=pods, **_: pods,
            instances_of=lambda names: {"ip-1.ec2.internal": "i-1"},
            readiness=lambda ids, now, young, ready=ready: ready,
        )
        [(seen, _)] = r.attach([(obs, s)], now)
        d = decide_reconcile(seen, s, state, now, event_id=f"t{minute}")
        if d.action is Action.SCALE_OUT:
            scale_outs += 1
            desired, launched = d.desired, launched or now
            state = GroupState(last_scale_out_at=now, last_scale_out_added=d.desired - d.current)
    assert (scale_outs, desired) == (1, 1)


def test_a_free_runner_about_to_take_a_waiting_message_is_not_released() -> None:
    """Found by the demo: the free room covered the visible message, so nothing 'waited', and the release
    removed that very room (2 -> 1, the new runner terminated)."""
    s = queue_settings(band=False)
    [(seen, _)] = reader(sqs=FakeSqs(visible=1, in_flight=0)).attach([(asg("runners", 1), s)], NOW)
    d = decide(seen, s)
    assert d.action is Action.HOLD and d.victims == ()


def test_the_band_never_removes_a_node_running_work_holds() -> None:
    """Runners downloading their inputs read idle: the band's low must not take them either."""
    s = queue_settings(band=True)
    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=3)).attach([(asg("runners", 3, util=0), s)], NOW)
    seen = seen.model_copy(update={"gpu_utilization": 0.0})
    d = decide(seen, s)
    assert d.action is Action.HOLD and d.victims == () and "3 node(s) running work holds" in d.reason


def test_nodes_removed_since_the_last_scale_out_are_not_counted_as_booting() -> None:
    """Found by the demo: after a scale-in, the warm-up estimate still said '1 node(s) booting will take
    them' for a node that was gone."""
    s = queue_settings()
    state = GroupState(
        last_scale_out_at=NOW - timedelta(minutes=2),
        last_scale_out_added=1,
        last_scale_in_at=NOW - timedelta(minutes=1),
    )
    [(seen, _)] = reader(sqs=FakeSqs(visible=1, in_flight=1)).attach([(asg("runners", 1), s)], NOW)
    d = decide(seen, s, state)
    assert (d.action, d.desired) == (Action.SCALE_OUT, 2)


# ---- found by the independent probe of this change ----


def test_runners_not_gpu_ready_yet_still_hold_their_jobs() -> None:
    """5 jobs in flight on 5 runners, 3 of them too young to have reported GPUs, the 2 old ones downloading
    (GPUs idle): the held count must not shrink to the ready nodes (it terminated the 2 busy runners)."""
    s = queue_settings(band=False)
    old = [InstanceObservation(instance_id=f"i-old{i}", gpu_utilization=0.0, gpu_memory_percent=0.0) for i in range(2)]
    young = [InstanceObservation(instance_id=f"i-new{i}") for i in range(3)]
    obs = asg("runners", 5).model_copy(update={"instances": tuple(old + young)})

    def probe(ids: Any, now: Any, window: Any) -> dict[str, NodeReadiness]:
        age = {True: 5, False: 300}
        return {
            i: NodeReadiness(launched_at=NOW - timedelta(minutes=age["new" in i]), gpus_reported="old" in i)
            for i in ids
        }

    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=5), readiness=probe).attach([(obs, s)], NOW)
    d = decide(seen, s)
    assert seen.demand is not None and seen.demand.held_nodes == 5
    assert d.victims == () and d.desired == 5


def test_small_jobs_spread_one_per_runner_hold_every_runner() -> None:
    """1-GPU jobs on 8-GPU runners, 8 in flight, one per runner (jobs end unevenly): the fewest nodes they
    could fit is 1, but which nodes run them is not said, so all 8 stay (it removed 7 busy runners)."""
    s = GroupSettings(
        min=0,
        max=20,
        target=TargetBand(enabled=False),
        demand=DemandSource(sqs=QueueDemand(queue_url=QUEUE, gpus_per_message=1), gpus_per_node=8),
    )
    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=8)).attach([(asg("runners", 8), s)], NOW)
    d = decide(seen, s)
    assert d.victims == () and d.desired == 8


def test_groups_of_different_node_sizes_on_one_queue_count_their_own_room() -> None:
    """An 8-GPU group (order 0, at 0 nodes) and a 4-GPU group (order 1, 2 runners busy with 8 jobs) on
    one queue of 1-GPU jobs, 8 visible: the small group's busy runners are no room, so the big group
    launches (before, room was counted at the largest group's size and 8 messages waited with no launch)."""

    def settings(gpn: int, order: int) -> GroupSettings:
        source = DemandSource(sqs=QueueDemand(queue_url=QUEUE, gpus_per_message=1), gpus_per_node=gpn, order=order)
        return GroupSettings(min=0, max=10, demand=source, target=TargetBand(enabled=False))

    big, small = settings(8, 0), settings(4, 1)
    pairs = [(asg("big", 0), big), (asg("small", 2), small)]
    seen = {o.ref.name: o for o, _ in reader(sqs=FakeSqs(visible=8, in_flight=8)).attach(pairs, NOW)}
    assert decide(seen["big"], big).desired == 1
    assert decide(seen["small"], small).victims == ()


def test_a_message_bigger_than_a_node_holds_the_nodes_it_needs() -> None:
    """16-GPU messages on 8-GPU nodes (a 2-node job, on nodes an operator or a schedule provided): one in
    flight holds 2 nodes (it held 0 and both were released)."""
    s = GroupSettings(
        min=0,
        max=10,
        target=TargetBand(enabled=False),
        demand=DemandSource(sqs=QueueDemand(queue_url=QUEUE, gpus_per_message=16), gpus_per_node=8),
    )
    [(seen, _)] = reader(sqs=FakeSqs(visible=0, in_flight=1)).attach([(asg("runners", 2), s)], NOW)
    assert decide(seen, s).victims == ()


def test_nodes_full_under_custom_hostnames_still_get_waiting_pods_a_node() -> None:
    """3 full nodes whose names EC2 cannot map (custom hostnames) and 2 more pods waiting: the doubt is
    one node of room less per unmapped name, so the pods get nodes (before the probe's fix: 'room on the
    group's nodes will take them', forever)."""
    pods = ClusterPods(
        cluster="ml",
        waiting=(WaitingPod(namespace="a", name="p1", gpus=8), WaitingPod(namespace="a", name="p2", gpus=8)),
        gpu_nodes=frozenset({"gpu-a", "gpu-b", "gpu-c"}),
    )
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))
    obs = eks_gpu(3, instances=instances(3), instance_metrics_loaded=True)
    [(seen, _)] = reader(cluster_pods=lambda c, r, nodes=None, **_: pods).attach([(obs, s)], NOW)
    d = decide(seen, s)
    assert (d.action, d.desired) == (Action.SCALE_OUT, 5) and d.victims == ()


def test_a_readiness_probe_that_raises_leaves_every_group_decided() -> None:
    def broken(ids: Any, now: Any, window: Any) -> Any:
        raise KeyError("InstanceId")

    s = queue_settings()
    [(seen, _)] = reader(sqs=FakeSqs(visible=3), readiness=broken).attach([(asg("runners", 1), s)], NOW)
    assert seen.demand is not None and seen.demand.known and decide(seen, s).desired == 3


def test_a_node_that_never_becomes_ready_stays_overdue_and_is_replaced_once() -> None:
    """Found by the probe: past twice the timeout the broken node was no longer probed, counted as room
    again, and the pod waited forever behind 'room on the group's nodes will take them'. Now it stays
    overdue; and when its replacement never becomes ready either, that one is told but launches nothing
    more (replaced once, not one node every 15 minutes up to max)."""
    pods = ClusterPods(cluster="ml", waiting=(WaitingPod(namespace="a", name="p", gpus=8),))
    s = GroupSettings(min=0, max=10, demand=DemandSource(kubernetes=KubernetesDemand()))

    def group(n: int) -> GroupObservation:
        return eks_gpu(n, instances=instances(n))

    ages = {"i-00": 60, "i-01": 31}  # minutes since launch; neither ever reported GPUs
    probe_calls: list[list[str]] = []

    def probe(ids: Any, now: Any, within: Any) -> dict[str, NodeReadiness]:
        probe_calls.append(sorted(ids))
        return {i: NodeReadiness(launched_at=NOW - timedelta(minutes=ages[i])) for i in ids if i in ages}

    [(one, _)] = reader(cluster_pods=lambda c, r, nodes=None, **_: pods, readiness=probe).attach([(group(1), s)], NOW)
    assert one.demand is not None and [n.instance_id for n in one.demand.never_ready] == ["i-00"]
    assert decide(one, s).desired == 2  # at 60 min still overdue: its work gets a node that can serve it
    [(two, _)] = reader(cluster_pods=lambda c, r, nodes=None, **_: pods, readiness=probe).attach([(group(2), s)], NOW)
    assert two.demand is not None and {n.instance_id for n in two.demand.never_ready} == {"i-00", "i-01"}
    assert two.demand.not_ready == ("i-01",) and decide(two, s).desired == 2  # replaced once, no third node


def test_a_node_that_reported_its_gpus_is_not_probed_again() -> None:
    calls: list[list[str]] = []

    def probe(ids: Any, now: Any, within: Any) -> dict[str, NodeReadiness]:
        calls.append(sorted(ids))
        return {i: NodeReadiness(launched_at=NOW - timedelta(minutes=3), gpus_reported=True) for i in ids}

    r = reader(readiness=probe, sqs=FakeSqs())
    s = queue_settings()
    for _ in range(3):
        r.attach([(asg("runners", 2), s)], NOW)
    assert calls == [["i-00", "i-01"]]


@pytest.mark.parametrize("value", [-5.0, float("nan")])
def test_a_negative_or_nan_backlog_datum_is_unreadable_not_nothing_waits(value: float) -> None:
    """Found by the probe: -5 read as 'nothing waits' and released idle nodes."""
    metric = DemandSource(metric=MetricDemand(namespace="Slurm", metric_name="PendingGPUs"), gpus_per_node=8)
    ms = GroupSettings(min=0, max=10, demand=metric)
    [(seen, _)] = reader(cloudwatch=FakeCloudWatch(value)).attach([(asg("slurm", 2), ms)], NOW)
    assert seen.demand is not None and "not a count of GPUs" in str(seen.demand.unreadable)
    assert decide(seen, ms).victims == ()
