"""Incident records: the story an incident tells, each post about it (its delivery), and silences.
Shared vocabulary of the notifier's core (`notify.incidents`, which folds and plans) and the store
(`aws.incidents`, which keeps them)."""

from __future__ import annotations

import fnmatch
from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import Field

from gpufleet.domain.models import Frozen
from gpufleet.domain.notification import IncidentState, Link, Notification, NotificationKind, Severity


class Occasion(StrEnum):
    NEW = "new"
    UPDATE = "update"
    REPEAT = "repeat"
    RESOLVED = "resolved"
    FLAPPING = "flapping"


class Update(Frozen):
    """One notification as it appears in a post's 'since the last message' list."""

    notification_id: str
    at: datetime
    severity: Severity
    state: IncidentState
    title: str
    reason: str = ""


class Story(Frozen):
    """What an incident, and each post about it, says: shared by notifications, incidents, deliveries."""

    group: str
    kind: NotificationKind
    severity: Severity
    state: IncidentState
    title: str
    reason: str = ""
    facts: dict[str, str] = Field(default_factory=dict)
    links: tuple[Link, ...] = ()


class Delivery(Story):
    delivery_id: str
    occasion: Occasion
    incident_key: str
    updates: tuple[Update, ...]
    dropped_updates: int = 0
    flips: int = 0
    opened_at: datetime
    created_at: datetime
    thread_ts: str | None = None  # Slack bot mode: the incident's thread
    attempts: int = 0
    # When an invocation started posting it; None once that attempt ended in an error. While another
    # invocation may still be posting, nobody re-posts (a merge arriving meanwhile only waits).
    posting_since: datetime | None = None
    # Attempts whose answer never came (Slack timed out, or the attempt died): each may have posted, so
    # a repeat says it may be a duplicate, and after MAX_UNANSWERED the delivery is held.
    unanswered: int = 0
    unanswered_at: datetime | None = None  # when the last of them ended


class Incident(Story):
    key: str
    opened_at: datetime
    updated_at: datetime
    last_sent_at: datetime | None = None
    last_sent_state: IncidentState | None = None
    last_flap_summary_at: datetime | None = None
    sent_count: int = 0
    pending: tuple[Update, ...] = ()
    dropped_updates: int = 0
    seen_ids: tuple[str, ...] = ()
    flips: tuple[datetime, ...] = ()
    thread_ts: str | None = None
    in_flight: Delivery | None = None
    channels_done: tuple[str, ...] = ()  # of the in-flight delivery, so a retry skips them
    open_kinds: dict[NotificationKind, Severity] = Field(default_factory=dict)  # kinds with a warning+ still firing
    wake_scheduled_at: datetime | None = None
    version: int = 0  # set by the store: the conditional-write token

    def flips_within(self, window_s: int, now: datetime) -> int:
        since = now - timedelta(seconds=window_s)
        return sum(1 for t in self.flips if t > since)


class Plan(Frozen):
    """What to post now (if anything) and when to look at the incident again (if ever)."""

    delivery: Delivery | None = None
    wake_at: datetime | None = None
    why: str


class Silence(Frozen):
    silence_id: str
    groups: tuple[str, ...] = ()  # globs over group keys; empty = any
    kinds: tuple[NotificationKind, ...] = ()
    severities: tuple[Severity, ...] = ()
    reason: str
    created_by: str = ""
    starts_at: datetime
    expires_at: datetime

    def covers(self, n: Notification, now: datetime) -> bool:
        return (
            self.starts_at <= now < self.expires_at
            and (not self.groups or any(fnmatch.fnmatchcase(n.group, g) for g in self.groups))
            and (not self.kinds or n.kind in self.kinds)
            and (not self.severities or n.severity in self.severities)
        )
