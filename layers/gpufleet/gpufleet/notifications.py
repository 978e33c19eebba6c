"""What producers (scaler, oom_guard, spot_watch) tell on-call, and how the policy routes and groups it.

A `Notification` is one fact about one incident; the notifier folds notifications with the same
incident key into one incident (see `gpufleet.incidents`) and decides what is actually posted.
"""

from __future__ import annotations

import fnmatch
import hashlib
from datetime import datetime
from enum import StrEnum
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet import defaults
from gpufleet.models import Action, Decision, GroupKind, GroupRef, Outcome


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


class IncidentState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Link(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    title: str
    url: str


class Notification(BaseModel):
    """One message on the notification queue. `notification_id` is stable per fact, so a producer's
    retry or a duplicate SQS delivery folds into the incident once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    notification_id: str = Field(min_length=1, max_length=200)
    kind: str = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9-]*$")
    severity: Severity
    group: str = Field(min_length=1, max_length=300)
    incident_key: str = Field(min_length=1, max_length=400)
    title: str = Field(min_length=1, max_length=300)
    facts: dict[str, str] = Field(default_factory=dict)
    reason: str = ""
    links: tuple[Link, ...] = ()
    state: IncidentState = IncidentState.FIRING
    at: datetime
    source: str = ""  # producing function, for the audit trail


# ---- policy: grouping, flap damping, routing ----


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Grouping(Strict):
    """Alertmanager-style timing: wait before the first post, pace updates, repeat while firing."""

    group_wait_s: int = Field(default=defaults.NOTIFY_GROUP_WAIT_S, ge=0, le=900)
    group_interval_s: int = Field(default=defaults.NOTIFY_GROUP_INTERVAL_S, ge=0, le=86400)
    repeat_interval_s: int = Field(default=defaults.NOTIFY_REPEAT_INTERVAL_S, ge=60, le=7 * 86400)


class FlapDamping(Strict):
    """More than `max_flips` firing<->resolved changes within `window_s`: one summary, not N posts."""

    max_flips: int = Field(default=defaults.NOTIFY_FLAP_MAX_FLIPS, ge=1, le=100)
    window_s: int = Field(default=defaults.NOTIFY_FLAP_WINDOW_S, ge=60, le=86400)


class RouteMatch(Strict):
    severities: tuple[Severity, ...] = ()
    groups: tuple[str, ...] = ()  # globs over group keys, e.g. "asg:train-*"
    kinds: tuple[str, ...] = ()

    def matches(self, severity: Severity, group: str, kind: str) -> bool:
        return (
            (not self.severities or severity in self.severities)
            and (not self.groups or any(fnmatch.fnmatchcase(group, g) for g in self.groups))
            and (not self.kinds or kind in self.kinds)
        )


class Route(Strict):
    match: RouteMatch = RouteMatch()
    slack: bool = True
    slack_channel: str | None = None  # bot-token mode only; webhooks post where they were created
    sns: bool = True


class NotificationPolicy(Strict):
    grouping: Grouping = Grouping()
    flap: FlapDamping = FlapDamping()
    routes: tuple[Route, ...] = ()  # first match wins
    default_route: Route = Route()
    notify_holds: bool = False  # also tell about decisions that changed nothing (noisy; for debugging)

    @model_validator(mode="after")
    def _paced(self) -> NotificationPolicy:
        if self.grouping.repeat_interval_s < self.grouping.group_interval_s:
            raise ValueError("grouping.repeat_interval_s must be >= grouping.group_interval_s")
        return self

    def route_for(self, severity: Severity, group: str, kind: str) -> Route:
        for route in self.routes:
            if route.match.matches(severity, group, kind):
                return route
        return self.default_route


# ---- links a tired on-call engineer can click ----


def console_links(group: str, region: str, alarm_name: str | None = None) -> tuple[Link, ...]:
    base = f"https://{region}.console.aws.amazon.com"
    links = []
    try:
        ref = GroupRef.parse_key(group)
    except ValueError:
        ref = None
    if ref is not None and ref.kind is GroupKind.ASG:
        links.append(
            Link(
                title="Auto Scaling group",
                url=f"{base}/ec2/home?region={region}#AutoScalingGroupDetails:id={quote(ref.name)};view=activity",
            )
        )
    elif ref is not None:
        links.append(
            Link(
                title="EKS node group",
                url=f"{base}/eks/home?region={region}#/clusters/{quote(ref.cluster or '')}"
                f"/nodegroups/{quote(ref.name)}",
            )
        )
    if alarm_name:
        links.append(
            Link(
                title="CloudWatch alarm",
                url=f"{base}/cloudwatch/home?region={region}#alarmsV2:alarm/{quote(alarm_name)}",
            )
        )
    return tuple(links)


def scaling_incident_key(group: str) -> str:
    """One incident per group for its capacity story: scale-out, failed launches, fallback, recovery."""
    return f"{group}|capacity"


def notification_id(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


_NOTIFY_OUTCOMES = {
    Outcome.APPLIED: Severity.INFO,
    Outcome.DRY_RUN: Severity.INFO,
    Outcome.FAILED: Severity.CRITICAL,
}


def notifications_for_decisions(
    decisions: list[Decision], region: str, policy: NotificationPolicy, source: str = "scaler"
) -> list[Notification]:
    """The scaler's decisions worth telling: changes, would-be changes (dry-run) and failures."""
    out = []
    for d in decisions:
        severity = _NOTIFY_OUTCOMES.get(d.outcome)
        if severity is None and not (policy.notify_holds and d.action is not Action.HOLD):
            continue
        severity = severity or Severity.INFO
        verb = {
            Outcome.APPLIED: "scaled",
            Outcome.DRY_RUN: "would scale (dry-run)",
            Outcome.FAILED: "failed to scale",
        }.get(d.outcome, str(d.outcome))
        title = f"{d.group}: {verb} {d.current} -> {d.desired}"
        facts = {"action": str(d.action), "capacity": f"{d.current} -> {d.desired}", "trigger": d.trigger}
        if d.victims:
            facts["instances removed"] = ", ".join(d.victims)
        if d.bounds is not None:
            facts["bounds"] = f"min {d.bounds.min} / max {d.bounds.max}"
        if d.detail:
            facts["detail"] = d.detail
        alarm = d.trigger.removeprefix("alarm:") if d.trigger.startswith("alarm:") else None
        out.append(
            Notification(
                notification_id=notification_id(d.event_id, d.group, str(d.action), str(d.outcome)),
                kind="scaling",
                severity=severity,
                group=d.group,
                incident_key=scaling_incident_key(d.group),
                title=title,
                facts=facts,
                reason=d.reason,
                links=console_links(d.group, region, alarm),
                at=d.at,
                source=source,
            )
        )
    return out


def scaling_resolved(group: str, alarm_name: str, event_id: str, at: datetime, region: str) -> Notification:
    """The alarm that drove a group's scaling is back to OK: close its capacity incident."""
    return Notification(
        notification_id=notification_id(event_id, group, "resolved"),
        kind="scaling",
        severity=Severity.INFO,
        group=group,
        incident_key=scaling_incident_key(group),
        title=f"{group}: {alarm_name} is OK again",
        reason=f"alarm {alarm_name} returned to OK",
        links=console_links(group, region, alarm_name),
        state=IncidentState.RESOLVED,
        at=at,
        source="scaler",
    )
