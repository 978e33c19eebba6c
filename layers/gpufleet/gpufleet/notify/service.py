"""The notifier's glue: queue message -> incident (conditional write) -> plan -> post -> complete.

Messages on the notification queue are a `Notification` (JSON) or `{"flush": "<incident key>"}`, a
delayed nudge the notifier sends itself when an incident's next post is due. A sweep on the schedule
repeats firing incidents and picks up anything a lost nudge left behind.

Time is bounded per invocation (`TimeBudget`, from the Lambda context): a Slack post may take what is
left, retries included, and once that is spent the records not started fail without being attempted, so
SQS redelivers only them, later, instead of the whole batch after a Lambda timeout.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.incidents import IncidentStore
from gpufleet.aws.queue import SQS_DELAY_MAX_S, NotificationQueue, SnsPublisher
from gpufleet.domain import defaults
from gpufleet.domain.errors import StoreRefused
from gpufleet.domain.incidents import Delivery, Incident, Plan, Silence
from gpufleet.domain.notification import Notification, Severity
from gpufleet.events import EventKind, parse_for
from gpufleet.events.queue import Flush, InvalidMessage, parse_message
from gpufleet.notify.incidents import (
    MAX_UNANSWERED,
    active_silence,
    begin_delivery,
    complete_delivery,
    fail_delivery,
    merge_notification,
    plan_delivery,
)
from gpufleet.notify.render import render_slack, render_sns
from gpufleet.notify.slack import (
    MIN_ATTEMPT_S,
    SlackFailed,
    SlackPoster,
    SlackRejected,
    SlackTimedOut,
    SlackUnconfirmed,
)
from gpufleet.policy.fleet import FleetPolicy
from gpufleet.policy.notify import Route

MAX_WRITE_CONFLICTS = 8
SILENCE_CACHE = timedelta(seconds=30)
# Held back from the invocation's remaining time: the record in hand stores its outcome and publishes a
# critical one to SNS, and the batch answer gets back, before Lambda's timeout (120 s: 110 s for posting).
TIME_RESERVE_S = 10.0


class DeliveryFailed(RuntimeError):
    """A post failed; the SQS record fails so the queue redelivers it (then the DLQ)."""


class Contention(RuntimeError):
    """Too many concurrent writers on one incident; the SQS record is retried."""


class OutOfTime(RuntimeError):
    """The invocation's time is spent: the record is not attempted and fails, so SQS redelivers it later."""


@dataclass(frozen=True)
class TimeBudget:
    """What is left of this invocation, read from the Lambda context (it reads the clock, not this code),
    less `reserve_s`. Without `remaining_ms` (a run outside Lambda) it is unbounded."""

    remaining_ms: Callable[[], int] | None = None
    reserve_s: float = TIME_RESERVE_S

    def left_s(self) -> float:
        return math.inf if self.remaining_ms is None else self.remaining_ms() / 1000 - self.reserve_s

    def spent(self) -> bool:
        """Too little left for one Slack attempt: a record started now could not post."""
        return self.left_s() < MIN_ATTEMPT_S


UNBOUNDED = TimeBudget()


@dataclass(frozen=True)
class SlackOutcome:
    thread_ts: str | None = None
    error: str | None = None  # failed or timed out: the redelivery retries it
    refused: bool = False  # Slack refused it: no retry can fix that
    unanswered: bool = False  # timed out or a 500/502/504: the post may have landed (one repeat, then held)


ACCEPTS = (EventKind.QUEUE_BATCH, EventKind.SWEEP)


