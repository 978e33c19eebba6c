"""CloudWatch alarm state changes, however they arrive: EventBridge "CloudWatch Alarm State Change",
the Lambda alarm action (`alarmData`), an SNS alarm notification, or DescribeAlarms at a reconcile tick.
All become one `AlarmEvent`, including whether CloudWatch would have suppressed or muted its actions.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import Field

from gpufleet.domain.errors import InvalidEvent
from gpufleet.domain.models import AlarmCondition, AlarmState, MetricRef
from gpufleet.domain.values import MAX_TEXT
from gpufleet.events.common import Lenient, Name, Text, Timestamp, validate
from gpufleet.events.model import AlarmEvent, AlarmSource, ScheduleTick

# ---- EventBridge detail / alarm-action alarmData (same shape) ----


class _Metric(Lenient):
    namespace: Name | None = None
    name: Name | None = None
    dimensions: dict[Name, Name] = Field(default_factory=dict)


class _MetricStat(Lenient):
    metric: _Metric
    stat: Name | None = None  # "Average", "Maximum", "p99": only an Average may act (scaling/metric_trust.py)


class _MetricQuery(Lenient):
    metricStat: _MetricStat | None = None  # noqa: N815 (AWS field name)


class _Configuration(Lenient):
    metrics: list[_MetricQuery] = Field(default_factory=list)
    alarmRule: str | None = None  # noqa: N815


class _State(Lenient):
    value: AlarmState
    reason: Text = ""
    timestamp: Timestamp | None = None
    actionsSuppressedBy: str | None = None  # noqa: N815 ("Alarm", "ExtensionPeriod", "WaitPeriod")


class _PreviousState(Lenient):
    value: AlarmState | None = None


class _AlarmDetail(Lenient):
    alarmName: Name = Field(min_length=1, max_length=255)  # noqa: N815
    state: _State
    previousState: _PreviousState | None = None  # noqa: N815
    configuration: _Configuration = Field(default_factory=_Configuration)
    muteDetail: dict[str, Any] | None = None  # noqa: N815 (alarm mute rules)


class _AlarmAction(Lenient):
    alarmArn: Name  # noqa: N815
    time: Timestamp
    alarmData: _AlarmDetail  # noqa: N815


def _muted_by(detail: _AlarmDetail) -> str | None:
    """The mute rule named in muteDetail (`mutedByArn` ends in `alarm-mute-rule:<name>`), or 'a mute rule'
    when it names none."""
    mute = detail.muteDetail
    if not mute:
        return None
    for key in ("mutedByArn", "mutedBy", "muteRules", "muteRuleNames", "muteRuleName", "muteRuleArn"):
        value = mute.get(key)
        if isinstance(value, str) and value:
            return value.rpartition(":alarm-mute-rule:")[2][:200] or value[:200]
        if isinstance(value, list) and value:
            return ", ".join(str(v) for v in value)[:200]
    return "a mute rule"


def _metrics_from_detail(conf: _Configuration) -> tuple[MetricRef, ...]:
    """Every metric the alarm reads, including the children of math expressions."""
    return tuple(
        MetricRef(
            namespace=q.metricStat.metric.namespace,
            name=q.metricStat.metric.name,
            dimensions=q.metricStat.metric.dimensions,
            stat=q.metricStat.stat,
        )
        for q in conf.metrics
        if q.metricStat is not None
    )


def _from_detail(detail: _AlarmDetail, *, event_id: str, source: AlarmSource, arn: str | None, at: Any) -> AlarmEvent:
    return AlarmEvent(
        event_id=event_id,
        source=source,
        alarm_name=detail.alarmName,
        alarm_arn=arn,
        state=detail.state.value,
        previous_state=detail.previousState.value if detail.previousState else None,
        state_reason=detail.state.reason,
        at=detail.state.timestamp or at,
        metrics=_metrics_from_detail(detail.configuration),
        composite=detail.configuration.alarmRule is not None,
        actions_suppressed_by=detail.state.actionsSuppressedBy,
        muted_by=_muted_by(detail),
    )


def from_eventbridge_detail(detail: Any, *, event_id: str, arn: str | None, at: Any) -> AlarmEvent:
    parsed = validate(_AlarmDetail, detail, "CloudWatch Alarm State Change")
    return _from_detail(parsed, event_id=event_id, source=AlarmSource.EVENTBRIDGE, arn=arn, at=at)


def from_alarm_action(event: dict[str, Any]) -> AlarmEvent:
    action = validate(_AlarmAction, event, "alarm action")
    stamp = action.alarmData.state.timestamp or action.time
    event_id = f"{action.alarmArn}@{stamp.isoformat()}"
    return _from_detail(
        action.alarmData, event_id=event_id, source=AlarmSource.ALARM_ACTION, arn=action.alarmArn, at=action.time
    )


# ---- SNS alarm notification message ----


class _SnsDimension(Lenient):
    name: Name
    value: Name


class _SnsMetric(Lenient):
    Namespace: Name | None = None
    MetricName: Name | None = None
    Dimensions: list[_SnsDimension] = Field(default_factory=list)


class _SnsMetricStat(Lenient):
    Metric: _SnsMetric
    Stat: Name | None = None


class _SnsMetricQuery(Lenient):
    MetricStat: _SnsMetricStat | None = None


class _SnsTrigger(Lenient):
    MetricName: Name | None = None
    Namespace: Name | None = None
    Dimensions: list[_SnsDimension] = Field(default_factory=list)
    Metrics: list[_SnsMetricQuery] = Field(default_factory=list)
    Statistic: Name | None = None  # SNS spells it in capitals ("AVERAGE")
    ExtendedStatistic: Name | None = None


class _SnsAlarmMessage(Lenient):
    AlarmName: Name = Field(min_length=1, max_length=255)
    AlarmArn: Name | None = None
    NewStateValue: AlarmState
    OldStateValue: AlarmState | None = None
    NewStateReason: Text = ""
    StateChangeTime: Timestamp
    Trigger: _SnsTrigger | None = None
    AlarmRule: str | None = None


def _dims(dimensions: list[_SnsDimension]) -> dict[str, str]:
    return {d.name: d.value for d in dimensions}


def _metrics_from_sns(trig: _SnsTrigger | None) -> tuple[MetricRef, ...]:
    if trig is None:
        return ()
    refs = (
        [
            MetricRef(
                namespace=trig.Namespace,
                name=trig.MetricName,
                dimensions=_dims(trig.Dimensions),
                stat=trig.ExtendedStatistic or trig.Statistic,
            )
        ]
        if trig.MetricName
        else []
    )
    for q in trig.Metrics:
        if q.MetricStat is not None:
            m = q.MetricStat.Metric
            refs.append(
                MetricRef(
                    namespace=m.Namespace, name=m.MetricName, dimensions=_dims(m.Dimensions), stat=q.MetricStat.Stat
                )
            )
    return tuple(refs)


def from_sns_message(message: str, message_id: str) -> AlarmEvent:
    """An SNS record's Message: must be a CloudWatch alarm notification (JSON)."""
    try:
        body = json.loads(message)
    except (ValueError, RecursionError):
        raise InvalidEvent(f"SNS message {message_id[:80]} is not JSON: not a CloudWatch alarm notification") from None
    if not isinstance(body, dict):
        raise InvalidEvent(f"SNS message {message_id[:80]} is not a JSON object: not a CloudWatch alarm notification")
    msg = validate(_SnsAlarmMessage, body, f"SNS alarm notification {message_id[:80]}")
    return AlarmEvent(
        event_id=message_id,
        source=AlarmSource.SNS,
        alarm_name=msg.AlarmName,
        alarm_arn=msg.AlarmArn,
        state=msg.NewStateValue,
        previous_state=msg.OldStateValue,
        state_reason=msg.NewStateReason,
        at=msg.StateChangeTime,
        metrics=_metrics_from_sns(msg.Trigger),
        composite=msg.AlarmRule is not None,
    )


