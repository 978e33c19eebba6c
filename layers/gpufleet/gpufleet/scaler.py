"""The scaler's glue: parse -> load state -> decide -> act -> record. No rules live here.

`Scaler.handle` takes a raw Lambda event and `now`; the handler passes the real clock, the
rehearsal a simulated one. Every decision, acted or not, is logged, counted and audited.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.fleet import FleetActuator, FleetReader
from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.aws.outbox import NotificationQueue, enqueue_or_log
from gpufleet.aws.state import StateStore
from gpufleet.decide import decide_alarm, decide_reconcile, decide_request
from gpufleet.fleet_policy import FleetPolicy, GroupSettings
from gpufleet.models import (
    Action,
    AlarmState,
    AlarmTrigger,
    Decision,
    Direction,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    Outcome,
    ReconcileTick,
    TriggerEvent,
)
from gpufleet.notifications import Notification, notifications_for_decisions, scaling_resolved
from gpufleet.targets import resolve_alarm_target
from gpufleet.triggers import parse_trigger_events, reconcile_alarm_trigger

UNRESOLVED_GROUP = "unresolved"


class ActionFailed(RuntimeError):
    """An alarm-driven change failed after boto3's retries; raised so Lambda retries, then DLQs."""


def request_token(event_id: str, group_key: str) -> str:
    """Stable per (event, group): a retried invocation repeats the same EKS update, not a new one."""
    return "gf-" + hashlib.sha256(f"{event_id}|{group_key}".encode()).hexdigest()[:40]