@dataclass
class Notifier:
    store: IncidentStore
    queue: NotificationQueue
    sns: SnsPublisher | None
    slack: Callable[[], SlackPoster | None]  # built lazily from the secret (cached by Powertools)
    load_policy: Callable[[], FleetPolicy]
    logger: Logger
    emf: Metrics
    counts: Counter[str] = field(default_factory=Counter)
    _silences: tuple[datetime, list[Silence]] | None = None
    _channels: Channels = field(init=False)

    def __post_init__(self) -> None:
        self._channels = Channels(self.slack, self.sns, self.queue, self.logger, self._count)

    # ---- entry points ----

    def handle(
        self,
        event: Any,
        now: datetime,
        process_batch: Callable[[], dict[str, Any]],
        budget: TimeBudget = UNBOUNDED,
    ) -> dict[str, Any]:
        """The sweep schedule, or an SQS batch (each record through `handle_message`, by Powertools
        Batch in `process_batch`, so one failing record fails alone). Other events are rejected."""
        (first, *_) = parse_for(event, "notifier", ACCEPTS)
        if first.kind is EventKind.SWEEP:
            return {"sweep": self.sweep(now, budget)}
        response = process_batch()
        self._tell_out_of_time(budget)
        self.logger.info("batch done", extra={"outcomes": self.report()})
        return response

    def handle_message(self, body: str, now: datetime, budget: TimeBudget = UNBOUNDED) -> str:
        """One SQS record. Malformed: rejected to the DLQ, not raised. Post failures raise, and so does
        a record that finds the invocation's time spent (not attempted). One the state table refuses for
        good (ValidationException) is parked in the DLQ with the reason: it never blocks the batch."""
        if budget.spent():
            self._count("out-of-time")
            raise OutOfTime(f"not attempted: {max(budget.left_s(), 0.0):.1f} s left for posting")
        try:
            message = parse_message(body)
        except InvalidMessage as exc:
            self.logger.error("rejected notification message", extra={"error": str(exc), "body_chars": len(body or "")})
            self.queue.reject(body, str(exc))
            return self._count("rejected")
        try:
            return self._count(self._take(message, now, budget))
        except StoreRefused as exc:
            why = f"the state table refused its incident: {exc}"
            self.logger.error("notification parked in the DLQ", extra={"error": why})
            self.queue.reject(body, why[:1000])  # parked with the reason; the DLQ alarm tells, once
            return self._count("parked")

    def _take(self, message: Notification | Flush, now: datetime, budget: TimeBudget) -> str:
        policy = self.load_policy()
        self.logger.append_keys(incident=message if isinstance(message, Flush) else message.incident_key)
        if isinstance(message, Flush):
            return self.advance(message, now, policy)
        silence = active_silence(message, self._active_silences(now), now)
        if silence is not None:
            self.logger.info("silenced", extra={"silence": silence.silence_id, "title": message.title})
            return "silenced"
        return self.advance(message.incident_key, now, policy, message, budget)

    def sweep(self, now: datetime, budget: TimeBudget = UNBOUNDED) -> dict[str, int]:
        """Repeat firing incidents, finish stale deliveries, send posts whose nudge was lost. What finds
        the time spent waits for the next sweep."""
        policy = self.load_policy()
        outcomes: Counter[str] = Counter()
        for incident in self.store.all():
            plan = self._plan(incident, now, policy)
            if plan.delivery is None:  # not due, nor an attempt that died or failed
                continue
            if budget.spent():
                outcomes[self._count("out-of-time")] += 1
                continue
            try:
                outcomes[self.advance(incident.key, now, policy, budget=budget)] += 1
            except Exception as exc:  # one incident's failure never stops the sweep of the others
                self.logger.warning("sweep: delivery failed", extra={"incident": incident.key, "error": str(exc)})
                outcomes["failed"] += 1
        self._tell_out_of_time(budget)
        self._flush_metrics()
        return dict(outcomes)

    def _active_silences(self, now: datetime) -> list[Silence]:
        """Read at most every SILENCE_CACHE of `now`, not once per message of a batch."""
        if self._silences is None or not (self._silences[0] <= now < self._silences[0] + SILENCE_CACHE):
            self._silences = (now, self.store.silences(now))
        return [s for s in self._silences[1] if s.expires_at > now]

    # ---- the incident's state machine step ----

    def advance(
        self,
        key: str,
        now: datetime,
        policy: FleetPolicy,
        notification: Notification | None = None,
        budget: TimeBudget = UNBOUNDED,
    ) -> str:
        np = policy.notifications
        for _ in range(MAX_WRITE_CONFLICTS):
            current = self.store.get(key)
            incident = current
            changed = False
            if notification is not None:
                merged = merge_notification(current, notification, now, np.flap)
                # A duplicate still advances the incident: its first delivery may be the one to retry.
                incident, changed = (merged, True) if merged is not None else (current, False)
            if incident is None:
                return "unknown-incident"
            plan = self._plan(incident, now, policy)
            wake = None
            if plan.delivery is not None:
                incident = begin_delivery(incident, plan.delivery, now)
            elif plan.wake_at is not None and plan.wake_at != incident.wake_scheduled_at:
                if plan.wake_at - now <= timedelta(seconds=SQS_DELAY_MAX_S):
                    wake = plan.wake_at
                    incident = incident.model_copy(update={"wake_scheduled_at": wake})
            elif not changed:
                return "duplicate" if notification is not None else "nothing-due"
            stored = self.store.put(incident, current.version if current else None, now)
            if stored is None:
                continue
            if wake is not None:
                self.queue.schedule_flush(key, int((wake - now).total_seconds()) + 1)
            if plan.delivery is None:
                return "grouped" if changed else "scheduled"
            assert stored.in_flight is not None
            self._deliver(stored, stored.in_flight, now, policy, budget)
            return f"posted-{plan.delivery.occasion}"
        raise Contention(f"incident {key}: {MAX_WRITE_CONFLICTS} write conflicts in a row")

    def _plan(self, incident: Incident, now: datetime, policy: FleetPolicy) -> Plan:
        np = policy.notifications
        return plan_delivery(incident, now, np.grouping, np.flap)

    def _deliver(
        self, incident: Incident, delivery: Delivery, now: datetime, policy: FleetPolicy, budget: TimeBudget
    ) -> None:
        route = policy.notifications.route_for(delivery.severity, delivery.group, delivery.kind)
        done = set(incident.channels_done)
        sent, errors = self._channels.send(delivery, route, done, budget)
        if errors:
            failed = fail_delivery(incident, tuple(sorted(done)), now, unanswered=sent.unanswered)
            self.store.put(failed, incident.version, now)
            if sent.unanswered:
                tell_unanswered(self.logger, self._count, failed, policy)
            raise DeliveryFailed(f"{delivery.incident_key}: " + "; ".join(errors))
        self._complete(incident, delivery, now, sent.thread_ts)
        if done:
            self.logger.info(
                "posted",
                extra={"delivery": delivery.delivery_id, "occasion": delivery.occasion, "channels": sorted(done)},
            )

    def _complete(self, incident: Incident, delivery: Delivery, now: datetime, thread_ts: str | None) -> None:
        """Merges may land while posting: on a conflict, reload and complete the same delivery."""
        for _ in range(MAX_WRITE_CONFLICTS):
            if self.store.put(complete_delivery(incident, delivery, now, thread_ts), incident.version, now):
                return
            reloaded = self.store.get(incident.key)
            if reloaded is None or reloaded.in_flight is None or reloaded.in_flight.delivery_id != delivery.delivery_id:
                return  # another invocation completed it
            incident = reloaded
        raise Contention(f"incident {incident.key}: could not record the post")

    # ---- reporting ----

    def _tell_out_of_time(self, budget: TimeBudget) -> None:
        """One line per invocation that left work undone for lack of time (counted as out-of-time)."""
        if self.counts["out-of-time"]:
            self.logger.warning(
                "out of time: left for later, not attempted",
                extra={
                    "not_attempted": self.counts["out-of-time"],
                    "reserve_s": budget.reserve_s,
                    "why": "the invocation's time is spent (Slack slow or hanging?): SQS redelivers the records, "
                    "the next sweep takes the incidents",
                },
            )

    def _count(self, outcome: str) -> str:
        self.counts[outcome] += 1
        return outcome

    def _flush_metrics(self) -> None:
        for outcome, n in self.counts.items():
            self.emf.add_metric(name=f"Notifications_{outcome}", unit=MetricUnit.Count, value=n)
        self.counts.clear()

    def report(self) -> dict[str, Any]:
        summary = dict(self.counts)
        self._flush_metrics()
        return summary


