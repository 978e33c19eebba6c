"""Turn every raw Lambda event shape into typed trigger events before anything is decided.

Shapes: EventBridge "CloudWatch Alarm State Change", the direct Lambda alarm action (`alarmData`),
SNS alarm notifications, EventBridge Scheduler input and the classic EventBridge "Scheduled Event".
Anything else raises InvalidEvent with a sentence saying what was wrong.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.parser.models import EventBridgeModel, SnsModel
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.fleet_policy import describe_validation_error
from gpufleet.models import AlarmState, AlarmTrigger, MetricRef, ReconcileTick, TriggerEvent

RECONCILE_MARKER = "gpufleet"  # Scheduler input: {"gpufleet": "reconcile", ...}


class InvalidEvent(ValueError):
    """The event can't be understood; nothing was changed."""


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# --- EventBridge detail / alarm-action alarmData (same shape) ---


class _Metric(_Loose):
    namespace: str | None = None
    name: str | None = None
    dimensions: dict[str, str] = Field(default_factory=dict)


class _MetricStat(_Loose):
    metric: _Metric


class _MetricQuery(_Loose):
    id: str | None = None
    metricStat: _MetricStat | None = None  # noqa: N815 (AWS field name)
    expression: str | None = None


class _Configuration(_Loose):
    metrics: list[_MetricQuery] = Field(default_factory=list)
    alarmRule: str | None = None  # noqa: N815


class _State(_Loose):
    value: AlarmState
    reason: str = ""
    timestamp: datetime | None = None


class _AlarmDetail(_Loose):
    alarmName: str  # noqa: N815
    state: _State
    previousState: _State | None = None  # noqa: N815
    configuration: _Configuration = Field(default_factory=_Configuration)


class _AlarmAction(_Loose):
    source: str
    alarmArn: str  # noqa: N815
    time: datetime
    alarmData: _AlarmDetail  # noqa: N815


# --- SNS alarm notification message ---


class _SnsDimension(_Loose):
    name: str
    value: str


class _SnsMetric(_Loose):
    Namespace: str | None = None
    MetricName: str | None = None
    Dimensions: list[_SnsDimension] = Field(default_factory=list)


class _SnsMetricStat(_Loose):
    Metric: _SnsMetric


class _SnsMetricQuery(_Loose):
    Id: str | None = None
    MetricStat: _SnsMetricStat | None = None
    Expression: str | None = None


class _SnsTrigger(_Loose):
    MetricName: str | None = None
    Namespace: str | None = None
    Dimensions: list[_SnsDimension] = Field(default_factory=list)
    Metrics: list[_SnsMetricQuery] = Field(default_factory=list)


class _SnsAlarmMessage(_Loose):
    AlarmName: str
    AlarmArn: str | None = None
    NewStateValue: AlarmState
    OldStateValue: AlarmState | None = None
    NewStateReason: str = ""
    StateChangeTime: datetime
    Trigger: _SnsTrigger | None = None
    AlarmRule: str | None = None


class _ScheduleInput(_Loose):
    gpufleet: str
    execution_id: str
    scheduled_time: datetime


def _metrics_from_detail(conf: _Configuration) -> tuple[MetricRef, ...]:
    """Every metric the alarm reads, including the children of math expressions."""
    return tuple(
        MetricRef(
            namespace=q.metricStat.metric.namespace,
            name=q.metricStat.metric.name,
            dimensions=q.metricStat.metric.dimensions,
        )
        for q in conf.metrics
        if q.metricStat is not None
    )


def _metrics_from_sns(trig: _SnsTrigger | None) -> tuple[MetricRef, ...]:
    if trig is None:
        return ()
    refs: list[MetricRef] = []
    if trig.MetricName:
        refs.append(
            MetricRef(
                namespace=trig.Namespace,
                name=trig.MetricName,
                dimensions={d.name: d.value for d in trig.Dimensions},
            )
        )
    for q in trig.Metrics:
        if q.MetricStat is not None:
            m = q.MetricStat.Metric
            refs.append(
                MetricRef(namespace=m.Namespace, name=m.MetricName, dimensions={d.name: d.value for d in m.Dimensions})
            )
    return tuple(refs)


def _alarm_from_detail(
    detail: _AlarmDetail,
    *,
    event_id: str,
    source: Literal["eventbridge", "alarm-action"],
    arn: str | None,
    at: datetime,
) -> AlarmTrigger:
    return AlarmTrigger(
        event_id=event_id,
        source=source,
        alarm_name=detail.alarmName,
        alarm_arn=arn,
        state=detail.state.value,
        previous_state=detail.previousState.value if detail.previousState else None,
        state_reason=detail.state.reason,
        at=_utc(detail.state.timestamp or at),
        metrics=_metrics_from_detail(detail.configuration),
        composite=detail.configuration.alarmRule is not None,
    )