@dataclass
class Scaler:
    fleet: FleetReader
    actuator: FleetActuator
    metrics: GpuMetricsReader
    alarms: AlarmReader
    state: StateStore
    load_policy: Callable[[], FleetPolicy]
    logger: Logger
    emf: Metrics
    global_dry_run: bool = False
    # Wraps `process` with Powertools Idempotency keyed on the trigger's event id (None: off).
    idempotent: Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]] | None = None
    outbox: NotificationQueue | None = None
    region: str = "us-east-1"
    _process: Callable[..., dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self._process = self.idempotent(self.process) if self.idempotent else self.process

    def handle(self, event: Any, now: datetime) -> dict[str, Any]:
        """Raises InvalidEvent / PolicyError before anything is read or changed."""
        triggers = parse_trigger_events(event)
        policy = self.load_policy()
        results = []
        for trigger in triggers:
            self.logger.set_correlation_id(trigger.event_id)
            results.append(self._process(trigger=trigger, policy=policy, now=now))
        return {"results": results}

    def process(self, *, trigger: TriggerEvent, policy: FleetPolicy, now: datetime) -> dict[str, Any]:
        if isinstance(trigger, ReconcileTick):
            decisions = self.reconcile(trigger, policy, now)
        else:
            decisions = [self.on_alarm(trigger, policy, now)]
        self.state.record(decisions, policy.audit_ttl_days)
        self._report(decisions)
        self._notify(trigger, decisions, policy)
        failed = [d for d in decisions if d.outcome is Outcome.FAILED]
        if failed and isinstance(trigger, AlarmTrigger):
            raise ActionFailed("; ".join(f"{d.group}: {d.detail}" for d in failed))
        return {
            "event_id": trigger.event_id,
            "kind": trigger.kind,
            "decisions": [d.model_dump(mode="json", exclude={"bounds", "needs_instance_metrics"}) for d in decisions],
        }

    # ---- alarm path ----

    def on_alarm(self, trigger: AlarmTrigger, policy: FleetPolicy, now: datetime) -> Decision:
        target = resolve_alarm_target(trigger, self.alarms.tags(trigger.alarm_arn), policy)

        def no_action(group: str, reason: str) -> Decision:
            return Decision(
                group=group,
                action=Action.HOLD,
                current=0,
                desired=0,
                reason=reason,
                trigger=f"alarm:{trigger.alarm_name}",
                event_id=trigger.event_id,
                at=now,
                outcome=Outcome.NOT_NEEDED,
            )

        if target.group is None or target.direction is None:
            group = target.group.key if target.group else UNRESOLVED_GROUP
            return no_action(group, f"alarm {trigger.alarm_name} ({trigger.state}): no action, {target.found_by}")
        obs = self.fleet.observe_one(target.group)
        if obs is None:
            return no_action(target.group.key, f"alarm {trigger.alarm_name}: group {target.group.key} not found")
        settings = policy.settings_for(obs.ref, obs.tags)
        if settings is None:
            return no_action(
                obs.ref.key,
                f"alarm {trigger.alarm_name}: group {obs.ref.key} is not managed (not tagged "
                f"{policy.discovery.tag_key}={policy.discovery.tag_value} and no policy rule matches)",
            )
        state = self.state.load([obs.ref.key])[obs.ref.key]
        if trigger.state is AlarmState.ALARM and target.direction is Direction.IN:
            obs = self.with_instance_metrics([obs], now, policy)[0]
        decision = decide_alarm(
            obs,
            settings,
            state,
            now,
            event_id=trigger.event_id,
            alarm_name=trigger.alarm_name,
            alarm_state=trigger.state,
            direction=target.direction,
            global_dry_run=self._dry(policy),
        )
        decision = decision.model_copy(update={"reason": f"{decision.reason} [{target.found_by}]"})
        return self._execute(decision, obs, state)

    # ---- requests from other controllers ----

    def request(
        self, group: GroupRef, direction: Direction, trigger: str, why: str, now: datetime, event_id: str
    ) -> Decision:
        """A scale step asked for by another controller (the OOM guard's memory pressure), decided and
        acted on exactly like an alarm: bounds, windows, cooldowns, lease, dry-run, audit, notification."""
        policy = self.load_policy()
        obs = self.fleet.observe_one(group)
        settings = policy.settings_for(obs.ref, obs.tags) if obs is not None else None
        if obs is None or settings is None:
            decision = Decision(
                group=group.key,
                action=Action.HOLD,
                current=0,
                desired=0,
                reason=f"{why}, but {group.key} is not a managed group",
                trigger=trigger,
                event_id=event_id,
                at=now,
                outcome=Outcome.NOT_NEEDED,
            )
        else:
            state = self.state.load([obs.ref.key])[obs.ref.key]
            decided = decide_request(
                obs,
                settings,
                state,
                now,
                event_id=event_id,
                direction=direction,
                trigger=trigger,
                why=why,
                global_dry_run=self._dry(policy),
            )
            decision = self._execute(decided, obs, state)
        self.state.record([decision], policy.audit_ttl_days)
        self._report([decision])
        self._notify(ReconcileTick(event_id=event_id, source="manual", at=now), [decision], policy)
        return decision

    def apply_external(
        self, decision: Decision, obs: GroupObservation, policy: FleetPolicy, state: GroupState
    ) -> Decision:
        """A change decided by another controller (spot_watch's fallback) executed like the scaler's own:
        the group's lease and version, dry-run, audit, logs and metrics. It tells on-call itself. `state`
        is the one the decision was made on, so the lease checks the same version the cooldown saw."""
        done = self._execute(decision, obs, state)
        self.state.record([done], policy.audit_ttl_days)
        self._report([done])
        return done

    # ---- reconcile path ----

    def reconcile(self, tick: ReconcileTick, policy: FleetPolicy, now: datetime) -> list[Decision]:
        observed = self.fleet.observe(policy.discovery, policy.explicit_groups())
        managed: list[tuple[GroupObservation, GroupSettings]] = []
        for obs in observed:
            settings = policy.settings_for(obs.ref, obs.tags)
            if settings is not None:
                managed.append((obs, settings))
        if not managed:
            return []
        states = self.state.load(obs.ref.key for obs, _ in managed)
        tracked = [obs.ref for obs, s in managed if s.target.enabled]
        utils = self.metrics.group_utilization(tracked, now, policy.metric_lookback_s) if tracked else {}
        firing = self._firing_alarms(tick, policy)

        def decide(obs: GroupObservation, settings: GroupSettings) -> Decision:
            return decide_reconcile(
                obs,
                settings,
                states[obs.ref.key],
                now,
                event_id=tick.event_id,
                firing_alarms=firing.get(obs.ref.key, ()),
                global_dry_run=self._dry(policy),
            )

        pairs = [(obs.model_copy(update={"gpu_utilization": utils.get(obs.ref.key)}), s) for obs, s in managed]
        first = [decide(obs, s) for obs, s in pairs]
        want = [i for i, d in enumerate(first) if d.needs_instance_metrics]
        if want:
            enriched = self.with_instance_metrics([pairs[i][0] for i in want], now, policy)
            for i, obs in zip(want, enriched, strict=True):
                pairs[i] = (obs, pairs[i][1])
                first[i] = decide(obs, pairs[i][1])
        return [self._execute(d, obs, states[obs.ref.key]) for d, (obs, _) in zip(first, pairs, strict=True)]

    def _firing_alarms(self, tick: ReconcileTick, policy: FleetPolicy) -> dict[str, list[tuple[str, Direction]]]:
        """Alarms still in ALARM send no new event; the tick re-raises them (cooldowns decide)."""
        out: dict[str, list[tuple[str, Direction]]] = defaultdict(list)
        for alarm in self.alarms.firing(policy.alarm_prefix):
            trigger = reconcile_alarm_trigger(alarm, tick)
            target = resolve_alarm_target(trigger, self.alarms.tags(trigger.alarm_arn), policy)
            if target.group is not None and target.direction is not None:
                out[target.group.key].append((trigger.alarm_name, target.direction))
            else:
                self.logger.info("firing alarm ignored", extra={"alarm": trigger.alarm_name, "why": target.found_by})
        return out

    # ---- shared ----

    def _dry(self, policy: FleetPolicy) -> bool:
        return self.global_dry_run or policy.dry_run

    def with_instance_metrics(
        self, observations: list[GroupObservation], now: datetime, policy: FleetPolicy
    ) -> list[GroupObservation]:
        ids = [i.instance_id for obs in observations for i in obs.instances]
        gpu = self.metrics.instance_gpu(ids, now, policy.metric_lookback_s) if ids else {}

        def enrich(inst: InstanceObservation) -> InstanceObservation:
            util, mem = gpu.get(inst.instance_id, (None, None))
            return inst.model_copy(update={"gpu_utilization": util, "gpu_memory_percent": mem})

        return [
            obs.model_copy(
                update={"instances": tuple(enrich(i) for i in obs.instances), "instance_metrics_loaded": True}
            )
            for obs in observations
        ]

    def _execute(self, decision: Decision, obs: GroupObservation, state: GroupState) -> Decision:
        if not decision.changes_capacity:
            return decision.model_copy(update={"outcome": Outcome.NOT_NEEDED})
        if decision.dry_run:
            return decision.model_copy(
                update={"outcome": Outcome.DRY_RUN, "detail": "dry-run: would apply, changed nothing"}
            )
        owner = f"{decision.event_id}#{uuid.uuid4().hex[:8]}"
        if not self.state.acquire(decision.group, owner, state.version, decision.at):
            return decision.model_copy(
                update={
                    "outcome": Outcome.SKIPPED_LEASE,
                    "detail": "another invocation holds the group's lease or changed it since it was read",
                }
            )
        try:
            detail = self.actuator.apply(decision, obs, request_token(decision.event_id, decision.group))
        except Exception as exc:  # any AWS failure: free the lease, record, let the caller decide
            self.state.release(decision.group, owner)
            self.logger.exception("action failed", extra={"group": decision.group})
            return decision.model_copy(update={"outcome": Outcome.FAILED, "detail": f"{type(exc).__name__}: {exc}"})
        self.state.commit(decision.group, owner, decision)
        return decision.model_copy(update={"outcome": Outcome.APPLIED, "detail": detail})

    def _notify(self, trigger: TriggerEvent, decisions: list[Decision], policy: FleetPolicy) -> None:
        """Changes, dry-run would-be changes and failures go to on-call; an alarm back to OK closes
        the group's capacity incident. A queue outage never undoes or blocks a capacity decision:
        the notifications are logged in full and counted (NotificationsNotQueued alarm)."""
        if self.outbox is None:
            return
        out: list[Notification] = notifications_for_decisions(decisions, self.region, policy.notifications)
        if (
            isinstance(trigger, AlarmTrigger)
            and trigger.state is AlarmState.OK
            and trigger.previous_state is AlarmState.ALARM
        ):
            out += [
                scaling_resolved(d.group, trigger.alarm_name, trigger.event_id, d.at, self.region)
                for d in decisions
                if d.group != UNRESOLVED_GROUP and d.bounds is not None
            ]
        enqueue_or_log(self.outbox, out, self.logger, self.emf)

    def _report(self, decisions: list[Decision]) -> None:
        """One log line per decision; EMF counts once per invocation (not one datum per group)."""
        outcomes = Counter(d.outcome for d in decisions)
        for d in decisions:
            self.logger.info(
                f"{d.group}: {d.action} ({d.outcome}) {d.reason}",
                extra={"decision": d.model_dump(mode="json", exclude={"needs_instance_metrics"})},
            )
        self.emf.add_metric(name="Decisions", unit=MetricUnit.Count, value=len(decisions))
        for outcome, metric in _OUTCOME_METRICS.items():
            if outcomes[outcome]:
                self.emf.add_metric(name=metric, unit=MetricUnit.Count, value=outcomes[outcome])


_OUTCOME_METRICS = {
    Outcome.APPLIED: "CapacityChanges",
    Outcome.DRY_RUN: "DryRunChanges",
    Outcome.SKIPPED_LEASE: "LeaseConflicts",
    Outcome.FAILED: "ActionFailures",
}
