"""The decision core with a demand source: waiting work drives one scale-out to the size it needs (from
zero too), blocks scale-in, lets a min-0 group go to zero once nothing waits and every node is idle, and
a node running a GPU pod is never a victim."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Demand,
    Direction,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    SkipReason,
    TriggerKind,
    WaitingWork,
)
from gpufleet.policy.fleet import GroupSettings, TargetBand
from gpufleet.scaling.core import choose_scale_in_victims, decide_reconcile, decide_request

NOW = datetime(2026, 11, 23, 9, 4, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="train-gpu")
SETTINGS = GroupSettings(min=0, max=10, target=TargetBand(low=30, high=80))


def work(gpus: float, waited_min: int = 4, name: str = "p") -> WaitingWork:
    return WaitingWork(name=name, gpus=gpus, since=NOW - timedelta(minutes=waited_min))


def node(i: int, util: float = 0.0, **kw: object) -> InstanceObservation:
    return InstanceObservation(instance_id=f"i-{i:02d}", gpu_utilization=util, gpu_memory_percent=0.0, **kw)  # type: ignore[arg-type]


def observe(
    desired: int, waiting: tuple[WaitingWork, ...] = (), util: float | None = None, **kw: object
) -> GroupObservation:
    demand = Demand(source="cluster ml", waiting=waiting, gpus_per_node=8, **kw)  # type: ignore[arg-type]
    return GroupObservation(
        ref=REF,
        min_size=0,
        max_size=10,
        desired=desired,
        instances=tuple(node(i) for i in range(desired)),
        instance_metrics_loaded=True,
        gpu_utilization=util,
        demand=demand,
    )


def tick(obs: GroupObservation, state: GroupState | None = None, s: GroupSettings = SETTINGS):
    return decide_reconcile(obs, s, state or GroupState(), NOW, event_id="tick")


def test_the_issue_example_scales_out_in_one_step() -> None:
    d = tick(observe(2, (work(8, 4, "a"), work(8, 2, "b"), work(4, 1, "c")), util=100))
    assert (d.action, d.current, d.desired) == (Action.SCALE_OUT, 2, 5)
    assert d.trigger.kind is TriggerKind.DEMAND
    assert d.reason == "3 pods (2x8 GPUs, 1x4) unschedulable for 4 min: scale out 2 -> 5 (8 GPUs per node)"


def test_scale_from_zero() -> None:
    d = tick(observe(0, (work(8), work(8))))
    assert (d.action, d.desired) == (Action.SCALE_OUT, 2)


def test_capped_at_max_in_one_change() -> None:
    d = tick(observe(2, tuple(work(8, name=f"p{i}") for i in range(20))))
    assert (d.action, d.desired) == (Action.SCALE_OUT, 10)
    assert d.reason.endswith("(capped at max)")


def test_nodes_booting_for_the_work_are_not_asked_for_again() -> None:
    """A tick after the scale-out: 3 nodes are on the way (not serving yet), the 3 pods fit them."""
    obs = observe(5, (work(8), work(8), work(4)))
    obs = obs.model_copy(update={"instances": tuple(node(i) for i in range(2))})
    state = GroupState(last_scale_out_at=NOW - timedelta(minutes=1))
    d = tick(obs, state)
    assert d.action is Action.HOLD
    assert "3 node(s) booting will take them" in d.reason


def test_room_on_existing_nodes_is_used_before_launching() -> None:
    d = tick(observe(2, (work(4), work(8)), free_gpus=(4.0, 0.0)))
    assert (d.action, d.desired) == (Action.SCALE_OUT, 3)


def test_work_larger_than_a_node_is_told_not_scaled_for() -> None:
    d = tick(observe(2, (work(16),)))
    assert d.action is Action.HOLD
    assert "none fits a node of this group (8 GPUs per node)" in d.reason


def test_waiting_work_blocks_scale_in_from_the_band_and_from_requests() -> None:
    """Utilization is low (the pods are not running yet) but pods wait: no scale-in, whoever asks."""
    obs = observe(2, (work(4),), util=5, free_gpus=(4.0,))
    d = tick(obs)
    assert d.action is Action.HOLD and "room on the group's nodes will take them" in d.reason
    trigger = d.trigger.model_copy(update={"kind": TriggerKind.REQUEST})
    req = decide_request(
        obs, SETTINGS, GroupState(), NOW, event_id="e", direction=Direction.IN, trigger=trigger, why="x"
    )
    assert req.action is Action.HOLD and "1 pod (1x4 GPUs) unschedulable" in req.reason


def test_scale_to_zero_when_nothing_waits_and_every_node_is_idle() -> None:
    d = tick(observe(3, (), util=0))
    assert (d.action, d.desired) == (Action.SCALE_IN, 0)
    assert d.reason.startswith("no pods waiting (cluster ml): 3 idle node(s) not needed: scale in 3 -> 0")


def test_nothing_waiting_releases_every_idle_node_down_to_min_in_one_change() -> None:
    """Not one band step per cooldown: idle nodes nothing waits for go together; busy ones and min stay."""
    s = SETTINGS.model_copy(update={"min": 1})
    assert tick(observe(3, (), util=0), s=s).desired == 1
    busy = observe(3, (), util=0)
    busy = busy.model_copy(update={"instances": (node(0), node(1), node(2, util=90))})
    d = tick(busy)
    assert (d.desired, d.victims) == (1, ("i-00", "i-01"))
    cooling = GroupState(last_scale_in_at=NOW - timedelta(seconds=10))
    assert tick(observe(3, (), util=0), cooling).action is Action.HOLD  # the scale-in cooldown still holds


def test_a_source_that_knows_the_nodes_asks_for_metrics_when_one_is_free() -> None:
    """Kubernetes says which nodes run GPU pods: one without any is worth a metrics read to confirm it
    idle, even inside the band. A source that knows nothing of nodes (a queue, a metric) asks too, for the
    nodes above what running work holds: its idle nodes must leave even with the band off."""
    obs = observe(3, (), util=50).model_copy(update={"instance_metrics_loaded": False})
    blind = tick(obs)
    assert blind.action is Action.SCALE_IN and blind.needs_instance_metrics
    assert "3 node(s) not held by work: choosing idle instances" in blind.reason
    knows = obs.model_copy(update={"demand": obs.demand.model_copy(update={"knows_nodes": True})})  # type: ignore[union-attr]
    d = tick(knows)
    assert d.action is Action.SCALE_IN and d.needs_instance_metrics
    assert "3 node(s) without work: choosing idle instances" in d.reason


def test_an_unreadable_source_falls_back_to_utilization_rules() -> None:
    obs = observe(2, (work(8),), util=50).model_copy(
        update={"demand": Demand(source="cluster ml", gpus_per_node=8, unreadable="403 Forbidden")}
    )
    d = tick(obs)
    assert d.action is Action.HOLD and d.trigger.kind is TriggerKind.UTILIZATION_BAND


@pytest.mark.parametrize("util", [0.0, 3.0])
def test_a_node_running_a_gpu_pod_is_never_a_victim(util: float) -> None:
    """A pod loading weights reads idle: its node is passed over, whatever its GPU metrics say."""
    nodes = (node(0, util, runs_work=True), node(1, util))
    choice = choose_scale_in_victims(nodes, 2, SETTINGS.idle)
    assert choice.victims == ("i-01",)
    assert choice.skipped == {SkipReason.RUNS_WORK: 1}
    obs = observe(2, (), util=0).model_copy(update={"instances": nodes})
    d = tick(obs)
    assert "i-00" not in d.victims


@given(
    st.lists(st.sampled_from([1, 2, 4, 8]), max_size=30),
    st.integers(0, 10),
    st.lists(st.booleans(), max_size=10),
)
def test_demand_never_leaves_bounds_nor_removes_gpu_pod_nodes(sizes: list[int], desired: int, pods: list[bool]) -> None:
    waiting = tuple(work(g, name=f"p{i}") for i, g in enumerate(sizes))
    obs = observe(desired, waiting, util=0)
    flags = (pods + [False] * desired)[:desired]
    obs = obs.model_copy(update={"instances": tuple(node(i, runs_work=f) for i, f in enumerate(flags))})
    d = tick(obs)
    assert 0 <= d.desired <= 10
    assert not {f"i-{i:02d}" for i, f in enumerate(flags) if f} & set(d.victims)
    if waiting:
        assert d.desired >= d.current  # never smaller while work waits


def test_busy_nodes_alone_do_not_scale_out_a_group_whose_source_says_nothing_waits() -> None:
    """The band's high is a proxy for waiting work; with the work itself in view, it only tells."""
    d = tick(observe(3, (), util=97))
    assert d.action is Action.HOLD
    assert d.reason == "GPU utilization 97.0% is above the band's high 80%, but no pods wait (cluster ml)"
    unreadable = observe(3, (), util=97).model_copy(
        update={"demand": Demand(source="cluster ml", gpus_per_node=8, unreadable="timeout")}
    )
    assert tick(unreadable).action is Action.SCALE_OUT  # no source to trust: the band acts as before


