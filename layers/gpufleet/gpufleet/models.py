"""Typed events, observations and decisions shared by the pure core and the adapters."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GroupKind(StrEnum):
    ASG = "asg"
    EKS_NODEGROUP = "eks-nodegroup"


class Direction(StrEnum):
    OUT = "out"
    IN = "in"


class AlarmState(StrEnum):
    OK = "OK"
    ALARM = "ALARM"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


class GroupRef(Frozen):
    """An ASG (name) or an EKS managed node group (cluster + name)."""

    kind: GroupKind
    name: str
    cluster: str | None = None

    @property
    def key(self) -> str:
        if self.kind is GroupKind.EKS_NODEGROUP:
            return f"eks:{self.cluster}/{self.name}"
        return f"asg:{self.name}"

    @classmethod
    def parse_key(cls, key: str) -> GroupRef:
        """Inverse of `key`; also accepts a bare name as an ASG."""
        kind, sep, rest = key.partition(":")
        if not sep:
            return cls(kind=GroupKind.ASG, name=key)
        if kind == "asg" and rest:
            return cls(kind=GroupKind.ASG, name=rest)
        cluster, slash, name = rest.partition("/")
        if kind == "eks" and slash and cluster and name:
            return cls(kind=GroupKind.EKS_NODEGROUP, cluster=cluster, name=name)
        raise ValueError(f"not a group key: {key!r} (expected 'asg:NAME' or 'eks:CLUSTER/NODEGROUP')")

    def __str__(self) -> str:
        return self.key


# ---- trigger events: every input source becomes one of these before any decision is made ----


class MetricRef(Frozen):
    namespace: str | None = None
    name: str | None = None
    dimensions: dict[str, str] = Field(default_factory=dict)


class AlarmTrigger(Frozen):
    kind: Literal["alarm"] = "alarm"
    event_id: str
    source: Literal["eventbridge", "alarm-action", "sns", "reconcile"]
    alarm_name: str
    alarm_arn: str | None = None
    state: AlarmState
    previous_state: AlarmState | None = None
    state_reason: str = ""
    at: datetime
    metrics: tuple[MetricRef, ...] = ()
    composite: bool = False


class ReconcileTick(Frozen):
    kind: Literal["reconcile"] = "reconcile"
    event_id: str
    source: Literal["scheduler", "eventbridge-schedule", "manual"]
    at: datetime


TriggerEvent = Annotated[AlarmTrigger | ReconcileTick, Field(discriminator="kind")]


class AlarmTarget(Frozen):
    """Where an alarm points, and how that was found out (for the decision's reason)."""

    group: GroupRef | None
    direction: Direction | None
    found_by: str


# ---- observations (read from AWS by adapters, passed into the pure core) ----


class InstanceObservation(Frozen):
    instance_id: str
    lifecycle_state: str = "InService"
    protected_from_scale_in: bool = False
    instance_type: str | None = None
    gpu_utilization: float | None = None  # busiest GPU on the instance, percent
    gpu_memory_percent: float | None = None  # fullest GPU on the instance, percent


class GroupObservation(Frozen):
    ref: GroupRef
    min_size: int
    max_size: int
    desired: int
    asg_name: str | None = None  # the ASG that holds the instances (the node group's own ASG for EKS)
    instances: tuple[InstanceObservation, ...] = ()
    instance_metrics_loaded: bool = False
    gpu_utilization: float | None = None  # group average over the lookback window
    tags: dict[str, str] = Field(default_factory=dict)


class GroupState(Frozen):
    """What the controller remembers about a group between invocations (DynamoDB)."""

    version: int = 0
    last_scale_out_at: datetime | None = None
    last_scale_in_at: datetime | None = None


class GuardState(Frozen):
    """What the OOM guard remembers about a group: open memory risks and health findings (so it says
    "resolved" once) and when it last had instances replaced (the blast-radius budget)."""

    version: int = 0
    risks: dict[str, str] = Field(default_factory=dict)  # gpu key -> risk level
    unhealthy: dict[str, str] = Field(default_factory=dict)  # gpu key -> what is wrong
    replacements: tuple[datetime, ...] = ()


# ---- decisions ----


class Action(StrEnum):
    SCALE_OUT = "scale-out"
    SCALE_IN = "scale-in"
    SET_DESIRED = "set-desired"  # bring desired back inside bounds (e.g. a schedule window)
    HOLD = "hold"


class Outcome(StrEnum):
    DECIDED = "decided"
    APPLIED = "applied"
    DRY_RUN = "dry-run"
    NOT_NEEDED = "not-needed"
    SKIPPED_LEASE = "skipped-lease"
    FAILED = "failed"


class Bounds(Frozen):
    min: int
    max: int
    floor: int | None = None  # a scheduled window's desired: never below this while it is open
    window: str | None = None


class Decision(Frozen):
    group: str
    action: Action
    current: int
    desired: int
    victims: tuple[str, ...] = ()
    needs_instance_metrics: bool = False
    reason: str
    trigger: str  # "alarm:NAME", "target-tracking", "schedule:NAME", ...
    event_id: str
    at: datetime
    bounds: Bounds | None = None
    dry_run: bool = False
    outcome: Outcome = Outcome.DECIDED
    detail: str = ""

    @property
    def changes_capacity(self) -> bool:
        return self.action is not Action.HOLD and (self.desired != self.current or bool(self.victims))
