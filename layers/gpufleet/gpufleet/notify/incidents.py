"""Incidents: fold notifications into one story per incident key and decide what to post, and when.

Pure: every function takes the incident, the notification or `now`, and the policy, and returns new
values. The notifier stores incidents with conditional writes and posts the planned deliveries.

Delivery is two-phase so nothing is lost: `begin_delivery` stores the planned post as `in_flight`
before posting; `complete_delivery` clears it after. An error that sent nothing (a 5xx, a refused
connection) re-posts the same delivery on the next attempt, as often as it takes. An attempt whose answer
never came (Slack too slow, or the invocation died while posting) may have posted: it is counted in the
delivery (`unanswered`), repeated once at most, marked as a possible duplicate, and then held until the
incident's repeat interval, or its group interval when something new arrived (`plan_delivery`).
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta

from gpufleet.domain.incidents import Delivery, Incident, Occasion, Plan, Silence, Story, Update
from gpufleet.domain.notification import IncidentState, Notification, NotificationKind, Severity, worst
from gpufleet.policy.notify import FlapDamping, Grouping

MAX_PENDING_UPDATES = 20
MAX_SEEN_IDS = 200
POSTING_STALE_S = 150  # longer than the notifier's 120 s timeout: an attempt this old has died
# Unanswered attempts (each may have posted) before a delivery is held: the first post and one repeat.
MAX_UNANSWERED = 2


def _story(source: Story | Notification) -> dict[str, object]:
    return {name: getattr(source, name) for name in Story.model_fields}


def active_silence(n: Notification, silences: list[Silence], now: datetime) -> Silence | None:
    return next((s for s in silences if s.covers(n, now)), None)


def _update_of(n: Notification) -> Update:
    return Update(
        notification_id=n.notification_id, at=n.at, severity=n.severity, state=n.state, title=n.title, reason=n.reason
    )


def _fresh(n: Notification, now: datetime) -> Incident:
    """A resolved notification for an incident nobody was told about opens nothing worth posting."""
    return Incident(
        **_story(n),
        key=n.incident_key,
        opened_at=now,
        updated_at=now,
        pending=(_update_of(n),) if n.state is IncidentState.FIRING else (),
        seen_ids=(n.notification_id,),
        open_kinds={n.kind: n.severity} if n.state is IncidentState.FIRING and n.severity is not Severity.INFO else {},
    )


def _with_update(incident: Incident, n: Notification) -> dict[str, object]:
    """The pending list with `n` appended, the oldest dropped past MAX_PENDING_UPDATES and counted, so
    the next post can say how many earlier updates it does not show."""
    pending = (*incident.pending, _update_of(n))
    dropped = max(0, len(pending) - MAX_PENDING_UPDATES)
    return {"pending": pending[dropped:], "dropped_updates": incident.dropped_updates + dropped}


def _headline(n: Notification, incident: Incident) -> dict[str, object]:
    """The incident now reads like its latest notification (its kind included: a spot failure in the
    capacity thread is shown as spot, not as scaling)."""
    return {
        "title": n.title,
        "kind": n.kind,
        "reason": n.reason or incident.reason,
        "facts": dict(n.facts),  # the latest fact sheet; earlier ones are in the updates list
        "links": n.links or incident.links,
    }


def _starts_over(incident: Incident, n: Notification, now: datetime, flap: FlapDamping) -> bool:
    """An incident whose resolution was posted more than a flap window ago starts over (new thread)."""
    return (
        incident.state is IncidentState.RESOLVED
        and incident.last_sent_state is IncidentState.RESOLVED
        and incident.in_flight is None
        and n.state is IncidentState.FIRING
        and incident.last_sent_at is not None
        and now - incident.last_sent_at > timedelta(seconds=flap.window_s)
    )


def _open_kinds(incident: Incident, n: Notification) -> dict[NotificationKind, Severity]:
    """Kinds with a warning or worse still firing. Several producers share an incident (the capacity
    thread: scaler, spot_watch): a resolution closes only what its own kind opened."""
    kinds = dict(incident.open_kinds)
    if n.state is IncidentState.FIRING and n.severity is not Severity.INFO:
        kinds[n.kind] = worst(kinds.get(n.kind, Severity.INFO), n.severity)
    elif n.state is IncidentState.RESOLVED:
        kinds.pop(n.kind, None)
    return kinds


def _quiet_merge(incident: Incident, n: Notification, kinds: dict[NotificationKind, Severity]) -> Incident | None:
    """The cases that are not news: said already, an activity log continuing, a partial resolution,
    activity after a resolution. None when the notification is a real state change (see _fold)."""
    resolved, firing = IncidentState.RESOLVED, IncidentState.FIRING
    if n.state is resolved and incident.state is resolved and incident.last_sent_state is resolved:
        return incident  # said already
    if incident.severity is Severity.INFO and n.severity is Severity.INFO:
        # An activity log (e.g. scaling steps): its alarm clearing or firing again is not news and not
        # a flap; the next activity simply continues the same thread.
        if n.state is resolved:
            return incident.model_copy(update={"state": n.state})
        return _fold_info(incident.model_copy(update={"state": firing}), n, kinds)
    if n.state is resolved and kinds and incident.state is firing:
        # Another kind's warning is still open: the resolution is just an update.
        update = {**_with_update(incident, n), "severity": worst(*kinds.values()), "open_kinds": kinds}
        return incident.model_copy(update={**update, **_headline(n, incident)})  # its facts, not the last note's
    if n.state is firing and n.severity is Severity.INFO and incident.state is resolved and not kinds:
        if incident.last_sent_state is not resolved:
            return incident.model_copy(update=_with_update(incident, n))  # joins the resolving post
        # The resolution was posted: the activity log continues quietly (info: no repeats, not a flap).
        update = {**_with_update(incident, n), **_headline(n, incident), "open_kinds": kinds}
        return incident.model_copy(update={**update, "severity": Severity.INFO, "state": firing})
    return None


def _fold_info(incident: Incident, n: Notification, kinds: dict[NotificationKind, Severity]) -> Incident:
    update = {**_with_update(incident, n), **_headline(n, incident), "open_kinds": kinds}
    return incident.model_copy(update=update)


def _fold(
    incident: Incident, n: Notification, now: datetime, flap: FlapDamping, kinds: dict[NotificationKind, Severity]
) -> Incident:
    """A firing/resolved change or an escalation: the incident takes the notification's state, its
    worst severity while firing, and counts the flip for flap damping."""
    flipped = n.state is not incident.state
    window_start = now - timedelta(seconds=flap.window_s)
    flips = tuple(t for t in incident.flips if t > window_start) + ((now,) if flipped else ())
    if n.state is IncidentState.FIRING and incident.state is IncidentState.FIRING:
        severity = worst(incident.severity, n.severity)
    else:
        severity = n.severity if n.state is IncidentState.FIRING else incident.severity
    update = {**_with_update(incident, n), **_headline(n, incident), "severity": severity, "state": n.state}
    return incident.model_copy(update={**update, "flips": flips, "open_kinds": kinds})


def merge_notification(incident: Incident | None, n: Notification, now: datetime, flap: FlapDamping) -> Incident | None:
    """The incident with `n` folded in; None when `n` was already folded in (a duplicate delivery).

    A quick return to firing after a posted resolution is a flip of the same incident (flap damping
    counts it); after more than a flap window it starts a new story."""
    if incident is None:
        return _fresh(n, now)
    if n.notification_id in incident.seen_ids:
        return None
    if _starts_over(incident, n, now, flap):
        return _fresh(n, now).model_copy(update={"version": incident.version})  # same item, new story
    seen = (*incident.seen_ids, n.notification_id)[-MAX_SEEN_IDS:]
    incident = incident.model_copy(update={"seen_ids": seen, "updated_at": now})
    kinds = _open_kinds(incident, n)
    return _quiet_merge(incident, n, kinds) or _fold(incident, n, now, flap, kinds)


def _delivery(incident: Incident, occasion: Occasion, now: datetime) -> Delivery:
    seq = incident.sent_count + 1
    delivery_id = hashlib.sha256(f"{incident.key}|{incident.opened_at.isoformat()}|{seq}".encode()).hexdigest()[:24]
    return Delivery(
        **_story(incident),
        delivery_id=delivery_id,
        occasion=occasion,
        incident_key=incident.key,
        updates=incident.pending,
        dropped_updates=incident.dropped_updates,
        flips=len(incident.flips),
        opened_at=incident.opened_at,
        created_at=now,
        thread_ts=incident.thread_ts,
    )


def plan_delivery(incident: Incident, now: datetime, grouping: Grouping, flap: FlapDamping) -> Plan:
    """Grouping: the first post waits `group_wait_s` to collect what belongs together; later updates
    come at most every `group_interval_s`; a firing warning/critical incident with nothing new is
    repeated every `repeat_interval_s` (info activity is not); a flapping incident gets one summary
    per flap window. A delivery not confirmed yet goes first (`_plan_in_flight`)."""
    if incident.in_flight is not None:
        return _plan_in_flight(incident, incident.in_flight, now, grouping)
    flapping = incident.flips_within(flap.window_s, now) > flap.max_flips
    if incident.last_sent_at is None:
        if not incident.pending:
            return Plan(why="nothing to say")
        due = incident.opened_at + timedelta(seconds=grouping.group_wait_s)
        occasion = Occasion.RESOLVED if _resolution(incident) else Occasion.NEW
        if now < due:
            return Plan(wake_at=due, why=f"grouping: first post at {due:%H:%M:%S}")
        return Plan(delivery=_delivery(incident, occasion, now), why="group wait over")
    if incident.pending:
        due = incident.last_sent_at + timedelta(seconds=grouping.group_interval_s)
        if flapping:
            occasion = Occasion.FLAPPING
            if incident.last_flap_summary_at is not None:
                due = max(due, incident.last_flap_summary_at + timedelta(seconds=flap.window_s))
        elif _resolution(incident):
            occasion = Occasion.RESOLVED
        else:
            occasion = Occasion.UPDATE
        if now < due:
            return Plan(wake_at=due, why=f"pacing: next post at {due:%H:%M:%S}")
        return Plan(delivery=_delivery(incident, occasion, now), why=f"{occasion} due")
    if incident.state is IncidentState.FIRING and incident.severity is not Severity.INFO:
        due = incident.last_sent_at + timedelta(seconds=grouping.repeat_interval_s)
        if now < due:
            return Plan(wake_at=due, why=f"repeat at {due:%H:%M:%S} while firing")
        return Plan(delivery=_delivery(incident, Occasion.REPEAT, now), why="still firing: repeat")
    return Plan(why="resolved and posted")


def _resolution(incident: Incident) -> bool:
    return incident.state is IncidentState.RESOLVED and incident.severity is not Severity.INFO


def _plan_in_flight(incident: Incident, delivery: Delivery, now: datetime, grouping: Grouping) -> Plan:
    """A delivery not confirmed yet. While an attempt may still be running, nobody posts. An attempt
    that died counts as unanswered (its post may have landed). Below MAX_UNANSWERED the same delivery is
    re-posted now; from there it is held: repeated after the repeat interval, or after the group interval
    with what arrived since folded in, so a slow Slack costs one post per interval, not one per sweep.
    A critical incident waits the group interval only: a Slack that failed twice and then recovered must
    not keep a critical post back for hours (one marked post per group interval at most)."""
    since = delivery.posting_since
    if since is not None:
        if now - since < timedelta(seconds=POSTING_STALE_S):
            return Plan(wake_at=since + timedelta(seconds=POSTING_STALE_S), why="another invocation is posting it")
        delivery = _unanswered(delivery, since)
    if delivery.unanswered < MAX_UNANSWERED:
        return Plan(delivery=delivery, why="re-post the delivery whose answer was not confirmed")
    last = delivery.unanswered_at or now
    news = _news(incident, delivery)
    short = news or incident.severity is Severity.CRITICAL
    due = last + timedelta(seconds=grouping.group_interval_s if short else grouping.repeat_interval_s)
    if now < due:
        why = f"held until {due:%H:%M:%S}: Slack did not answer {delivery.unanswered} posts, the last may have landed"
        return Plan(wake_at=due, why=why)
    if news:
        return Plan(delivery=_refreshed(incident, delivery), why="held post: what arrived since is due")
    return Plan(delivery=delivery, why="held post: repeat interval over")


def _unanswered(delivery: Delivery, at: datetime) -> Delivery:
    return delivery.model_copy(
        update={"posting_since": None, "unanswered": delivery.unanswered + 1, "unanswered_at": at}
    )


def _news(incident: Incident, delivery: Delivery) -> bool:
    """Whether something was folded in after the delivery was planned (the pending list is only cleared
    once a post is confirmed, so it holds the delivery's own updates too)."""
    planned = {u.notification_id for u in delivery.updates}
    return any(u.notification_id not in planned for u in incident.pending)


def _refreshed(incident: Incident, delivery: Delivery) -> Delivery:
    """A held delivery with what arrived since: the incident as it reads now, every update not yet
    confirmed, the same id and the same count of unanswered attempts (so it is held again if Slack
    is still slow). A first post stays a first post: its thread may never have been opened."""
    if _resolution(incident):
        occasion = Occasion.RESOLVED
    elif delivery.occasion in (Occasion.NEW, Occasion.FLAPPING):
        occasion = delivery.occasion
    else:
        occasion = Occasion.UPDATE
    return delivery.model_copy(
        update={
            **_story(incident),
            "occasion": occasion,
            "updates": incident.pending,
            "dropped_updates": incident.dropped_updates,
            "flips": len(incident.flips),
            "thread_ts": incident.thread_ts,
        }
    )


def begin_delivery(incident: Incident, delivery: Delivery, now: datetime) -> Incident:
    attempt = delivery.model_copy(update={"attempts": delivery.attempts + 1, "posting_since": now})
    retry = incident.in_flight is not None and incident.in_flight.delivery_id == delivery.delivery_id
    return incident.model_copy(update={"in_flight": attempt, "channels_done": incident.channels_done if retry else ()})


def fail_delivery(
    incident: Incident, channels_done: tuple[str, ...], now: datetime, unanswered: bool = False
) -> Incident:
    """The attempt ended in an error: the next one skips the channels done. An error that sent nothing
    may be re-posted at once; an `unanswered` one (Slack timed out: the post may have landed) is
    counted, so `plan_delivery` repeats it once at most and then holds it."""
    assert incident.in_flight is not None
    ended = incident.in_flight.model_copy(update={"posting_since": None})
    if unanswered:
        ended = _unanswered(ended, now)
    return incident.model_copy(update={"in_flight": ended, "channels_done": channels_done})


def complete_delivery(incident: Incident, delivery: Delivery, now: datetime, thread_ts: str | None) -> Incident:
    """Drop the updates that were posted; updates merged while posting stay pending for the next post."""
    posted = {u.notification_id for u in delivery.updates}
    return incident.model_copy(
        update={
            "in_flight": None,
            "channels_done": (),
            "pending": tuple(u for u in incident.pending if u.notification_id not in posted),
            "dropped_updates": 0 if delivery.dropped_updates else incident.dropped_updates,
            "last_sent_at": now,
            "last_sent_state": delivery.state,
            "last_flap_summary_at": now if delivery.occasion is Occasion.FLAPPING else incident.last_flap_summary_at,
            "sent_count": incident.sent_count + 1,
            "thread_ts": incident.thread_ts or thread_ts,
        }
    )