@dataclass
class Channels:
    """Sends one delivery to Slack and SNS, each on its own: a channel done is skipped on a retry, and
    a failing one never makes the other post twice."""

    slack: Callable[[], SlackPoster | None]
    sns: SnsPublisher | None
    queue: NotificationQueue
    logger: Logger
    count: Callable[[str], str]

    def send(
        self, delivery: Delivery, route: Route, done: set[str], budget: TimeBudget
    ) -> tuple[SlackOutcome, list[str]]:
        """(what Slack did, the errors); the channels that took it are added to `done`."""
        slack = self.slack() if route.slack else None
        sent = SlackOutcome()
        if slack is not None and "slack" not in done:
            sent = self._post_slack(slack, delivery, route, budget)
            if sent.error is None:
                done.add("slack")
        # Critical notifications reach SNS even when their route is Slack-only and Slack is down or refused.
        slack_lost = sent.error is not None or sent.refused
        wants_sns = route.sns or (slack_lost and delivery.severity is Severity.CRITICAL)
        sns_error: str | None = None
        if self.sns is not None and wants_sns and "sns" not in done:
            try:
                self.sns.publish(*render_sns(delivery))
                done.add("sns")
                self.count("sns-publishes")
            except Exception as exc:  # per channel: a failing SNS never makes Slack post twice
                sns_error = f"SNS publish failed: {type(exc).__name__}"
                self.count("sns-failures")
        errors = [e for e in (sent.error, sns_error) if e]
        if not errors and not done:  # loud: a route that leads nowhere is a configuration mistake
            self.count("undeliverable")
            why = _nowhere(route, slack is not None, self.sns is not None)
            self.logger.warning("delivered nowhere", extra={"delivery": delivery.delivery_id, "why": why})
        return sent, errors

    def _post_slack(self, slack: SlackPoster, delivery: Delivery, route: Route, budget: TimeBudget) -> SlackOutcome:
        """Within what is left of the invocation. Refused: the payload goes to the DLQ with the reason and
        counts as done (no retry can fix it). Failed or timed out: the redelivery retries it."""
        try:
            thread_ts = slack.post(
                render_slack(delivery),
                channel=route.slack_channel,
                thread_ts=delivery.thread_ts,
                within_s=budget.left_s(),
            )
        except SlackRejected as exc:
            self.queue.reject(json.dumps(render_slack(delivery)), f"Slack rejected the post: {exc}")
            self.logger.error("Slack rejected a post; sent to the DLQ", extra={"error": str(exc)})
            self.count("slack-rejected")
            return SlackOutcome(refused=True)
        except SlackFailed as exc:
            self.count("slack-failures")
            if isinstance(exc, SlackTimedOut):
                self.count("slack-timeouts")
            elif isinstance(exc, SlackUnconfirmed):
                self.count("slack-unconfirmed")
            return SlackOutcome(error=str(exc), unanswered=isinstance(exc, SlackUnconfirmed))
        self.count("slack-posts")
        return SlackOutcome(thread_ts=thread_ts)