# ---- an alarm still in ALARM at a reconcile tick (a DescribeAlarms MetricAlarms item) ----


def described_metrics(alarm: dict[str, Any]) -> tuple[MetricRef, ...]:
    """Every metric a DescribeAlarms item reads, with its statistic (Statistic or ExtendedStatistic for a
    single-metric alarm, MetricStat.Stat for each metric of a Metrics array)."""

    def ref(m: dict[str, Any], stat: Any) -> MetricRef:
        dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
        return MetricRef(
            namespace=m.get("Namespace"), name=m.get("MetricName"), dimensions=dims, stat=str(stat) if stat else None
        )

    found = [ref(alarm, alarm.get("ExtendedStatistic") or alarm.get("Statistic"))] if alarm.get("MetricName") else []
    found += [
        ref(q["MetricStat"]["Metric"], q["MetricStat"].get("Stat"))
        for q in alarm.get("Metrics", [])
        if q.get("MetricStat", {}).get("Metric")
    ]
    return tuple(found)


def described_condition(alarm: dict[str, Any] | None) -> AlarmCondition | None:
    """A metric alarm's static threshold and comparison (DescribeAlarms' Threshold, ComparisonOperator);
    None for an alarm on a math expression (its threshold is not one series') or an anomaly band."""
    if not alarm or alarm.get("Threshold") is None or not alarm.get("ComparisonOperator"):
        return None
    if any("Expression" in q for q in alarm.get("Metrics", [])):
        return None
    return AlarmCondition(threshold=float(alarm["Threshold"]), comparison=str(alarm["ComparisonOperator"]))


