"""How a decided change is carried out, for every controller (scaler, spot fallback, OOM guard), so that
a crash anywhere repeats nothing and loses nothing. Glue: the decision itself is made in `scaling.core`.

1. `execute`: refuse groups without the managed tag; take the lease and persist the decision as the
   group's intent (one conditional write); act; commit the cooldown mark, the fallback ledger and an
   outbox entry (one write). An error keeps the intent and frees the lease.
2. `act`: a group with an intent left by an invocation that died or failed is finished first, under
   the lease: within one tick of its decision (`defaults.INTENT_REPLAY_S`) the remaining victims are
   removed and desired set again (idempotent); older, it is decided again on what is read now (the
   fresh decision replaces it), never replayed. After MAX_INTENT_ATTEMPTS it is given up (committed as
   failed, cooldown kept) so one broken group cannot stall forever.
   Every removal, fresh or resumed, passes the last look first (`scaling.last_look`): a victim a fresh
   read finds not free is dropped and the intent rewritten before the call.
3. `record`: audit every decision, log it, count it, tell on-call about changes; then clear the outbox of
   what was told. An outbox left by a crash is flushed by the next invocation that reads the state.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.audit import AuditLog, Parked
from gpufleet.aws.busy_marks import BusyMarks
from gpufleet.aws.documents import DocStore
from gpufleet.aws.fleet import FleetActuator, FleetReader
from gpufleet.aws.marks import MarksFailed
from gpufleet.aws.queue import NotificationQueue, enqueue_or_log
from gpufleet.aws.state import StateStore
from gpufleet.domain import defaults
from gpufleet.domain.models import Action, Decision, GroupObservation, GroupState, Outcome, SkipReason
from gpufleet.domain.notification import Notification
from gpufleet.events import EventKind, InboundEvent, parse_for
from gpufleet.events.origin import Origin
from gpufleet.policy.fleet import Consolidation, FleetPolicy, GroupSettings
from gpufleet.scaling.last_look import count_rule_only
from gpufleet.scaling.notes import decision_notes, parked_note

MAX_INTENT_ATTEMPTS = 3
_OUTCOME_METRICS = {
    Outcome.APPLIED: "CapacityChanges",
    Outcome.DRY_RUN: "DryRunChanges",
    Outcome.SKIPPED_LEASE: "LeaseConflicts",
    Outcome.FAILED: "ActionFailures",
}
_SKIP_METRICS = {reason: "ScaleInBlocked" + reason.title().replace(" ", "").replace("-", "") for reason in SkipReason}


def request_token(event_id: str, group_key: str) -> str:
    """Stable per (event, group): a retried invocation repeats the same EKS update, not a new one."""
    return "gf-" + hashlib.sha256(f"{event_id}|{group_key}".encode()).hexdigest()[:40]


def untagged_reason(obs: GroupObservation) -> str | None:
    """Defence in depth beside the IAM condition: never change a group that lacks the managed tag."""
    if obs.tags.get(defaults.TAG_MANAGED) == defaults.TAG_MANAGED_VALUE:
        return None
    tag = f"{defaults.TAG_MANAGED}={defaults.TAG_MANAGED_VALUE}"
    return f"{obs.ref.key} is not tagged {tag}: gpufleet changes nothing on it"


def remaining(intent: Decision, obs: GroupObservation) -> Decision:
    """What is left of a change begun earlier: victims no longer in the group were already removed."""
    present = {i.instance_id for i in obs.instances if not i.lifecycle_state.startswith("Terminat")}
    return intent.model_copy(update={"victims": tuple(v for v in intent.victims if v in present)})


def happened(intent: Decision, obs: GroupObservation) -> Decision | None:
    """What of a change begun earlier the group shows done (its victims gone, or the count it set), as a
    decision of that alone; None when none of it shows."""
    present = {i.instance_id for i in obs.instances if not i.lifecycle_state.startswith("Terminat")}
    gone = tuple(v for v in intent.victims if v not in present)
    if gone:
        return intent.model_copy(update={"victims": gone, "desired": obs.desired})
    if not intent.victims and intent.desired != intent.current and obs.desired == intent.desired:
        return intent
    return None


@dataclass
class Executor:
    actuator: FleetActuator
    state: StateStore
    audit: AuditLog
    logger: Logger
    emf: Metrics
    queue: NotificationQueue | None = None
    region: str = "us-east-1"
    # Right before a removal call: the decision with the victims a fresh read finds not free dropped.
    last_look: Callable[[Decision, GroupObservation, datetime], Decision] = count_rule_only
    _committed: list[str] = field(default_factory=list, init=False)  # groups committed since the last record

    def begin_invocation(self) -> None:
        """A warm container reuses this object. Groups an invocation committed but never recorded (it
        raised first) are not the next one's to clear: their outboxes stay and the next read flushes them."""
        self._committed = []

    def execute(self, decision: Decision, obs: GroupObservation, state: GroupState) -> Decision:
        """Apply one decision under the group's lease; `state` is the one the decision was made on, so
        the lease also checks that nobody changed the group since (its version)."""
        if not decision.acts:
            return decision.model_copy(update={"outcome": Outcome.NOT_NEEDED})
        refused = untagged_reason(obs)
        if refused is not None:
            return decision.model_copy(update={"action": Action.HOLD, "outcome": Outcome.NOT_NEEDED, "detail": refused})
        if decision.dry_run:
            return decision.model_copy(
                update={"outcome": Outcome.DRY_RUN, "detail": "dry-run: would apply, changed nothing"}
            )
        owner = f"{decision.event_id}#{uuid.uuid4().hex[:8]}"
        if not self.state.begin(decision, owner, state.version):
            detail = "another invocation holds the group's lease or changed it since it was read"
            return decision.model_copy(update={"outcome": Outcome.SKIPPED_LEASE, "detail": detail})
        return self._carry_out(decision, obs, owner, "")

    def act(
        self, decision: Decision, obs: GroupObservation, state: GroupState, event_id: str, now: datetime
    ) -> Decision:
        """Finish the change a previous invocation began, else carry out `decision` (decided now)."""
        return self.resume(obs, state, event_id, now, decision) or self.execute(decision, obs, state)

    def resume(
        self, obs: GroupObservation, state: GroupState, event_id: str, now: datetime, fresh: Decision | None = None
    ) -> Decision | None:
        """Finish the change a previous invocation began (None when there is none). A change that removes
        capacity, begun more than a tick ago, is not replayed (`_decided_again`: `fresh`, decided on what
        was read now, takes its place); a raise or node marks alone are finished as they were decided."""
        intent = state.intent
        if intent is None:
            return None
        if state.leased_by_other(event_id, now):
            detail = f"a change begun by {intent.event_id} is still in progress"
            return intent.model_copy(update={"outcome": Outcome.SKIPPED_LEASE, "detail": detail})
        owner = f"{event_id}#{uuid.uuid4().hex[:8]}"
        if not self.state.take_over(intent.group, owner, event_id, now):
            return intent.model_copy(update={"outcome": Outcome.SKIPPED_LEASE, "detail": "lost the race to finish it"})
        if state.intent_attempts >= MAX_INTENT_ATTEMPTS:
            failed = intent.model_copy(
                update={"outcome": Outcome.FAILED, "detail": f"given up after {state.intent_attempts} attempts"}
            )
            if self.state.commit(owner, failed):
                self._committed.append(failed.group)
            return failed
        age = now - intent.at
        shrinks = bool(intent.victims) or intent.desired < intent.current  # replaying a raise or marks costs no work
        if fresh is not None and intent.raises_capacity and fresh.bounds and intent.desired > fresh.bounds.max:
            return self._decided_again(intent, fresh, obs, owner, int(age.total_seconds()))  # max lowered since
        if not shrinks or age < timedelta(seconds=defaults.INTENT_REPLAY_S):
            prefix = f"finished the change begun by {intent.event_id}: "
            return self._carry_out(remaining(intent, obs), obs, owner, prefix)
        return self._decided_again(intent, fresh, obs, owner, int(age.total_seconds()))

    def _decided_again(
        self, intent: Decision, fresh: Decision | None, obs: GroupObservation, owner: str, age_s: int
    ) -> Decision:
        """A change begun more than a tick ago is never replayed (its victims may have taken work since).
        What of it already happened is committed as done (audited, told, its cooldown kept) and the rest is
        left to the next tick's decision; if none of it happened, the fresh decision replaces it as the
        intent and is carried out (without one - a caller that decides after finishing - it is dropped)."""
        prefix = f"decided again, not replayed (the change begun by {intent.event_id} is {age_s} s old): "
        went = happened(intent, obs)
        if went is not None:
            detail = f"{prefix}finished as far as it went; the rest is left to the next tick"
            done = went.model_copy(update={"outcome": Outcome.APPLIED, "detail": detail})
            if self.state.commit(owner, done):
                self._committed.append(done.group)
            return done
        if fresh is None or fresh.dry_run:  # dry-run now: the old change is not finished, no new one made
            self.state.drop_intent(intent.group, owner)
            if fresh is not None:
                return fresh.model_copy(
                    update={"outcome": Outcome.DRY_RUN, "detail": prefix + "dry-run: changed nothing"}
                )
            held = {"action": Action.HOLD, "current": obs.desired, "desired": obs.desired, "victims": ()}
            detail = prefix + "dropped; the next read decides"
            return intent.model_copy(update=held | {"outcome": Outcome.NOT_NEEDED, "detail": detail})
        if fresh.acts and not self.state.replace_intent(owner, fresh):  # the intent before any call
            return fresh.model_copy(update={"outcome": Outcome.SKIPPED_LEASE, "detail": "lost the lease"})
        return self._carry_out(fresh, obs, owner, prefix)

    def _carry_out(self, decision: Decision, obs: GroupObservation, owner: str, prefix: str) -> Decision:
        """The last look, then the change (the intent rewritten first where the look kept a victim)."""
        try:
            looked = self.last_look(decision, obs, decision.at) if decision.changes_capacity else decision
        except Exception as exc:  # no fresh word on the victims: nothing removed now; the intent waits
            self.state.release(decision.group, owner)
            self.logger.exception("the last look could not read", extra={"group": decision.group})
            detail = f"{prefix}the last look before the call could not read: {type(exc).__name__}: {exc}"
            return decision.model_copy(update={"outcome": Outcome.FAILED, "detail": detail})
        if not looked.acts:  # nothing left to do: the intent goes, no cooldown starts
            self.state.drop_intent(decision.group, owner)
            detail = prefix + (looked.detail or "nothing to do")
            return looked.model_copy(update={"outcome": Outcome.NOT_NEEDED, "detail": detail})
        if looked != decision and not self.state.replace_intent(owner, looked):
            return looked.model_copy(
                update={"outcome": Outcome.SKIPPED_LEASE, "detail": "lost the lease before the call"}
            )
        decision = looked
        try:
            detail = self.actuator.apply(decision, obs, request_token(decision.event_id, decision.group))
        except MarksFailed as exc:  # the capacity change is made; marks are decided afresh next tick
            failed = decision.model_copy(update={"outcome": Outcome.FAILED, "detail": prefix + str(exc)})
            if self.state.commit(owner, failed):
                self._committed.append(failed.group)
            return failed
        except Exception as exc:  # any AWS failure: keep the intent (the next invocation finishes it)
            self.state.release(decision.group, owner)
            self.logger.exception("action failed; the next invocation finishes it", extra={"group": decision.group})
            return decision.model_copy(update={"outcome": Outcome.FAILED, "detail": f"{type(exc).__name__}: {exc}"})
        kept = f"; {decision.detail}" if decision.detail else ""  # what the last look kept
        done = decision.model_copy(update={"outcome": Outcome.APPLIED, "detail": prefix + detail + kept})
        if self.state.commit(owner, done):
            self._committed.append(done.group)
        else:
            self.logger.warning("the lease was taken over before the commit", extra={"group": decision.group})
        return done

    def record(
        self, decisions: Sequence[Decision], policy: FleetPolicy, extra: Sequence[Notification] = (), tell: bool = True
    ) -> bool:
        """Audit every decision, log one line each, count outcomes and scale-in skips once per call, tell
        on-call about changes (unless the caller tells in its own words: `tell=False`), then clear the
        outboxes of the changes recorded."""
        committed, self._committed = self._committed, []  # taken first: an error below leaves nothing stale
        parked = self.audit.record(decisions, policy.audit_ttl_days)
        outcomes = Counter(d.outcome for d in decisions)
        skipped: Counter[SkipReason] = Counter()
        for d in decisions:
            skipped.update(d.skipped)
            self.logger.info(
                f"{d.group}: {d.action} ({d.outcome}) {d.reason}",
                extra={"decision": d.model_dump(mode="json", exclude={"needs_instance_metrics"})},
            )
        if decisions:
            self.emf.add_metric(name="Decisions", unit=MetricUnit.Count, value=len(decisions))
        for outcome, metric in _OUTCOME_METRICS.items():
            if outcomes[outcome]:
                self.emf.add_metric(name=metric, unit=MetricUnit.Count, value=outcomes[outcome])
        for reason, n in skipped.items():
            self.emf.add_metric(name=_SKIP_METRICS[reason], unit=MetricUnit.Count, value=n)
        notes = (decision_notes(decisions, self.region, policy.notifications) if tell else []) + list(extra)
        told = enqueue_or_log(self.queue, notes + self._parked_notes(parked), self.logger, self.emf)
        for group in committed if told else ():  # not queued: the outbox stays for the next invocation
            self.state.clear_outbox(group, 1)
        return told

    def _parked_notes(self, parked: Sequence[Parked]) -> list[Notification]:
        """Count and tell: each parked record once (its notification id is the decision's)."""
        for p in parked:
            self.logger.error("decision record parked: DynamoDB refused it", extra={"group": p.group, "why": p.reason})
        if parked:
            self.emf.add_metric(name="ParkedRecords", unit=MetricUnit.Count, value=len(parked))
        return [parked_note(p.group, p.event_id, p.reason, p.at, self.region) for p in parked]

    def flush_outbox(self, group: str, state: GroupState, policy: FleetPolicy) -> None:
        """Changes a crashed invocation committed but never audited or told: do it now (the audit key
        and the notification ids are stable, so a repeat overwrites or folds, never doubles)."""
        if not state.outbox:
            return
        parked = self.audit.record(state.outbox, policy.audit_ttl_days)
        notes = decision_notes(state.outbox, self.region, policy.notifications) + self._parked_notes(parked)
        if enqueue_or_log(self.queue, notes, self.logger, self.emf):
            self.state.clear_outbox(group, len(state.outbox))


