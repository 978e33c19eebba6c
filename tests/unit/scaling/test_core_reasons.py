"""What a decision says to on-call (issue 23): the reconcile band's label, and why a bounds fix picks its
target."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    Trigger,
    TriggerKind,
)
from gpufleet.policy.fleet import GroupSettings, ScheduleWindow, TargetBand
from gpufleet.scaling.core import decide_reconcile

MONDAY = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)  # 10:00 in Berlin: the window below is open
REF = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="infer-gpu")


def observe(desired: int, util: float | None = 50.0) -> GroupObservation:
    instances = tuple(
        InstanceObservation(instance_id=f"i-{i:02d}", gpu_utilization=0.0, gpu_memory_percent=1.0)
        for i in range(desired)
    )
    return GroupObservation(
        ref=REF,
        min_size=0,
        max_size=10,
        desired=desired,
        instances=instances,
        instance_metrics_loaded=True,
        gpu_utilization=util,
    )


def window(lo: int | None, desired: int | None) -> ScheduleWindow:
    return ScheduleWindow(
        name="morning-peak", cron="0 10 * * 1-5", timezone="Europe/Berlin", duration_minutes=20, min=lo, desired=desired
    )


@pytest.mark.parametrize(
    ("desired", "settings", "target", "kind", "reason"),
    [
        (  # the demo's 1 -> 3: min 2 crossed, the window's desired 3 picked the target
            1,
            GroupSettings(max=4, schedules=(window(2, 3),)),
            3,
            TriggerKind.BOUNDS,
            "desired 1 is below min 2 (schedule 'morning-peak'): raised to the window's desired 3",
        ),
        (
            1,
            GroupSettings(min=2, max=4),
            2,
            TriggerKind.BOUNDS,
            "desired 1 is below min 2 (policy bounds): raised to min 2",
        ),
        (
            2,
            GroupSettings(max=4, schedules=(window(1, 3),)),
            3,
            TriggerKind.SCHEDULE,
            "schedule 'morning-peak' wants at least 3 (now 2): raised to 3",
        ),
    ],
)
def test_a_bounds_fix_says_what_picked_its_target(
    desired: int, settings: GroupSettings, target: int, kind: TriggerKind, reason: str
) -> None:
    d = decide_reconcile(observe(desired), settings, GroupState(), MONDAY, event_id="t")
    assert (d.action, d.desired, d.trigger.kind, d.reason) == (Action.SET_DESIRED, target, kind, reason)


def test_a_bounds_fix_down_names_its_victims_and_says_what_picked_its_target() -> None:
    """Lowered to max by idle nodes named, the idlest first: never a count AWS chooses from."""
    d = decide_reconcile(observe(6), GroupSettings(min=1, max=4), GroupState(), MONDAY, event_id="t")
    assert (d.action, d.desired, d.victims, d.trigger.kind) == (
        Action.SCALE_IN,
        4,
        ("i-00", "i-01"),
        TriggerKind.BOUNDS,
    )
    assert d.reason.startswith("desired 6 is above max 4 (policy bounds): scale in 6 -> 4, terminating i-00, i-01")


@pytest.mark.parametrize(
    ("util", "band", "action"),
    [
        (95.0, TargetBand(low=30, high=85), Action.SCALE_OUT),
        (50.0, TargetBand(low=30, high=85), Action.HOLD),
        (10.0, TargetBand(low=30, high=85), Action.SCALE_IN),
        (None, TargetBand(low=30, high=85), Action.HOLD),
        (95.0, TargetBand(enabled=False), Action.HOLD),
    ],
)
def test_the_reconcile_band_is_labelled_utilization_band_not_aws_target_tracking(
    util: float | None, band: TargetBand, action: Action
) -> None:
    d = decide_reconcile(observe(4, util), GroupSettings(target=band), GroupState(), MONDAY, event_id="t")
    assert d.action is action and str(d.trigger) == "utilization-band", d
    assert "target tracking" not in d.reason and "target-tracking" not in d.reason


@pytest.mark.parametrize(
    ("stored", "kind"),
    [
        ("utilization-band", TriggerKind.UTILIZATION_BAND),
        ("target-tracking", TriggerKind.UTILIZATION_BAND),  # audit records written before the rename
        ("alarm:gpufleet-infer-gpu-high", TriggerKind.ALARM),
    ],
)
def test_stored_triggers_read_back_under_the_new_label(stored: str, kind: TriggerKind) -> None:
    trigger = Trigger.model_validate(stored)
    assert trigger.kind is kind and not str(trigger).startswith("target-tracking")