def alarm_range_s(alarm: dict[str, Any] | None) -> int:
    """How far back a metric alarm reads: its longest period times EvaluationPeriods (DescribeAlarms'
    Period and EvaluationPeriods, or each MetricStat's Period for a math alarm); 0 when not said."""
    if not alarm:
        return 0
    periods = [alarm.get("Period")] + [q.get("MetricStat", {}).get("Period") for q in alarm.get("Metrics", [])]
    longest = max((int(p) for p in periods if isinstance(p, int | float) and p > 0), default=0)
    evaluations = alarm.get("EvaluationPeriods")
    count = int(evaluations) if isinstance(evaluations, int | float) and evaluations > 0 else 1
    return min(longest * count, 86_400)


def suppressed_by(alarm: dict[str, Any]) -> str | None:
    value = alarm.get("ActionsSuppressedBy")
    return None if value in (None, "", "None") else str(value)


def _described(alarm: dict[str, Any], default_state: str) -> dict[str, Any]:
    """What a DescribeAlarms item says of an alarm: its ARN, state (`default_state` when it says none),
    reason, metrics and suppression."""
    return {
        "alarm_arn": alarm.get("AlarmArn"),
        "state": AlarmState(alarm.get("StateValue", default_state)),
        "state_reason": str(alarm.get("StateReason", ""))[:MAX_TEXT],
        "metrics": described_metrics(alarm),
        "actions_suppressed_by": suppressed_by(alarm),
        "described": True,
        "condition": described_condition(alarm),
        "range_s": alarm_range_s(alarm),
    }


def as_cloudwatch_says(alarm: dict[str, Any], delivered: AlarmEvent) -> AlarmEvent:
    """A delivered alarm event rebuilt from DescribeAlarms: the delivery names the alarm and its state
    change, CloudWatch says everything acted on (ARN, state, metrics and their dimensions, suppression)."""
    changed = alarm.get("StateTransitionedTimestamp") or alarm.get("StateUpdatedTimestamp")
    said = _described(alarm, "INSUFFICIENT_DATA")
    return delivered.model_copy(
        update={
            # CloudWatch's own time of the change, not the sender's: the change's idempotency key is built
            # from it, so no message can claim (and so block) another second's change of this alarm.
            "at": changed.astimezone(UTC) if isinstance(changed, datetime) else delivered.at,
            **said,
            "composite": "AlarmRule" in alarm,
            # Either saying so holds: a composite's suppression shows in both, a mute rule only in the delivery.
            "actions_suppressed_by": said["actions_suppressed_by"] or delivered.actions_suppressed_by,
        }
    )


def from_described_alarm(alarm: dict[str, Any], tick: ScheduleTick) -> AlarmEvent:
    return AlarmEvent(
        event_id=f"{tick.event_id}/{alarm['AlarmName']}",
        source=AlarmSource.RECONCILE,
        alarm_name=alarm["AlarmName"],
        at=tick.at,
        **_described(alarm, "ALARM"),
    )
