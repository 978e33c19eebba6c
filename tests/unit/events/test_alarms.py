"""Every trigger shape becomes one typed event; bad input gets a sentence saying what was wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain.errors import InvalidEvent, UnsupportedEvent
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import AlarmState, Direction, GroupRef, MetricRef
from gpufleet.events import EventKind, parse_event, parse_for
from gpufleet.events.model import AlarmEvent, AlarmSource, ScheduleTick
from gpufleet.policy.fleet import parse_policy
from gpufleet.scaling.targets import resolve_alarm_target

EVENTS = Path(__file__).resolve().parents[3] / "events" / "scaler"
TRAIN = GroupRef(kind=GroupKind.ASG, name="train-spot")
INFER = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="infer-gpu")


def load(name: str) -> Any:
    return json.loads((EVENTS / name).read_text())


@pytest.mark.parametrize(
    ("name", "source", "alarm", "state", "groups_in_metrics"),
    [
        ("eventbridge-alarm-asg-high.json", "eventbridge", "gpufleet-train-gpu-high", AlarmState.ALARM, 1),
        ("eventbridge-alarm-asg-ok.json", "eventbridge", "gpufleet-train-gpu-high", AlarmState.OK, 1),
        ("eventbridge-alarm-eks-math.json", "eventbridge", "gpufleet-infer-busiest", AlarmState.ALARM, 2),
        ("alarm-action-asg-low.json", "alarm-action", "gpufleet-train-gpu-low", AlarmState.ALARM, 1),
        ("sns-alarm-eks-high.json", "sns", "gpufleet-infer-gpu-high", AlarmState.ALARM, 1),
    ],
)
def test_alarm_shapes(name: str, source: str, alarm: str, state: AlarmState, groups_in_metrics: int) -> None:
    (trigger,) = parse_event(load(name))
    assert isinstance(trigger, AlarmEvent)
    assert (trigger.source, trigger.alarm_name, trigger.state) == (source, alarm, state)
    assert len(trigger.metrics) == groups_in_metrics
    assert trigger.at.tzinfo is not None and trigger.event_id


def test_composite_alarm_is_flagged() -> None:
    (trigger,) = parse_event(load("eventbridge-alarm-composite.json"))
    assert isinstance(trigger, AlarmEvent) and trigger.composite and trigger.metrics == ()


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("scheduler-reconcile.json", "scheduler"),
        ("eventbridge-scheduled-event.json", "eventbridge-schedule"),
        # Issue 22 #10: a schedule users wire without Input gets Scheduler's default payload, once refused.
        ("scheduler-default-payload.json", "scheduler"),
    ],
)
def test_reconcile_shapes(name: str, source: str) -> None:
    (tick,) = parse_event(load(name))
    assert isinstance(tick, ScheduleTick) and tick.source == source
    assert tick.event_id == load(name).get("id", load(name).get("execution_id"))


def test_alarm_action_event_id_is_stable_per_state_change() -> None:
    a = parse_event(load("alarm-action-asg-low.json"))[0]
    b = parse_event(load("alarm-action-asg-low.json"))[0]
    assert a.event_id == b.event_id and "gpufleet-train-gpu-low" in a.event_id


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bad-unknown-detail-type.json", "unsupported EventBridge event 'EC2 Instance State-change Notification'"),
        ("bad-alarm-wrong-types.json", "EventBridge event is malformed: time:"),
        ("bad-sns-not-an-alarm.json", "is not JSON: not a CloudWatch alarm notification"),
        ("bad-schedule-missing-fields.json", "scheduler event is malformed: execution_id: Field required"),
        ("bad-not-an-object.json", "expected a JSON object, got list"),
    ],
)
def test_bad_events_say_what_is_wrong(name: str, message: str) -> None:
    with pytest.raises(InvalidEvent, match=None) as err:
        parse_event(load(name))
    assert message in str(err.value)


def test_wrong_alarm_state_names_the_field() -> None:
    event = load("eventbridge-alarm-asg-high.json")
    event["detail"]["state"]["value"] = "PANIC"
    with pytest.raises(InvalidEvent, match=r"state\.value: Input should be 'OK', 'ALARM' or 'INSUFFICIENT_DATA'"):
        parse_event(event)


def test_unknown_top_level_shape() -> None:
    with pytest.raises(InvalidEvent, match="unrecognised event"):
        parse_event({"hello": "world"})


# ---- target resolution ----

POLICY = parse_policy(
    """
