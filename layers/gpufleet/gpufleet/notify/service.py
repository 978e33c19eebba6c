"""The notifier's glue: queue message -> incident (conditional write) -> plan -> post -> complete.

Messages on the notification queue are a `Notification` (JSON) or `{"flush": "<incident key>"}`, a
delayed nudge the notifier sends itself when an incident's next post is due. A sweep on the schedule
repeats firing incidents and picks up anything a lost nudge left behind.
"""

from __future__ import annotations

import json
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
from gpufleet.domain.policy import FleetPolicy
from gpufleet.events import EventKind, parse_for
from gpufleet.events.queue import Flush, InvalidMessage, parse_message
from gpufleet.notify.incidents import (
    Delivery,
    Incident,
    Plan,
    Silence,
    active_silence,
    begin_delivery,
    complete_delivery,
    fail_delivery,
    merge_notification,
    plan_delivery,
)
from gpufleet.notify.model import Notification, Severity
from gpufleet.notify.policy import Route
from gpufleet.notify.render import render_slack, render_sns
from gpufleet.notify.slack import SlackFailed, SlackPoster, SlackRejected

MAX_WRITE_CONFLICTS = 8
SILENCE_CACHE = timedelta(seconds=30)


class DeliveryFailed(RuntimeError):
    """A post failed; the SQS record fails so the queue redelivers it (then the DLQ)."""


class Contention(RuntimeError):
    """Too many concurrent writers on one incident; the SQS record is retried."""


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

    # ---- entry points ----

    def handle(self, event: Any, now: datetime, process_batch: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The sweep schedule, or an SQS batch (each record through `handle_message`, by Powertools
        Batch in `process_batch`, so one failing record fails alone). Other events are rejected."""
        (first, *_) = parse_for(event, "notifier", ACCEPTS)
        if first.kind is EventKind.SWEEP:
            return {"sweep": self.sweep(now)}
        response = process_batch()
        self.logger.info("batch done", extra={"outcomes": self.report()})
        return response

    def handle_message(self, body: str, now: datetime) -> str:
        """One SQS record. Malformed: rejected to the DLQ, not raised. Post failures raise."""
        try:
            message = parse_message(body)
        except InvalidMessage as exc:
            self.logger.error("rejected notification message", extra={"error": str(exc), "body_chars": len(body or "")})
            self.queue.reject(body, str(exc))
            return self._count("rejected")
        policy = self.load_policy()
        self.logger.append_keys(incident=message if isinstance(message, Flush) else message.incident_key)
        if isinstance(message, Flush):
            return self._count(self.advance(message, now, policy))
        silence = active_silence(message, self._active_silences(now), now)
        if silence is not None:
            self.logger.info("silenced", extra={"silence": silence.silence_id, "title": message.title})
            return self._count("silenced")
        return self._count(self.advance(message.incident_key, now, policy, message))

    def sweep(self, now: datetime) -> dict[str, int]:
        """Repeat firing incidents, finish stale deliveries, send posts whose nudge was lost."""
        policy = self.load_policy()
        outcomes: Counter[str] = Counter()
        for incident in self.store.all():
            plan = self._plan(incident, now, policy)
            if plan.delivery is not None:  # due, or an attempt that died or failed
                try:
                    outcomes[self.advance(incident.key, now, policy)] += 1
                except Exception as exc:  # one incident's failure never stops the sweep of the others
                    self.logger.warning("sweep: delivery failed", extra={"incident": incident.key, "error": str(exc)})
                    outcomes["failed"] += 1
        self._flush_metrics()
        return dict(outcomes)

    def _active_silences(self, now: datetime) -> list[Silence]:
        """Read at most every SILENCE_CACHE of `now`, not once per message of a batch."""
        if self._silences is None or not (self._silences[0] <= now < self._silences[0] + SILENCE_CACHE):
            self._silences = (now, self.store.silences(now))
        return [s for s in self._silences[1] if s.expires_at > now]

    # ---- the incident's state machine step ----

    def advance(self, key: str, now: datetime, policy: FleetPolicy, notification: Notification | None = None) -> str:
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
            self._deliver(stored, stored.in_flight, now, policy)
            return f"posted-{plan.delivery.occasion}"
        raise Contention(f"incident {key}: {MAX_WRITE_CONFLICTS} write conflicts in a row")

    def _plan(self, incident: Incident, now: datetime, policy: FleetPolicy) -> Plan:
        np = policy.notifications
        return plan_delivery(incident, now, np.grouping, np.flap)

    def _deliver(self, incident: Incident, delivery: Delivery, now: datetime, policy: FleetPolicy) -> None:
        route = policy.notifications.route_for(delivery.severity, delivery.group, delivery.kind)
        slack = self.slack() if route.slack else None
        done = set(incident.channels_done)
        thread_ts = None
        slack_error: str | None = None
        slack_refused = False
        if slack is not None and "slack" not in done:
            try:
                thread_ts = slack.post(
                    render_slack(delivery), channel=route.slack_channel, thread_ts=delivery.thread_ts
                )
                done.add("slack")
                self._count("slack-posts")
            except SlackRejected as exc:  # no retry can fix it: to the DLQ with the reason, the incident moves on
                self.queue.reject(json.dumps(render_slack(delivery)), f"Slack rejected the post: {exc}")
                self.logger.error("Slack rejected a post; sent to the DLQ", extra={"error": str(exc)})
                done.add("slack")
                slack_refused = True
                self._count("slack-rejected")
            except SlackFailed as exc:
                slack_error = str(exc)
                self._count("slack-failures")
        # Critical notifications reach SNS even when their route is Slack-only and Slack is down or refused.
        slack_lost = slack_error is not None or slack_refused
        wants_sns = route.sns or (slack_lost and delivery.severity is Severity.CRITICAL)
        sns_error: str | None = None
        if self.sns is not None and wants_sns and "sns" not in done:
            try:
                self.sns.publish(*render_sns(delivery))
                done.add("sns")
                self._count("sns-publishes")
            except Exception as exc:  # per channel: a failing SNS never makes Slack post twice
                sns_error = f"SNS publish failed: {type(exc).__name__}"
                self._count("sns-failures")
        errors = [e for e in (slack_error, sns_error) if e]
        if errors:
            self.store.put(fail_delivery(incident, tuple(sorted(done))), incident.version, now)
            raise DeliveryFailed(f"{delivery.incident_key}: " + "; ".join(errors))
        self._complete(incident, delivery, now, thread_ts)
        if not done:  # loud: a route that leads nowhere is a configuration mistake, not a quiet success
            self._count("undeliverable")
            self.logger.warning(
                "delivered nowhere", extra={"delivery": delivery.delivery_id, "why": self._nowhere(route, slack)}
            )
            return
        self.logger.info(
            "posted",
            extra={"delivery": delivery.delivery_id, "occasion": delivery.occasion, "channels": sorted(done)},
        )

    def _nowhere(self, route: Route, slack: SlackPoster | None) -> str:
        why = []
        if route.slack and slack is None:
            why.append(f"the route wants Slack but no Slack secret is configured ({defaults.ENV_SLACK_SECRET})")
        if route.sns and self.sns is None:
            why.append(f"the route wants SNS but no topic is configured ({defaults.ENV_NOTIFY_TOPIC_ARN})")
        if not route.slack and not route.sns:
            why.append("the route turns both Slack and SNS off")
        return "; ".join(why) or "no channel"

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