def tell_unanswered(logger: Logger, count: Callable[[str], str], incident: Incident, policy: FleetPolicy) -> None:
    """One line per post Slack did not confirm (no answer in time, or a 500/502/504): what happens to it
    next (repeated once, then held)."""
    assert incident.in_flight is not None
    held = incident.in_flight.unanswered >= MAX_UNANSWERED
    if held:
        count("slack-held")
    repeat_s = policy.notifications.grouping.repeat_interval_s
    logger.warning(
        "Slack did not confirm the post; it may have landed",
        extra={
            "delivery": incident.in_flight.delivery_id,
            "unanswered": incident.in_flight.unanswered,
            "next": f"held: repeated after {repeat_s} s, or sooner with the next change"
            if held
            else "repeated once, marked as a possible duplicate",
        },
    )


def _nowhere(route: Route, has_slack: bool, has_sns: bool) -> str:
    why = []
    if route.slack and not has_slack:
        why.append(f"the route wants Slack but no Slack secret is configured ({defaults.ENV_SLACK_SECRET})")
    if route.sns and not has_sns:
        why.append(f"the route wants SNS but no topic is configured ({defaults.ENV_NOTIFY_TOPIC_ARN})")
    if not route.slack and not route.sns:
        why.append("the route turns both Slack and SNS off")
    return "; ".join(why) or "no channel"