alarms:
  - {alarm: "legacy-gpu-*", group: "asg:train-spot", direction: out}
  - {alarm: "gpufleet-infer-*", direction: out}
"""
)


def trigger(name: str, *metrics: MetricRef, composite: bool = False) -> AlarmEvent:
    from datetime import UTC, datetime

    return AlarmEvent(
        event_id="e",
        source=AlarmSource.EVENTBRIDGE,
        alarm_name=name,
        state=AlarmState.ALARM,
        at=datetime(2026, 1, 1, tzinfo=UTC),
        metrics=metrics,
        composite=composite,
    )


ASG_METRIC = MetricRef(namespace="GPUFleet", name="GPUUtilization", dimensions={"AutoScalingGroupName": "train-spot"})
EKS_METRIC = MetricRef(
    namespace="GPUFleet", name="GPUUtilization", dimensions={"ClusterName": "ml", "NodegroupName": "infer-gpu"}
)


@pytest.mark.parametrize(
    ("alarm", "tags", "group", "direction", "found_by"),
    [
        (
            trigger("a", ASG_METRIC),
            {"gpufleet:target": "eks:ml/infer-gpu", "gpufleet:direction": "in"},
            INFER,
            Direction.IN,
            "group eks:ml/infer-gpu from alarm tag; direction in from alarm tag",
        ),
        (trigger("a", ASG_METRIC), {"gpufleet:direction": "out"}, TRAIN, Direction.OUT, "from metric dimensions"),
        (trigger("gpufleet-infer-x", EKS_METRIC, EKS_METRIC), {}, INFER, Direction.OUT, "policy alarm mapping"),
        (trigger("legacy-gpu-1"), {}, TRAIN, Direction.OUT, "group asg:train-spot from policy alarm mapping"),
        (
            trigger("a", ASG_METRIC, EKS_METRIC),
            {"gpufleet:direction": "out"},
            None,
            Direction.OUT,
            "metric dimensions name several groups",
        ),
        (trigger("a", ASG_METRIC), {}, TRAIN, None, "no direction"),
        (
            trigger("a", composite=True),
            {"gpufleet:direction": "out"},
            None,
            Direction.OUT,
            "composite alarm without a gpufleet:target tag",
        ),
        (trigger("a", ASG_METRIC), {"gpufleet:direction": "sideways"}, TRAIN, None, "ignored tag gpufleet:direction"),
    ],
)
def test_target_resolution(
    alarm: AlarmEvent, tags: dict[str, str], group: GroupRef | None, direction: Direction | None, found_by: str
) -> None:
    target = resolve_alarm_target(alarm, tags, POLICY)
    assert (target.group, target.direction) == (group, direction)
    assert found_by in target.found_by


def test_a_function_rejects_kinds_it_does_not_handle_in_one_line() -> None:
    with pytest.raises(UnsupportedEvent) as err:
        parse_for(
            load("eventbridge-alarm-asg-high.json"), "spot_watch", [EventKind.LAUNCH_UNSUCCESSFUL, EventKind.SCHEDULE]
        )
    assert str(err.value) == "spot_watch does not handle alarm events (it takes: launch-unsuccessful, schedule)"


def test_an_empty_execution_id_is_refused_it_is_the_ticks_idempotency_key() -> None:
    """Found by the adversarial property: an empty id turned Powertools idempotency off, so one tick
    delivered twice acted twice."""
    with pytest.raises(InvalidEvent, match="execution_id"):
        parse_event({"gpufleet": "reconcile", "execution_id": "", "scheduled_time": "2026-11-23T08:12:30Z"})