def test_nodes_of_the_last_scale_out_that_run_nothing_yet_are_not_asked_for_twice() -> None:
    """InService already (EC2 says so) but not taking work yet - Kubernetes not Ready, a worker not polling:
    within the warm-up the last scale-out's nodes still count as on their way; after it, they do not."""
    state = GroupState(last_scale_out_at=NOW - timedelta(minutes=2), last_scale_out_added=3)
    obs = observe(5, (work(8), work(8), work(4)))  # 5 InService nodes, none runs GPU work yet
    d = tick(obs, state)
    assert d.action is Action.HOLD and "3 node(s) booting will take them" in d.reason
    late = state.model_copy(update={"last_scale_out_at": NOW - timedelta(minutes=10)})
    assert tick(obs, late).action is Action.SCALE_OUT  # past the warm-up: they are not coming for this work
    knows = obs.model_copy(
        update={
            # Kubernetes: the one InService node without a GPU pod is room (the reader's free_gpus)
            "demand": obs.demand.model_copy(update={"knows_nodes": True, "free_gpus": (8.0,)}),  # type: ignore[union-attr]
            "instances": tuple(node(i, runs_work=i < 4) for i in range(5)),
        }
    )
    assert tick(knows, state).desired == 5 + 2  # 8 GPUs fit the free node: 2 more needed


def test_a_pod_that_waits_beside_an_empty_node_asks_for_no_more_nodes() -> None:
    """It waits for something else (CPU, a volume's zone): one more node would not place it either, so
    the group does not climb to max one warm-up at a time."""
    obs = observe(1, (work(8),)).model_copy(
        update={
            "demand": Demand(
                source="cluster ml", waiting=(work(8),), gpus_per_node=8, free_gpus=(8.0,), knows_nodes=True
            )
        }
    )
    late = GroupState(last_scale_out_at=NOW - timedelta(hours=1), last_scale_out_added=1)
    d = tick(obs, late)
    assert d.action is Action.HOLD and "room on the group's nodes will take them" in d.reason


def test_instances_still_launching_count_whatever_the_warm_up() -> None:
    obs = observe(3, (work(8), work(8)))
    obs = obs.model_copy(
        update={"instances": (node(0), node(1, lifecycle_state="Pending"), node(2, lifecycle_state="Pending"))}
    )
    late = GroupState(last_scale_out_at=NOW - timedelta(hours=1), last_scale_out_added=2)
    assert tick(obs, late).action is Action.HOLD