def _utc(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def _explain(err: ValidationError, shape: str) -> InvalidEvent:
    return InvalidEvent(f"{shape} event is malformed: " + "; ".join(describe_validation_error(err)))


def parse_trigger_events(event: Any) -> list[TriggerEvent]:
    """All typed triggers in one Lambda event (an SNS event may carry several records)."""
    if not isinstance(event, dict):
        raise InvalidEvent(f"expected a JSON object, got {type(event).__name__}")
    if "Records" in event:
        return _from_sns(event)
    if "alarmData" in event:
        try:
            action = _AlarmAction.model_validate(event)
        except ValidationError as err:
            raise _explain(err, "alarm action") from None
        event_id = f"{action.alarmArn}@{(action.alarmData.state.timestamp or action.time).isoformat()}"
        return [
            _alarm_from_detail(
                action.alarmData, event_id=event_id, source="alarm-action", arn=action.alarmArn, at=action.time
            )
        ]
    if RECONCILE_MARKER in event:
        try:
            tick = _ScheduleInput.model_validate(event)
        except ValidationError as err:
            raise _explain(err, "scheduler") from None
        if tick.gpufleet != "reconcile":
            raise InvalidEvent(f"unknown gpufleet command {tick.gpufleet!r} (expected 'reconcile')")
        return [ReconcileTick(event_id=tick.execution_id, source="scheduler", at=_utc(tick.scheduled_time))]
    if "detail-type" in event:
        return [_from_eventbridge(event)]
    raise InvalidEvent(
        "unrecognised event: expected an EventBridge event, an SNS notification, "
        f"a CloudWatch alarm action or a gpufleet schedule (top-level keys: {sorted(event)[:8]})"
    )


def _from_eventbridge(event: dict[str, Any]) -> TriggerEvent:
    try:
        envelope = parse(event=event, model=EventBridgeModel)
    except ValidationError as err:
        raise _explain(err, "EventBridge") from None
    detail_type = envelope.detail_type
    if detail_type == "Scheduled Event":
        return ReconcileTick(event_id=envelope.id, source="eventbridge-schedule", at=_utc(envelope.time))
    if detail_type != "CloudWatch Alarm State Change":
        raise InvalidEvent(
            f"unsupported detail-type {detail_type!r} from {envelope.source!r}: the scaler takes "
            "'CloudWatch Alarm State Change' and 'Scheduled Event'"
        )
    try:
        detail = _AlarmDetail.model_validate(envelope.detail)
    except ValidationError as err:
        raise _explain(err, "CloudWatch Alarm State Change") from None
    arn = envelope.resources[0] if envelope.resources else None
    return _alarm_from_detail(detail, event_id=envelope.id, source="eventbridge", arn=arn, at=envelope.time)


def _from_sns(event: dict[str, Any]) -> list[TriggerEvent]:
    try:
        sns = parse(event=event, model=SnsModel)
    except ValidationError as err:
        raise _explain(err, "SNS") from None
    out: list[TriggerEvent] = []
    for record in sns.Records:
        try:
            body = json.loads(str(record.Sns.Message))
        except json.JSONDecodeError:
            raise InvalidEvent(
                f"SNS message {record.Sns.MessageId} is not JSON: not a CloudWatch alarm notification"
            ) from None
        try:
            msg = _SnsAlarmMessage.model_validate(body)
        except ValidationError as err:
            raise _explain(err, f"SNS alarm notification {record.Sns.MessageId}") from None
        out.append(
            AlarmTrigger(
                event_id=record.Sns.MessageId,
                source="sns",
                alarm_name=msg.AlarmName,
                alarm_arn=msg.AlarmArn,
                state=msg.NewStateValue,
                previous_state=msg.OldStateValue,
                state_reason=msg.NewStateReason,
                at=_utc(msg.StateChangeTime),
                metrics=_metrics_from_sns(msg.Trigger),
                composite=msg.AlarmRule is not None,
            )
        )
    return out


def reconcile_alarm_trigger(alarm: dict[str, Any], tick: ReconcileTick) -> AlarmTrigger:
    """An alarm found still in ALARM at a reconcile tick (a DescribeAlarms MetricAlarms item)."""
    metrics: list[MetricRef] = []
    if alarm.get("MetricName"):
        metrics.append(
            MetricRef(
                namespace=alarm.get("Namespace"),
                name=alarm["MetricName"],
                dimensions={d["Name"]: d["Value"] for d in alarm.get("Dimensions", [])},
            )
        )
    for q in alarm.get("Metrics", []):
        m = q.get("MetricStat", {}).get("Metric")
        if m:
            metrics.append(
                MetricRef(
                    namespace=m.get("Namespace"),
                    name=m.get("MetricName"),
                    dimensions={d["Name"]: d["Value"] for d in m.get("Dimensions", [])},
                )
            )
    return AlarmTrigger(
        event_id=f"{tick.event_id}/{alarm['AlarmName']}",
        source="reconcile",
        alarm_name=alarm["AlarmName"],
        alarm_arn=alarm.get("AlarmArn"),
        state=AlarmState(alarm.get("StateValue", "ALARM")),
        state_reason=alarm.get("StateReason", ""),
        at=tick.at,
        metrics=tuple(metrics),
    )
