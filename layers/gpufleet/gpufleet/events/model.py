"""The typed inbound events: every raw shape AWS (or gpufleet itself) sends becomes one of these before
anything is decided. Each has a `kind`; each function declares the kinds it handles."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, computed_field

from gpufleet.domain.models import AlarmCondition, AlarmState, Frozen, MetricRef


class EventKind(StrEnum):
    ALARM = "alarm"  # CloudWatch alarm state change: EventBridge, Lambda alarm action or SNS
    SCHEDULE = "schedule"  # a reconcile tick: EventBridge Scheduler input or a classic "Scheduled Event"
    SWEEP = "sweep"  # the notifier's own schedule
    LAUNCH_UNSUCCESSFUL = "launch-unsuccessful"  # EC2 Auto Scaling "EC2 Instance Launch Unsuccessful"
    QUEUE_BATCH = "queue-batch"  # an SQS batch (the notification queue)
    TERMINATION_REQUEST = "termination-request"  # EC2 Auto Scaling asks its custom termination policy
    SPOT_INTERRUPTION = "spot-interruption"  # "EC2 Spot Instance Interruption Warning" (2 minutes)
    REBALANCE = "rebalance"  # "EC2 Instance Rebalance Recommendation" (elevated interruption risk)
    CAPACITY_BLOCK = "capacity-block"  # Capacity Block reservation delivered / expiring (40 min before the end)


class AlarmSource(StrEnum):
    EVENTBRIDGE = "eventbridge"
    ALARM_ACTION = "alarm-action"
    SNS = "sns"
    RECONCILE = "reconcile"  # found still in ALARM by DescribeAlarms at a reconcile tick


class ScheduleSource(StrEnum):
    SCHEDULER = "scheduler"
    EVENTBRIDGE_SCHEDULE = "eventbridge-schedule"
    MANUAL = "manual"


class AlarmEvent(Frozen):
    kind: Literal[EventKind.ALARM] = EventKind.ALARM
    event_id: str
    source: AlarmSource
    alarm_name: str
    alarm_arn: str | None = None
    state: AlarmState
    previous_state: AlarmState | None = None
    state_reason: str = ""
    at: datetime
    metrics: tuple[MetricRef, ...] = ()
    composite: bool = False
    # CloudWatch would not run this alarm's actions: a composite alarm's actions suppressor
    # (state.actionsSuppressedBy) or an alarm mute rule (muteDetail). gpufleet holds too.
    actions_suppressed_by: str | None = None
    muted_by: str | None = None
    # Only from DescribeAlarms (`described`): its static threshold (None for math or anomaly alarms) and
    # how far back it reads, for the forged-series check (scaling/metric_trust.py).
    described: bool = False
    condition: AlarmCondition | None = None
    range_s: int = 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def change_id(self) -> str:
        """One state change of one alarm, whichever path delivered it (EventBridge, SNS, the alarm
        action): the scaler's idempotency key, so a change delivered twice acts once."""
        return f"alarm|{self.alarm_name}|{self.state}|{self.at.astimezone(UTC):%Y-%m-%dT%H:%M:%S}"


class ScheduleTick(Frozen):
    kind: Literal[EventKind.SCHEDULE] = EventKind.SCHEDULE
    event_id: str
    source: ScheduleSource
    at: datetime


class SweepTick(Frozen):
    kind: Literal[EventKind.SWEEP] = EventKind.SWEEP
    event_id: str = "sweep"


class LaunchUnsuccessful(Frozen):
    """One failed launch activity of an Auto Scaling group, as its EventBridge event reports it."""

    kind: Literal[EventKind.LAUNCH_UNSUCCESSFUL] = EventKind.LAUNCH_UNSUCCESSFUL
    event_id: str
    asg_name: str
    activity_id: str
    status_code: str
    message: str
    at: datetime
    availability_zone: str | None = None
    subnet_id: str | None = None


class QueueBatch(Frozen):
    """An SQS batch; its records are parsed one by one (`events.queue.parse_message`) so one bad record
    fails alone (partial batch response)."""

    kind: Literal[EventKind.QUEUE_BATCH] = EventKind.QUEUE_BATCH
    event_id: str
    records: int


class TerminationCandidate(Frozen):
    instance_id: str
    availability_zone: str | None = None
    instance_type: str | None = None
    market: str | None = None  # "on-demand" | "spot", as EC2 Auto Scaling writes it


class CapacityToTerminate(Frozen):
    availability_zone: str | None = None
    capacity: int
    market: str | None = None


class TerminationRequest(Frozen):
    """EC2 Auto Scaling invoking its group's custom termination policy: how much capacity it must remove
    (per AZ and market), the instances it suggests, and why (SCALE_IN, INSTANCE_REFRESH,
    MAX_INSTANCE_LIFETIME, REBALANCE). The answer is the instances ready to go, possibly fewer."""

    kind: Literal[EventKind.TERMINATION_REQUEST] = EventKind.TERMINATION_REQUEST
    event_id: str  # the request carries none: a digest of the request and its minute
    asg_name: str
    capacity: tuple[CapacityToTerminate, ...]
    instances: tuple[TerminationCandidate, ...]
    cause: str
    has_more: bool = False


class InstanceWarning(Frozen):
    """A spot instance is about to be interrupted (2 minutes) or at elevated risk (a rebalance
    recommendation, often earlier)."""

    kind: Literal[EventKind.SPOT_INTERRUPTION, EventKind.REBALANCE]
    event_id: str
    instance_id: str
    action: str | None = None  # interruption: terminate | stop | hibernate
    at: datetime


class CapacityBlockEvent(Frozen):
    """A Capacity Block reservation delivered, or ending: instances in it begin terminating 30 minutes
    before the end date (the warning comes 40 minutes before it)."""

    kind: Literal[EventKind.CAPACITY_BLOCK] = EventKind.CAPACITY_BLOCK
    event_id: str
    reservation_id: str
    phase: Literal["delivered", "expiring"]
    end: datetime | None = None
    at: datetime


InboundEvent = Annotated[
    AlarmEvent
    | ScheduleTick
    | SweepTick
    | LaunchUnsuccessful
    | QueueBatch
    | TerminationRequest
    | InstanceWarning
    | CapacityBlockEvent,
    Field(discriminator="kind"),
]
