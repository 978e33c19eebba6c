"""Every inbound shape becomes typed events here, before anything is decided (one parser per shape).

`parse_event` recognises a raw Lambda event by what it is - an SQS or SNS batch (by its records'
event source), a Lambda alarm action, a gpufleet schedule command, an EventBridge event (by source and
detail-type) - and returns typed events. `parse_for` also checks them against the kinds a function
handles, so a function given another kind rejects it in one line and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from pydantic import AliasChoices, Field

from gpufleet.domain.errors import InvalidEvent, UnsupportedEvent
from gpufleet.domain.values import is_storable
from gpufleet.events import alarms, autoscaling, ec2, schedules
from gpufleet.events.common import Lenient, Name, Timestamp, validate
from gpufleet.events.model import EventKind, InboundEvent, QueueBatch, ScheduleSource
from gpufleet.events.origin import Origin, check_origin

__all__ = ["EventKind", "InboundEvent", "Origin", "parse_event", "parse_for"]


class _EventBridge(Lenient):
    # AWS's Capacity Block page documents its events with `customer_event_id` and `detail_type`.
    id: Name = Field(min_length=1, max_length=256, validation_alias=AliasChoices("id", "customer_event_id"))
    detail_type: str = Field(validation_alias=AliasChoices("detail-type", "detail_type"))
    source: str
    time: Timestamp
    resources: list[str] = Field(default_factory=list)
    detail: Any = None


class _SnsBody(Lenient):
    MessageId: Name = Field(min_length=1, max_length=256)
    Message: str


class _SnsRecord(Lenient):
    Sns: _SnsBody


class _SnsBatch(Lenient):
    Records: list[_SnsRecord] = Field(min_length=1, max_length=100)


class _SqsRecord(Lenient):
    messageId: Name  # noqa: N815


class _SqsBatch(Lenient):
    Records: list[_SqsRecord] = Field(min_length=1, max_length=10_000)


EventBridgeParser = Callable[[_EventBridge], InboundEvent]

_EVENTBRIDGE: dict[tuple[str, str], EventBridgeParser] = {
    ("aws.cloudwatch", "CloudWatch Alarm State Change"): lambda e: alarms.from_eventbridge_detail(
        e.detail, event_id=e.id, arn=e.resources[0] if e.resources else None, at=e.time
    ),
    ("aws.events", "Scheduled Event"): lambda e: schedules.from_scheduled_event(e.id, e.time),
    # What EventBridge Scheduler sends a schedule without Input (its detail is the string "{}").
    ("aws.scheduler", "Scheduled Event"): lambda e: schedules.from_scheduled_event(
        e.id, e.time, ScheduleSource.SCHEDULER
    ),
    ("aws.autoscaling", autoscaling.LAUNCH_UNSUCCESSFUL): lambda e: autoscaling.from_launch_unsuccessful(
        e.id, e.detail
    ),
    ("aws.ec2", ec2.SPOT_INTERRUPTION): lambda e: ec2.instance_warning(
        EventKind.SPOT_INTERRUPTION, e.detail_type, e.id, e.detail, e.time
    ),
    ("aws.ec2", ec2.REBALANCE): lambda e: ec2.instance_warning(
        EventKind.REBALANCE, e.detail_type, e.id, e.detail, e.time
    ),
    **{
        ("aws.ec2", name): lambda e: ec2.capacity_block(e.detail_type, e.id, e.detail, e.time)
        for name in ec2.CAPACITY_BLOCK_PHASES
    },
}


def _record_source(record: Any) -> str:
    if not isinstance(record, dict):
        return ""
    source = record.get("EventSource") or record.get("eventSource") or ("aws:sns" if "Sns" in record else "")
    return source if isinstance(source, str) else ""


def _from_records(event: dict[str, Any]) -> list[InboundEvent]:
    records = event["Records"]
    if not isinstance(records, list) or not records:
        raise InvalidEvent("Records must be a non-empty list")
    sources = {_record_source(r) for r in records}
    if sources == {"aws:sns"}:
        batch = validate(_SnsBatch, event, "SNS")
        return [alarms.from_sns_message(r.Sns.Message, r.Sns.MessageId) for r in batch.Records]
    if sources == {"aws:sqs"}:
        sqs = validate(_SqsBatch, event, "SQS")
        return [QueueBatch(event_id=sqs.Records[0].messageId, records=len(sqs.Records))]
    shown = ", ".join(sorted(s or "(none)" for s in sources))[:80]
    raise InvalidEvent(f"Records from an unsupported event source ({shown}): expected aws:sns or aws:sqs")


def _from_eventbridge(event: dict[str, Any]) -> InboundEvent:
    envelope = validate(_EventBridge, event, "EventBridge")
    parser = _EVENTBRIDGE.get((envelope.source, envelope.detail_type))
    if parser is None:
        shape = f"{envelope.detail_type[:80]!r} from {envelope.source[:60]!r}"
        raise InvalidEvent(f"unsupported EventBridge event {shape}")
    return parser(envelope)


def parse_event(event: Any) -> list[InboundEvent]:
    """All typed events in one raw Lambda event (an SNS batch may carry several alarms)."""
    try:
        parsed = _parse(event)
    except RecursionError:  # a value nested thousands deep, wherever it sits
        raise InvalidEvent("event is nested too deeply to be an AWS event") from None
    for e in parsed:
        _storable_throughout(e)
    return parsed


def _unstorable(value: Any, path: str) -> str | None:
    """The first place a text DynamoDB, JSON and Slack cannot carry (a lone surrogate) hides in."""
    if isinstance(value, str):
        return None if value.isascii() or is_storable(value) else path or "(text)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, inner in items:
        found = _unstorable(key, f"{path}.key") if isinstance(key, str) else None
        found = found or _unstorable(inner, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def _storable_throughout(event: InboundEvent) -> None:
    """Every field a decision, a record or a message may carry, free-form ones included (a launch
    failure's Details, an alarm's mute rule), is storable text: else the event is refused before
    anything acts, not after a group was changed and its record could not be written."""
    where = _unstorable(event.model_dump(), "")
    if where:
        raise InvalidEvent(f"{event.kind} event has text that is not valid Unicode in {where[:80]}: nothing done")


def _parse(event: Any) -> list[InboundEvent]:
    if not isinstance(event, dict):
        raise InvalidEvent(f"expected a JSON object, got {type(event).__name__}")
    if "Records" in event:
        return _from_records(event)
    if "alarmData" in event:
        return [alarms.from_alarm_action(event)]
    if schedules.COMMAND_KEY in event:
        return [schedules.from_scheduler_input(event)]
    if "detail-type" in event or "detail_type" in event:
        return [_from_eventbridge(event)]
    if autoscaling.TERMINATION_KEY in event:
        return [autoscaling.from_termination_request(event)]
    keys = ", ".join(sorted(str(k)[:30] for k in event)[:8])
    raise InvalidEvent(
        "unrecognised event: expected an EventBridge event, an SNS or SQS batch, a CloudWatch alarm action, "
        f"a gpufleet schedule or an Auto Scaling termination request (top-level keys: {keys})"
    )


def parse_for(
    event: Any, function: str, accepts: Iterable[EventKind], home: Origin | None = None
) -> list[InboundEvent]:
    """`parse_event`, then reject kinds this function does not handle and events of another account or
    region than `home` (before anything is read)."""
    accepted = frozenset(accepts)
    parsed = parse_event(event)
    if home is not None:
        check_origin(event, home)
    for e in parsed:
        if e.kind not in accepted:
            takes = ", ".join(sorted(accepted))
            raise UnsupportedEvent(f"{function} does not handle {e.kind} events (it takes: {takes})")
    return parsed
