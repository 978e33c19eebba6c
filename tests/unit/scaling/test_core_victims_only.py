"""A group that shrinks by victims only (`GroupObservation.shrinks_by_victims_only`: HyperPod, where a lower
count lets the provider choose which nodes go) is never given a lower count: every rule that would lower it
with SET_DESIRED (max lowered below the count, a window's max, a replacement given back) removes idle
victims instead, or holds and says why."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Decision,
    Direction,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    Trigger,
    TriggerKind,
)
from gpufleet.policy.fleet import GroupSettings, IdleThreshold, ScheduleWindow
from gpufleet.scaling.core import (
    decide_reconcile,
    decide_replacement,
    decide_request,
    decide_target,
)
from gpufleet.scaling.notes import held_busy_note
from tests.profiles import examples

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.HYPERPOD, cluster="slurm-a", name="gpu-workers")
IDLE = IdleThreshold(gpu_utilization=5, memory_percent=10)
TRIGGER = Trigger(kind=TriggerKind.REQUEST, name="t")


def _node(i: int, util: float | None, work: bool = False) -> InstanceObservation:
    mem = None if util is None else 1.0
    return InstanceObservation(instance_id=f"i-{i:02d}", gpu_utilization=util, gpu_memory_percent=mem, runs_work=work)


def _obs(utils: tuple[float | None, ...], flag: bool = True, loaded: bool = True, **kw: object) -> GroupObservation:
    return GroupObservation(
        ref=REF,
        min_size=0,
        max_size=100_000,
        desired=len(utils),
        instances=tuple(_node(i, u) for i, u in enumerate(utils)),
        instance_metrics_loaded=loaded,
        shrinks_by_victims_only=flag,
        **kw,  # type: ignore[arg-type]
    )


def _reconcile(obs: GroupObservation, s: GroupSettings) -> Decision:
    return decide_reconcile(obs, s, GroupState(), NOW, event_id="tick")


# GPU utilizations of the 3 nodes (None: no metrics), victims only?, metrics loaded? ->
# (action, desired, victims, words in the reason)
ABOVE_MAX = [
    # Every kind goes by named victims (issue 40: a lower count let EC2 Auto Scaling or EKS pick busy nodes).
    ((0.0, 0.0, 0.0), False, True, (Action.SCALE_IN, 1, ("i-00", "i-01"), "above max 1")),
    ((90.0, 0.0, 80.0), False, True, (Action.SCALE_IN, 2, ("i-01",), "1 node(s) above it run work: holding them")),
    ((90.0, 95.0, 80.0), False, True, (Action.HOLD, 3, (), "max 1, 2 node(s) above it run work: holding them")),
    ((0.0, 0.0, 0.0), True, False, (Action.SCALE_IN, 3, (), "choosing idle instances")),  # read the metrics first
    ((2.0, 0.0, 1.0), True, True, (Action.SCALE_IN, 1, ("i-01", "i-02"), "above max 1")),  # the idlest two
    ((90.0, 0.0, 80.0), True, True, (Action.SCALE_IN, 2, ("i-01",), "terminating i-01")),  # only one idle: one
    ((90.0, 95.0, None), True, True, (Action.HOLD, 3, (), "above max 1 (policy bounds), but no instance is idle")),
]


@pytest.mark.parametrize(("utils", "flag", "loaded", "want"), ABOVE_MAX)
def test_max_lowered_below_the_count_removes_idle_victims_never_a_count(
    utils: tuple[float | None, ...], flag: bool, loaded: bool, want: tuple[Action, int, tuple[str, ...], str]
) -> None:
    d = _reconcile(_obs(utils, flag, loaded), GroupSettings(max=1, idle=IDLE))
    action, desired, victims, words = want
    assert (d.action, d.desired, d.victims) == (action, desired, victims), d.reason
    assert words in d.reason
    assert d.needs_instance_metrics is not loaded


def test_max_lowered_under_busy_nodes_holds_them_and_is_told_once() -> None:
    """Three nodes each running work, max 1: nothing is removed, the hold says the numbers, and the notice
    is the same one every tick (one id: told once)."""
    obs = _obs((90.0, 95.0, 80.0), flag=False)
    first = _reconcile(obs, GroupSettings(max=1, idle=IDLE))
    s = GroupSettings(max=1, idle=IDLE)
    later = decide_reconcile(obs, s, GroupState(), NOW + timedelta(minutes=5), event_id="t2")
    assert (first.action, first.desired, first.victims, first.held_busy) == (Action.HOLD, 3, (), 2)
    notes = [held_busy_note(d, "us-east-1") for d in (first, later)]
    assert notes[0].notification_id == notes[1].notification_id
    assert "holding 2 node(s) above max 1" in notes[0].title


def test_launches_still_owed_are_cancelled_by_a_count_never_below_the_instances_held() -> None:
    """desired 5, 3 instances (2 launches owed), max 1: desired goes to 3 first (AWS chooses no instance),
    then idle nodes go by name."""
    obs = _obs((0.0, 0.0, 0.0), flag=False).model_copy(update={"desired": 5})
    d = _reconcile(obs, GroupSettings(max=1, idle=IDLE))
    assert (d.action, d.desired, d.victims) == (Action.SET_DESIRED, 3, ()), d.reason
    assert "2 launch(es) still owed cancelled" in d.reason


def test_a_group_closed_for_scale_in_holds_above_max_and_says_why() -> None:
    obs = _obs((0.0, 0.0, 0.0), scale_in_closed="Slurm's idle report is stale")
    d = _reconcile(obs, GroupSettings(max=1, idle=IDLE))
    assert (d.action, d.desired) == (Action.HOLD, 3)
    assert "above max 1" in d.reason and "no node may be removed: Slurm's idle report is stale" in d.reason


def test_a_node_slurm_has_not_called_idle_is_no_victim_above_max() -> None:
    obs = _obs((0.0, 0.0, 0.0)).model_copy(
        update={"instances": (_node(0, 0.0, work=True), _node(1, 0.0, work=True), _node(2, 0.0))}
    )
    d = _reconcile(obs, GroupSettings(max=1, idle=IDLE))
    assert (d.action, d.desired, d.victims) == (Action.SCALE_IN, 2, ("i-02",))


WINDOW_MAX = ScheduleWindow(name="night", cron="0 * * * *", timezone="UTC", duration_minutes=60, max=1)


@pytest.mark.parametrize(
    "decide",
    [
        lambda o, s: decide_request(
            o, s, GroupState(), NOW, event_id="e", direction=Direction.OUT, trigger=TRIGGER, why="oom"
        ),
        lambda o, s: decide_target(o, s, GroupState(), NOW, event_id="e", target=5, trigger=TRIGGER, why="spot"),
        lambda o, s: decide_target(o, s, GroupState(), NOW, event_id="e", target=0, trigger=TRIGGER, why="spot"),
        _reconcile,
    ],
)
def test_a_windows_max_goes_the_same_way_from_every_rule_that_fixes_bounds_first(decide) -> None:  # type: ignore[no-untyped-def]
    s = GroupSettings(max=4, idle=IDLE, schedules=(WINDOW_MAX,))
    d = decide(_obs((0.0, 50.0, 90.0)), s)
    assert (d.action, d.desired, d.victims) == (Action.SCALE_IN, 2, ("i-00",)), d.reason
    assert "above max 1 (schedule 'night')" in d.reason
    busy = decide(_obs((40.0, 50.0, 90.0)), s)
    assert (busy.action, busy.desired) == (Action.HOLD, 3) and "no instance is idle" in busy.reason


def test_a_replacement_gone_is_given_back_by_an_idle_victim_not_a_lower_count() -> None:
    obs = _obs((0.0, 0.0, 0.0, 0.0, 0.0))  # desired 5, node i-09 (interrupted) already gone, 5 listed
    obs = obs.model_copy(update={"instances": obs.instances[:4]})  # 4 listed: gone and not replaced yet
    d = decide_replacement(
        obs,
        GroupSettings(idle=IDLE),
        GroupState(),
        NOW,
        event_id="w",
        instance_id="i-09",
        direction=Direction.IN,
        why="spot-interruption for i-09",
    )
    assert d.action is Action.SCALE_IN and d.desired == 4 and len(d.victims) == 1, d.reason
    plain = obs.model_copy(update={"shrinks_by_victims_only": False})
    kw = {"event_id": "w", "instance_id": "i-09", "direction": Direction.IN, "why": "x"}
    assert decide_replacement(plain, GroupSettings(idle=IDLE), GroupState(), NOW, **kw).action is Action.SET_DESIRED


UTIL = st.one_of(st.none(), st.sampled_from([0.0, 3.0, 50.0, 99.0]))


@settings(max_examples=examples(60), deadline=None)
@given(
    utils=st.lists(UTIL, min_size=0, max_size=6),
    lo=st.integers(0, 6),
    hi=st.integers(0, 6),
    window_max=st.one_of(st.none(), st.integers(0, 6)),
    loaded=st.booleans(),
)
def test_property_never_a_lower_count_and_never_a_busy_victim(
    utils: list[float | None], lo: int, hi: int, window_max: int | None, loaded: bool
) -> None:
    """Whatever the bounds: no decision for such a group lowers its count without naming the victims (or
    asking for the metrics to choose them), and no victim's GPUs read busy or unknown."""
    windows = (WINDOW_MAX.model_copy(update={"max": window_max}),) if window_max is not None else ()
    s = GroupSettings(min=min(lo, hi), max=hi, idle=IDLE, schedules=windows)
    obs = _obs(tuple(utils), loaded=loaded)
    for d in (
        _reconcile(obs, s),
        decide_target(obs, s, GroupState(), NOW, event_id="e", target=0, trigger=TRIGGER, why="x"),
    ):
        if d.action is Action.SET_DESIRED:
            assert d.desired > d.current, d.reason
        if d.action is Action.SCALE_IN and not d.needs_instance_metrics:
            assert d.current - d.desired == len(d.victims) > 0, d.reason
            by_id = {i.instance_id: i for i in obs.instances}
            utils_of = [by_id[v].gpu_utilization for v in d.victims]
            assert all(u is not None and u <= IDLE.gpu_utilization for u in utils_of), d.reason
