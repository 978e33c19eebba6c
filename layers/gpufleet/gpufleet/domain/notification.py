"""What producers (scaler, oom_guard, spot_watch) tell on-call: one `Notification` per fact.

The notifier folds notifications with the same incident key into one incident (`notify.incidents`) and
decides what is actually posted. `note()` is the one way producers build them: it fills the stable id,
the console links and clips every field to the sizes the queue, Slack and SNS accept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from urllib.parse import quote

from pydantic import Field

from gpufleet.domain.keys import bounded
from gpufleet.domain.kinds import traits
from gpufleet.domain.models import Frozen, GroupRef
from gpufleet.domain.values import Name, Timestamp

# Sizes a notification may have; `note()` clips to them and the notifier rejects anything larger.
MAX_TITLE = 300
MAX_REASON = 3000
MAX_FACTS = 20
MAX_FACT_NAME = 100
MAX_FACT_VALUE = 1000
MAX_LINKS = 5
MAX_LINK_TITLE = 75
MAX_URL = 3000
MAX_INCIDENT_KEY_BYTES = 400  # long keys end in a digest (domain.keys): distinct groups never share one


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self]


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


def worst(*severities: Severity) -> Severity:
    return max(severities, key=lambda s: s.rank)


class IncidentState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class NotificationKind(StrEnum):
    """What a notification is about; silences and routes match on it (`gpufleet silence --kind`)."""

    SCALING = "scaling"  # capacity changes, would-be changes (dry-run), failed changes
    SPOT = "spot"  # failed launches, the on-demand fallback and its hand-back
    OOM = "oom"  # a GPU at risk of running out of memory
    GPU_HEALTH = "gpu-health"  # XID, ECC, remapped rows, lost GPUs; replacements
    INTERRUPTION = "interruption"  # spot interruption warnings and rebalance recommendations
    RESERVATION = "reservation"  # Capacity Blocks / capacity reservations ending
    CONTROL = "control"  # gpufleet itself: another controller fighting it, a policy it cannot use


class Link(Frozen):
    title: Name = Field(min_length=1, max_length=MAX_LINK_TITLE)
    url: Name = Field(min_length=1, max_length=MAX_URL)


class Notification(Frozen):
    """One message on the notification queue. `notification_id` is stable per fact, so a producer's
    retry or a duplicate SQS delivery folds into the incident once."""

    notification_id: Name = Field(min_length=1, max_length=200)
    kind: NotificationKind
    severity: Severity
    group: Name = Field(min_length=1, max_length=300)
    incident_key: Name = Field(min_length=1, max_length=MAX_INCIDENT_KEY_BYTES)
    title: Name = Field(min_length=1, max_length=MAX_TITLE)
    facts: dict[Name, Name] = Field(default_factory=dict, max_length=MAX_FACTS)
    reason: Name = Field(default="", max_length=MAX_REASON)
    links: tuple[Link, ...] = Field(default=(), max_length=MAX_LINKS)
    state: IncidentState = IncidentState.FIRING
    at: Timestamp  # aware, 1970-2100: an incident sorts and expires by it
    source: Name = Field(default="", max_length=64)  # producing function, for the audit trail


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def notification_id(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


def capacity_incident_key(group: str) -> str:
    """One incident per group for its capacity story: scale-out, failed launches, fallback, recovery."""
    return f"{group}|capacity"


def note(
    kind: NotificationKind,
    severity: Severity,
    group: str,
    title: str,
    *,
    at: datetime,
    source: str,
    id_parts: tuple[str, ...],
    reason: str = "",
    facts: Mapping[str, str] | None = None,
    incident_key: str | None = None,
    links: tuple[Link, ...] | None = None,
    resolved: bool = False,
    region: str = "us-east-1",
) -> Notification:
    """The one notification builder: stable id from `id_parts`, the group's capacity incident unless
    another key is given, console links for the group, every field clipped to its limit."""
    kept = list((facts or {}).items())[:MAX_FACTS]
    return Notification(
        notification_id=notification_id(*id_parts),
        kind=kind,
        severity=severity,
        group=clip(group, 300),
        incident_key=bounded(incident_key or capacity_incident_key(group), MAX_INCIDENT_KEY_BYTES),
        title=clip(title, MAX_TITLE),
        facts={clip(k, MAX_FACT_NAME): clip(v, MAX_FACT_VALUE) for k, v in kept},
        reason=clip(reason, MAX_REASON),
        links=(links if links is not None else console_links(group, region))[:MAX_LINKS],
        state=IncidentState.RESOLVED if resolved else IncidentState.FIRING,
        at=at,
        source=source,
    )


# ---- links a tired on-call engineer can click ----


def link(title: str, url: str) -> Link | None:
    """A button on the post; None for a URL too long for Slack (a cut URL would lead nowhere)."""
    return Link(title=clip(title, MAX_LINK_TITLE), url=url) if 0 < len(url) <= MAX_URL else None


def console_links(group: str, region: str, alarm_name: str | None = None) -> tuple[Link, ...]:
    base = f"https://{region}.console.aws.amazon.com"
    try:
        ref: GroupRef | None = GroupRef.parse_key(group)
    except ValueError:
        ref = None
    found = []
    if ref is not None:
        row = traits(ref.kind)
        path = row.console_path.format(region=region, cluster=quote(ref.cluster or ""), name=quote(ref.name))
        found.append(link(row.console_title, base + path))
    if alarm_name:
        found.append(
            link("CloudWatch alarm", f"{base}/cloudwatch/home?region={region}#alarmsV2:alarm/{quote(alarm_name)}")
        )
    return tuple(x for x in found if x is not None)