@dataclass(kw_only=True)
class ControlContext:
    """What every controller that may change capacity shares: the fleet reader, the state table, the
    execution path, the policy, logging/metrics and the notification queue."""

    fleet: FleetReader
    state: StateStore
    docs: DocStore
    executor: Executor
    load_policy: Callable[[], FleetPolicy]
    logger: Logger
    emf: Metrics
    region: str = "us-east-1"
    home: Origin = field(default_factory=Origin)  # events of another account or region are refused
    global_dry_run: bool = False
    busy_marks: BusyMarks | None = None  # the queue workers' busy marks (the scaler keeps them as protection)

    def begin(self, event: Any, function: str, accepts: Iterable[EventKind]) -> list[InboundEvent]:
        """The invocation's typed events, checked against the kinds `function` handles and this home
        (raises InvalidEvent before anything is read or changed); then the executor starts afresh."""
        events = parse_for(event, function, accepts, self.home)
        self.executor.begin_invocation()
        return events

    def dry(self, policy: FleetPolicy) -> bool:
        return self.global_dry_run or policy.dry_run

    def send(self, notes: Sequence[Notification]) -> bool:
        """False when the notifications could not be queued (the caller keeps what it needs to retell)."""
        return enqueue_or_log(self.executor.queue, notes, self.logger, self.emf)

    def managed(self, policy: FleetPolicy) -> list[tuple[GroupObservation, GroupSettings]]:
        """Every managed group (discovered by tag or named by a rule) with its settings."""
        found = []
        named = policy.explicit_groups()
        attrition = [
            r.key for r in named if (s := policy.settings_for(r, {})) and s.consolidate is Consolidation.ATTRITION
        ]
        for obs in self.fleet.observe(policy.discovery, named, attrition):
            settings = policy.settings_for(obs.ref, obs.tags)
            if settings is not None:
                found.append((obs, settings))
        return found

    def states(self, groups: Sequence[GroupObservation], policy: FleetPolicy) -> dict[str, GroupState]:
        """The groups' states, with any outbox a crashed invocation left flushed first."""
        states = self.state.load(obs.ref.key for obs in groups)
        for key, state in states.items():
            if state.outbox and state.intent is None:
                try:
                    self.executor.flush_outbox(key, state, policy)
                except Exception:  # this group's outbox waits for the next read; the others go on
                    self.logger.exception("outbox not flushed; the next invocation tries again", extra={"group": key})
                    self.emf.add_metric(name="OutboxFlushFailures", unit=MetricUnit.Count, value=1)
                    continue
                states[key] = state.model_copy(update={"outbox": ()})
        return states
