"""Reconcile ticks and the notifier's sweep: EventBridge Scheduler input (`{"gpufleet": ...}`), the
classic EventBridge "Scheduled Event", and the default payload Scheduler sends a schedule without Input."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gpufleet.domain.errors import InvalidEvent
from gpufleet.events.common import Lenient, Name, Timestamp, validate
from gpufleet.events.model import ScheduleSource, ScheduleTick, SweepTick

COMMAND_KEY = "gpufleet"  # Scheduler input: {"gpufleet": "reconcile", "execution_id": ..., "scheduled_time": ...}
RECONCILE = "reconcile"
SWEEP = "sweep"


class _ScheduleInput(Lenient):
    execution_id: Name = Field(min_length=1)  # the idempotency key: an empty one would turn it off
    scheduled_time: Timestamp


def from_scheduler_input(event: dict[str, Any]) -> ScheduleTick | SweepTick:
    command = event.get(COMMAND_KEY)
    if command == SWEEP:
        return SweepTick()
    if command != RECONCILE:
        shown = repr(command)[:40]
        raise InvalidEvent(f"unknown gpufleet command {shown} (expected '{RECONCILE}' or '{SWEEP}')")
    tick = validate(_ScheduleInput, event, "scheduler")
    return ScheduleTick(event_id=tick.execution_id, source=ScheduleSource.SCHEDULER, at=tick.scheduled_time)


def from_scheduled_event(
    event_id: str, at: Any, source: ScheduleSource = ScheduleSource.EVENTBRIDGE_SCHEDULE
) -> ScheduleTick:
    """A classic rule's "Scheduled Event", or EventBridge Scheduler's default payload (no Input)."""
    return ScheduleTick(event_id=event_id, source=source, at=at)
