"""Table tests and hypothesis properties for the pure decision core."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    AlarmState,
    Decision,
    Direction,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    SkipReason,
    Trigger,
    TriggerKind,
)
from gpufleet.events.model import AlarmEvent, AlarmSource
from gpufleet.policy.fleet import GroupSettings, IdleThreshold, ScheduleWindow, Step, TargetBand
from gpufleet.scaling.core import (
    choose_scale_in_victims,
    decide_alarm,
    decide_reconcile,
    decide_target,
    effective_bounds,
    window_is_open,
)
from tests.profiles import examples

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.ASG, name="train")
IDLE = IdleThreshold(gpu_utilization=5, memory_percent=10)


def inst(i: int, util: float | None = 0.0, mem: float | None = 1.0, **kw: object) -> InstanceObservation:
    return InstanceObservation(instance_id=f"i-{i:02d}", gpu_utilization=util, gpu_memory_percent=mem, **kw)  # type: ignore[arg-type]


def group(
    desired: int = 4,
    lo: int = 0,
    hi: int = 10,
    instances: tuple[InstanceObservation, ...] | None = None,
    util: float | None = None,
    loaded: bool = True,
) -> GroupObservation:
    if instances is None:
        instances = tuple(inst(i) for i in range(desired))
    return GroupObservation(
        ref=REF,
        min_size=lo,
        max_size=hi,
        desired=desired,
        instances=instances,
        instance_metrics_loaded=loaded,
        gpu_utilization=util,
    )


def alarm(
    obs: GroupObservation,
    direction: Direction,
    s: GroupSettings | None = None,
    state: GroupState | None = None,
    alarm_state: AlarmState = AlarmState.ALARM,
    now: datetime = NOW,
):
    return decide_alarm(
        obs,
        s or GroupSettings(),
        state or GroupState(),
        now,
        alarm=alarm_event(alarm_state),
        direction=direction,
    )


def alarm_event(state: AlarmState = AlarmState.ALARM, **kw: object) -> AlarmEvent:
    return AlarmEvent(event_id="e", source=AlarmSource.EVENTBRIDGE, alarm_name="a", state=state, at=NOW, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("desired", "step", "hi", "policy_max", "expected"),
    [
        (4, Step(value=2), 10, None, 6),
        (9, Step(value=2), 10, None, 10),  # capped at the group's max
        (4, Step(value=2), 10, 5, 5),  # capped at the policy max
        (4, Step(value=50, percent=True), 10, None, 6),
        (0, Step(value=50, percent=True), 10, None, 1),  # a percent step moves at least one
    ],
)
def test_scale_out_steps_and_caps(desired: int, step: Step, hi: int, policy_max: int | None, expected: int) -> None:
    d = alarm(group(desired, hi=hi), Direction.OUT, GroupSettings(scale_out_step=step, max=policy_max))
    assert (d.action, d.desired) == (Action.SCALE_OUT, expected)


@pytest.mark.parametrize("state", [AlarmState.OK, AlarmState.INSUFFICIENT_DATA])
@pytest.mark.parametrize("direction", list(Direction))
def test_only_alarm_state_acts(state: AlarmState, direction: Direction) -> None:
    d = alarm(group(4, util=99), direction, alarm_state=state)
    assert d.action is Action.HOLD and d.desired == 4
    assert "act only in ALARM" in d.reason


def test_at_max_holds_with_reason() -> None:
    d = alarm(group(10, hi=10), Direction.OUT)
    assert d.action is Action.HOLD and "already at max 10" in d.reason


@pytest.mark.parametrize(
    ("last_out", "last_in", "direction", "acts"),
    [
        (NOW - timedelta(seconds=100), None, Direction.OUT, False),  # out cooldown 300
        (NOW - timedelta(seconds=301), None, Direction.OUT, True),
        (None, NOW - timedelta(seconds=500), Direction.OUT, True),  # a scale-in doesn't block scale-out
        (NOW - timedelta(seconds=500), None, Direction.IN, False),  # in waits 600 after any change
        (None, NOW - timedelta(seconds=599), Direction.IN, False),
        (None, NOW - timedelta(seconds=601), Direction.IN, True),
    ],
)
def test_cooldowns(last_out: datetime | None, last_in: datetime | None, direction: Direction, acts: bool) -> None:
    state = GroupState(last_scale_out_at=last_out, last_scale_in_at=last_in)
    d = alarm(group(4, lo=1), direction, state=state)
    assert (d.action is not Action.HOLD) == acts, d.reason
    if not acts:
        assert "cooldown has" in d.reason


def test_scale_in_picks_the_idlest_idle_instances_only() -> None:
    instances = (
        inst(0, util=90, mem=70),  # busy
        inst(1, util=1, mem=2, protected_from_scale_in=True),
        inst(2, util=3, mem=5),
        inst(3, util=0, mem=1),
        inst(4, util=None, mem=None),  # no metrics: treated as busy
        inst(5, util=2, mem=40),  # GPU memory still held
        inst(6, util=0, mem=0, lifecycle_state="Pending"),
    )
    d = alarm(group(7, instances=instances), Direction.IN, GroupSettings(scale_in_step=Step(value=3), idle=IDLE))
    assert d.action is Action.SCALE_IN
    assert d.victims == ("i-03", "i-02")
    assert d.desired == 5
    assert "passed over 2 busy, 1 scale-in protected, 1 without GPU metrics, 1 not InService" in d.reason


def test_scale_in_without_idle_instances_holds() -> None:
    d = alarm(group(3, instances=(inst(0, 80, 50), inst(1, 70, 50), inst(2, 60, 50))), Direction.IN)
    assert d.action is Action.HOLD and "no instance is idle" in d.reason


def test_scale_in_first_asks_for_instance_metrics() -> None:
    d = alarm(group(4, loaded=False), Direction.IN)
    assert d.needs_instance_metrics and d.victims == () and d.desired == 4


def test_scale_in_never_below_min() -> None:
    d = alarm(group(3, lo=2), Direction.IN, GroupSettings(scale_in_step=Step(value=5)))
    assert d.desired == 2 and len(d.victims) == 1


@pytest.mark.parametrize(
    ("util", "action"),
    [(95.0, Action.SCALE_OUT), (50.0, Action.HOLD), (10.0, Action.SCALE_IN), (None, Action.HOLD)],
)
def test_target_band(util: float | None, action: Action) -> None:
    s = GroupSettings(target=TargetBand(low=30, high=80))
    d = decide_reconcile(group(4, lo=1, util=util), s, GroupState(), NOW, event_id="t")
    assert d.action is action, d.reason


def test_scale_out_signal_wins_over_scale_in() -> None:
    d = decide_reconcile(
        group(4, util=10),
        GroupSettings(),
        GroupState(),
        NOW,
        event_id="t",
        firing_alarms=[("low", Direction.IN), ("high", Direction.OUT)],
    )
    assert d.action is Action.SCALE_OUT and d.trigger == Trigger(kind=TriggerKind.ALARM, name="high")
    assert str(d.trigger) == "alarm:high"


BERLIN_WINDOW = ScheduleWindow(
    name="day", cron="0 9 * * 1-5", timezone="Europe/Berlin", duration_minutes=600, min=3, desired=5
)


@pytest.mark.parametrize(
    ("now", "is_open"),
    [
        (datetime(2026, 11, 23, 7, 59, tzinfo=UTC), False),  # 08:59 CET
        (datetime(2026, 11, 23, 8, 0, tzinfo=UTC), True),  # 09:00 CET (Monday)
        (datetime(2026, 11, 23, 17, 59, tzinfo=UTC), True),
        (datetime(2026, 11, 23, 18, 0, tzinfo=UTC), False),
        (datetime(2026, 7, 6, 7, 0, tzinfo=UTC), True),  # 09:00 CEST: the window follows DST
        (datetime(2026, 11, 22, 10, 0, tzinfo=UTC), False),  # Sunday
    ],
)
def test_schedule_window_in_its_time_zone(now: datetime, is_open: bool) -> None:
    assert window_is_open(BERLIN_WINDOW, now) is is_open


def test_open_window_raises_desired_and_min() -> None:
    s = GroupSettings(schedules=(BERLIN_WINDOW,))
    monday = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
    assert effective_bounds(group(1), s, monday).model_dump() == {"min": 3, "max": 10, "floor": 5, "window": "day"}
    d = decide_reconcile(group(1), s, GroupState(), monday, event_id="t")
    assert (d.action, d.desired) == (Action.SET_DESIRED, 5)
    d = decide_reconcile(group(4, util=5), s, GroupState(), monday, event_id="t")
    assert (d.action, d.desired) == (Action.SET_DESIRED, 5)
    d = decide_reconcile(group(5, util=1), s, GroupState(), monday, event_id="t")
    assert d.action is Action.HOLD and "desired 5" in d.reason  # idle, but the window holds the floor


def test_policy_bounds_are_clamped_into_the_groups_own() -> None:
    b = effective_bounds(group(4, lo=2, hi=6), GroupSettings(min=0, max=50), NOW)
    assert (b.min, b.max) == (2, 6)


def test_victim_chooser_reports_what_it_skipped() -> None:
    choice = choose_scale_in_victims([inst(0, 50, 50), inst(1, 0, 0)], 5, IDLE)
    assert choice.victims == ("i-01",) and "1 idle" in choice.note and "1 busy" in choice.note
    assert choice.skipped == {SkipReason.BUSY: 1}


def test_scale_in_hold_counts_skip_reasons() -> None:
    instances = (inst(0, 80, 50), inst(1, None, None), inst(2, 1, 1, protected_from_scale_in=True))
    d = alarm(group(3, instances=instances), Direction.IN)
    assert d.action is Action.HOLD
    assert d.skipped == {SkipReason.BUSY: 1, SkipReason.PROTECTED: 1, SkipReason.NO_METRICS: 1}


@pytest.mark.parametrize(
    ("suppressed", "muted", "reason"),
    [("Alarm", None, "actions are suppressed (Alarm)"), (None, "maintenance-window", "muted by maintenance-window")],
)
def test_suppressed_or_muted_alarms_hold(suppressed: str | None, muted: str | None, reason: str) -> None:
    event = alarm_event(actions_suppressed_by=suppressed, muted_by=muted)
    d = decide_alarm(group(4), GroupSettings(), GroupState(), NOW, alarm=event, direction=Direction.OUT)
    assert d.action is Action.HOLD and reason in d.reason


SPOT = Trigger(kind=TriggerKind.SPOT_FALLBACK, name="asg:train-spot")


@pytest.mark.parametrize(
    ("desired", "target", "policy_max", "group_max", "expected", "action"),
    [
        (0, 3, 1, 3, 1, Action.SCALE_OUT),  # the policy's max bounds another controller's change too
        (0, 3, None, 3, 3, Action.SCALE_OUT),
        (2, 5, None, 4, 4, Action.SCALE_OUT),  # capped at the group's own max
        (3, 1, None, 4, 1, Action.SCALE_IN),  # lowered by removing idle instances
        (2, 2, None, 4, 2, Action.HOLD),
    ],
)
def test_target_changes_are_bounded_like_the_scalers(
    desired: int, target: int, policy_max: int | None, group_max: int, expected: int, action: Action
) -> None:
    s = GroupSettings(max=policy_max, scale_out_cooldown_s=0, scale_in_cooldown_s=0)
    d = decide_target(
        group(desired, hi=group_max), s, GroupState(), NOW, event_id="e", target=target, trigger=SPOT, why="w"
    )
    assert (d.action, d.desired) == (action, expected), d.reason


@pytest.mark.parametrize(("desired", "target"), [(0, 2), (3, 1)])
def test_target_changes_wait_for_cooldowns(desired: int, target: int) -> None:
    state = GroupState(last_scale_out_at=NOW - timedelta(seconds=30))
    d = decide_target(group(desired), GroupSettings(), state, NOW, event_id="e", target=target, trigger=SPOT, why="w")
    assert d.action is Action.HOLD and "cooldown has" in d.reason


def test_target_change_never_removes_a_busy_instance() -> None:
    instances = (inst(0, 90, 80), inst(1, 80, 50))
    s = GroupSettings(scale_in_cooldown_s=0)
    d = decide_target(
        group(2, instances=instances), s, GroupState(), NOW, event_id="e", target=0, trigger=SPOT, why="w"
    )
    assert d.action is Action.HOLD and "no instance is idle" in d.reason


# ---- properties ----

instances_st = st.lists(
    st.builds(
        InstanceObservation,
        instance_id=st.uuids().map(lambda u: f"i-{u.hex[:12]}"),
        lifecycle_state=st.sampled_from(["InService", "InService", "Pending", "Terminating"]),
        protected_from_scale_in=st.booleans(),
        gpu_utilization=st.one_of(st.none(), st.floats(0, 100)),
        gpu_memory_percent=st.one_of(st.none(), st.floats(0, 100)),
    ),
    max_size=12,
    unique_by=lambda i: i.instance_id,
)


@st.composite
def fleet_states(draw: st.DrawFn) -> tuple[GroupObservation, GroupSettings]:
    lo = draw(st.integers(0, 5))
    hi = draw(st.integers(lo, 20))
    desired = draw(st.integers(lo, hi))
    pmin = draw(st.one_of(st.none(), st.integers(0, 20)))
    pmax = draw(st.one_of(st.none(), st.integers(pmin or 0, 25)))
    obs = GroupObservation(
        ref=REF,
        min_size=lo,
        max_size=hi,
        desired=desired,
        instances=tuple(draw(instances_st)),
        instance_metrics_loaded=True,
        gpu_utilization=draw(st.one_of(st.none(), st.floats(0, 100))),
    )
    s = GroupSettings(
        min=pmin,
        max=pmax,
        scale_out_step=draw(st.sampled_from([Step(value=1), Step(value=3), Step(value=50, percent=True)])),
        scale_in_step=draw(st.sampled_from([Step(value=1), Step(value=4), Step(value=100, percent=True)])),
        scale_out_cooldown_s=draw(st.sampled_from([0, 60, 300])),
        scale_in_cooldown_s=draw(st.sampled_from([0, 120, 600])),
    )
    return obs, s


def _bounds_ok(d: Decision, obs: GroupObservation, s: GroupSettings, now: datetime) -> bool:
    """Inside the effective bounds; or, brought down from above max, on its way there by named victims
    only: never below the instances the group holds less those it names (AWS chooses no node)."""
    b = effective_bounds(obs, s, now)
    if b.min <= d.desired <= b.max:
        return True
    live = {i.instance_id for i in obs.instances if not i.lifecycle_state.startswith("Terminat")}
    return b.max < d.desired < obs.desired and d.desired >= len(live - set(d.victims))


@settings(max_examples=examples(300), deadline=None)
@given(fleet_states(), st.sampled_from(list(Direction)), st.sampled_from(list(AlarmState)))
def test_alarm_decisions_stay_in_bounds_and_only_take_idle_victims(fs, direction, alarm_state) -> None:  # type: ignore[no-untyped-def]
    obs, s = fs
    d = alarm(obs, direction, s, alarm_state=alarm_state)
    assert _bounds_ok(d, obs, s, NOW) or (d.action is Action.HOLD and d.desired == obs.desired)
    by_id = {i.instance_id: i for i in obs.instances}
    for v in d.victims:
        i = by_id[v]
        assert i.lifecycle_state == "InService" and not i.protected_from_scale_in
        assert i.gpu_utilization is not None and i.gpu_utilization <= s.idle.gpu_utilization
        assert i.gpu_memory_percent is not None and i.gpu_memory_percent <= s.idle.memory_percent
    assert d.desired == obs.desired - len(d.victims) or d.action is not Action.SCALE_IN
    if alarm_state is not AlarmState.ALARM:
        assert d.action is Action.HOLD


@settings(max_examples=examples(150), deadline=None)
@given(
    fleet_states(),
    st.lists(
        st.tuples(
            st.sampled_from(["alarm-out", "alarm-in", "tick"]),
            st.integers(0, 900),
            st.one_of(st.none(), st.floats(0, 100)),
        ),
        max_size=25,
    ),
)
def test_any_event_order_keeps_capacity_in_bounds(fs, events) -> None:  # type: ignore[no-untyped-def]
    """Apply decisions as the controller would, over random event orders and utilization."""
    obs, s = fs
    state, now = GroupState(), NOW
    for kind, gap, util in events:
        now += timedelta(seconds=gap)
        current = obs.model_copy(update={"gpu_utilization": util})
        if kind == "tick":
            d = decide_reconcile(current, s, state, now, event_id="t")
        else:
            d = alarm(current, Direction.OUT if kind == "alarm-out" else Direction.IN, s, state=state, now=now)
        if d.changes_capacity:
            assert _bounds_ok(d, current, s, now), d
            left = set(d.victims)
            remaining = tuple(i for i in current.instances if i.instance_id not in left)
            obs = current.model_copy(update={"desired": d.desired, "instances": remaining})
            mark = "last_scale_out_at" if d.desired > d.current else "last_scale_in_at"
            state = state.model_copy(update={mark: now, "version": state.version + 1})
    b = effective_bounds(obs, s, now)
    assert obs.desired <= max(b.max, fs[0].desired)  # never grown past max


@settings(max_examples=examples(300), deadline=None)
@given(fleet_states(), st.integers(0, 30), st.integers(0, 900), st.integers(0, 900))
def test_target_changes_hold_bounds_and_cooldowns(fs, target, since_out, since_in) -> None:  # type: ignore[no-untyped-def]
    """Another controller's change (the spot fallback) stays inside the effective bounds, waits for the
    same cooldowns and only removes idle instances."""
    obs, s = fs
    state = GroupState(
        last_scale_out_at=NOW - timedelta(seconds=since_out), last_scale_in_at=NOW - timedelta(seconds=since_in)
    )
    d = decide_target(obs, s, state, NOW, event_id="e", target=target, trigger=SPOT, why="w")
    if d.changes_capacity:
        assert _bounds_ok(d, obs, s, NOW), d
        if d.action is Action.SET_DESIRED:  # putting desired back inside bounds waits for nothing
            assert d.trigger.kind in (TriggerKind.BOUNDS, TriggerKind.SCHEDULE)
        elif d.desired > obs.desired:
            assert since_out >= s.scale_out_cooldown_s
        else:
            assert since_in >= s.scale_in_cooldown_s and since_out >= s.scale_in_cooldown_s
            assert d.desired == obs.desired - len(d.victims)
            by_id = {i.instance_id: i for i in obs.instances}
            assert all(
                by_id[v].gpu_utilization is not None and by_id[v].gpu_utilization <= s.idle.gpu_utilization
                for v in d.victims
            )


@pytest.mark.parametrize(
    ("serving", "pending", "minutes_since_out", "step", "expected_desired", "why"),
    [
        (4, 2, 3, 2, 6, "2 booting cover a step of 2: hold"),
        (4, 1, 3, 2, 6, "1 booting: add the other 1"),
        (4, 0, 3, 2, 6, "nothing booting: the full step"),
        (4, 2, 6, 2, 8, "past the 5-minute warm-up: a node that never came is not capacity on the way"),
        (4, 2, None, 2, 8, "gpufleet never scaled out: nothing of ours is booting"),
    ],
)
def test_nodes_still_booting_count_as_capacity_on_the_way(
    serving: int, pending: int, minutes_since_out: int | None, step: int, expected_desired: int, why: str
) -> None:
    instances = tuple(inst(i, util=90, mem=50) for i in range(serving)) + tuple(
        inst(serving + i, util=None, mem=None, lifecycle_state="Pending") for i in range(pending)
    )
    obs = group(desired=serving + pending, instances=instances)
    last = None if minutes_since_out is None else NOW - timedelta(minutes=minutes_since_out)
    s = GroupSettings(scale_out_step=Step(value=step), scale_out_cooldown_s=60)
    d = alarm(obs, Direction.OUT, s, GroupState(last_scale_out_at=last))
    assert d.desired == expected_desired, why
    if expected_desired == obs.desired:
        assert d.action is Action.HOLD and "still booting" in d.reason


def test_an_in_service_node_without_gpu_metrics_yet_is_still_booting() -> None:
    """InService in the ASG is not serving yet: the device plugin and the publisher come later."""
    instances = (inst(0, util=95, mem=60), inst(1, util=None, mem=None))
    obs = group(desired=2, instances=instances)
    state = GroupState(last_scale_out_at=NOW - timedelta(minutes=2))
    d = alarm(obs, Direction.OUT, GroupSettings(scale_out_cooldown_s=60), state)
    assert d.action is Action.HOLD and "1 node(s)" in d.reason


@given(
    serving=st.integers(0, 8),
    pending=st.integers(0, 8),
    step=st.integers(1, 4),
    hi=st.integers(1, 20),
    minutes=st.integers(0, 20),
)
@settings(max_examples=examples(300))
def test_one_signal_never_launches_more_than_one_step_over_what_is_booting(
    serving: int, pending: int, step: int, hi: int, minutes: int
) -> None:
    """Within the warm-up, nodes already asked for plus the new ones never exceed one step over serving."""
    instances = tuple(inst(i, util=90, mem=50) for i in range(serving)) + tuple(
        inst(serving + i, util=None, mem=None, lifecycle_state="Pending") for i in range(pending)
    )
    desired = serving + pending
    obs = group(desired=desired, hi=max(hi, desired), instances=instances)
    state = GroupState(last_scale_out_at=NOW - timedelta(minutes=minutes))
    s = GroupSettings(scale_out_step=Step(value=step), scale_out_cooldown_s=0)
    d = alarm(obs, Direction.OUT, s, state)
    assert d.desired <= max(hi, desired)
    if minutes * 60 < s.warmup_s:
        assert d.desired <= max(desired, serving + step)


def _replace(obs: GroupObservation, direction: Direction, hi: int = 10, iid: str = "i-00"):  # type: ignore[no-untyped-def]
    from gpufleet.scaling.core import decide_replacement

    return decide_replacement(
        obs,
        GroupSettings(max=hi, scale_out_cooldown_s=600, scale_in_cooldown_s=600),
        GroupState(last_scale_out_at=NOW, last_scale_in_at=NOW),  # cooldowns do not apply to a replacement
        NOW,
        event_id="w",
        instance_id=iid,
        direction=direction,
        why=f"spot-interruption for {iid}",
    )


@pytest.mark.parametrize(
    ("doomed", "others", "desired", "direction", "hi", "action", "target", "victims"),
    [
        ("InService", 3, 4, Direction.OUT, 10, Action.SCALE_OUT, 5, ()),  # launch the replacement now
        ("InService", 3, 4, Direction.OUT, 4, Action.HOLD, 4, ()),  # at max: Auto Scaling replaces it later
        ("InService", 4, 5, Direction.IN, 10, Action.HOLD, 5, ()),  # still running: wait
        ("Unhealthy", 4, 5, Direction.IN, 10, Action.SCALE_IN, 4, ("i-00",)),  # reclaimed: take it out ourselves
        ("Terminating", 4, 5, Direction.IN, 10, Action.SET_DESIRED, 4, ()),  # going, not replaced: lower desired
        ("gone", 4, 5, Direction.IN, 10, Action.SET_DESIRED, 4, ()),
        ("gone", 5, 5, Direction.IN, 10, Action.SCALE_IN, 4, ("i-01",)),  # replaced too: one idle node goes
    ],
)
def test_an_interrupted_node_is_replaced_early_and_given_back_once(
    doomed: str,
    others: int,
    desired: int,
    direction: Direction,
    hi: int,
    action: Action,
    target: int,
    victims: tuple[str, ...],
) -> None:
    rest = tuple(inst(i, util=(0 if i == 1 else 90), mem=(1 if i == 1 else 60)) for i in range(1, others + 1))
    first = {
        "InService": (inst(0, util=90, mem=60),),
        "Unhealthy": (inst(0, util=90, mem=60, healthy=False),),
        "Terminating": (inst(0, util=None, mem=None, lifecycle_state="Terminating"),),
        "gone": (),
    }[doomed]
    d = _replace(group(desired=desired, instances=first + rest), direction, hi=hi)
    assert (d.action, d.desired, d.victims) == (action, target, victims), d.reason
    if d.changes_capacity:
        assert d.owed_to == "interrupted:i-00" and d.desired - d.current == (1 if direction is Direction.OUT else -1)


@pytest.mark.parametrize(
    ("doomed_state", "step", "action", "removed"),
    [
        ("InService", 1, Action.HOLD, 0),  # the idle spare is the doomed node's replacement: spoken for
        ("InService", 2, Action.SCALE_IN, 1),  # a bigger step still removes what is not spoken for
        ("gone", 1, Action.SCALE_IN, 1),  # the node went: the give-back, not the scaler, owns the ledger
    ],
)
def test_scale_in_leaves_a_replacement_launched_for_a_node_about_to_go(
    doomed_state: str, step: int, action: Action, removed: int
) -> None:
    doomed = (inst(0, util=95, mem=80),) if doomed_state == "InService" else ()
    idle = tuple(inst(i, util=0, mem=1) for i in (1, 2))
    obs = group(desired=3, instances=doomed + idle)
    state = GroupState(owed={"interrupted:i-00": 1})
    d = alarm(obs, Direction.IN, GroupSettings(scale_in_step=Step(value=step), scale_in_cooldown_s=0), state)
    assert (d.action, d.current - d.desired) == (action, removed), d.reason
    if action is Action.HOLD:
        assert "replace i-00" in d.reason


def _foreign(*minutes_ago: int) -> tuple:  # type: ignore[type-arg]
    from gpufleet.domain.models import ForeignChange

    return tuple(ForeignChange(at=NOW - timedelta(minutes=m), before=2, after=5) for m in minutes_ago)


@pytest.mark.parametrize(
    ("foreign", "ours_minutes_ago", "fight"),
    [
        ((), 5, False),
        ((3,), 5, False),  # one change: an operator's fix, not a fight
        ((20, 3), 5, True),  # two in 30 min while gpufleet changed it too
        ((20, 3), 45, False),  # gpufleet has not touched it in the window: someone else owns it, no fight
        ((50, 3), 5, False),  # the first is outside the window
    ],
)
def test_a_fight_needs_repeated_foreign_changes_while_gpufleet_acts_too(
    foreign: tuple,
    ours_minutes_ago: int,
    fight: bool,  # type: ignore[type-arg]
) -> None:
    from gpufleet.scaling.core import fight_reason

    state = GroupState(foreign=_foreign(*foreign), last_scale_out_at=NOW - timedelta(minutes=ours_minutes_ago))
    assert (fight_reason(state, NOW) is not None) is fight


def test_a_foreign_change_is_a_desired_capacity_gpufleet_did_not_leave() -> None:
    from gpufleet.scaling.core import foreign_change

    assert foreign_change(group(desired=4), GroupState(seen_desired=None), NOW) is None  # first look
    assert foreign_change(group(desired=4), GroupState(seen_desired=4), NOW) is None
    change = foreign_change(group(desired=6), GroupState(seen_desired=4), NOW)
    assert change is not None and (change.before, change.after) == (4, 6)


@pytest.mark.parametrize(
    ("owner", "aside_minutes", "advice"),
    [("gpufleet", None, False), ("external", None, True), ("gpufleet", 30, True), ("gpufleet", -1, False)],
)
def test_owner_external_and_standing_aside_turn_changes_into_advice(
    owner: str, aside_minutes: int | None, advice: bool
) -> None:
    until = None if aside_minutes is None else NOW + timedelta(minutes=aside_minutes)
    s = GroupSettings(owner=owner, scale_out_cooldown_s=0)  # type: ignore[arg-type]
    d = alarm(group(desired=4), Direction.OUT, s, GroupState(stand_aside_until=until))
    if advice:
        assert d.action is Action.HOLD and d.desired == 4 and d.reason.startswith("advice only (")
        assert "would scale-out 4 -> 5" in d.reason
    else:
        assert d.action is Action.SCALE_OUT and d.desired == 5


@given(st.sampled_from(["external"]), st.integers(0, 20), st.integers(0, 20))
def test_an_external_group_is_never_changed_by_any_rule(owner: str, desired: int, hi: int) -> None:
    obs = group(desired=desired, hi=hi, lo=0)
    s = GroupSettings(owner=owner, scale_out_cooldown_s=0, scale_in_cooldown_s=0)  # type: ignore[arg-type]
    for direction in (Direction.OUT, Direction.IN):
        d = alarm(obs, direction, s)
        assert not d.changes_capacity and d.desired == desired


def test_the_fight_warning_names_the_changes_what_caused_them_and_how_to_settle_it() -> None:
    from gpufleet.domain.notification import NotificationKind, Severity
    from gpufleet.scaling.notes import fight_note

    state = GroupState(foreign=_foreign(20, 3), stand_aside_until=NOW + timedelta(hours=6))
    cause = "At 2026-11-23T11:57:00Z a user request update of AutoScalingGroup constraints ... from 3 to 6."
    n = fight_note(group(desired=6), state, "desired capacity changed 2 times", [cause], NOW, "eu-west-1")
    assert (n.kind, n.severity, n.incident_key) == (NotificationKind.CONTROL, Severity.WARNING, "asg:train|ownership")
    assert n.facts["Auto Scaling activity 1"] == cause
    assert n.facts["standing aside until"] == "2026-11-23 18:00 UTC"
    assert "owner: external" in n.reason and "Karpenter" in n.reason
