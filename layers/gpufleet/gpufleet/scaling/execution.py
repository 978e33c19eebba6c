"""How a decided change is carried out, for every controller (scaler, spot fallback, OOM guard):
the group's lease, the change, the commit of its cooldown mark, the audit record, the log line and
the EMF counts. Glue: the decision itself is made in `scaling.core`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.fleet import FleetActuator, FleetReader
from gpufleet.aws.queue import NotificationQueue, enqueue_or_log
from gpufleet.aws.state import StateStore
from gpufleet.domain.models import Decision, GroupObservation, GroupState, Outcome, SkipReason
from gpufleet.domain.policy import FleetPolicy
from gpufleet.notify.model import Notification

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


@dataclass
class Executor:
    actuator: FleetActuator
    state: StateStore
    logger: Logger
    emf: Metrics

    def execute(self, decision: Decision, obs: GroupObservation, state: GroupState) -> Decision:
        """Apply one decision under the group's lease; `state` is the one the decision was made on, so
        the lease also checks that nobody changed the group since (its version)."""
        if not decision.changes_capacity:
            return decision.model_copy(update={"outcome": Outcome.NOT_NEEDED})
        if decision.dry_run:
            return decision.model_copy(
                update={"outcome": Outcome.DRY_RUN, "detail": "dry-run: would apply, changed nothing"}
            )
        owner = f"{decision.event_id}#{uuid.uuid4().hex[:8]}"
        if not self.state.acquire(decision.group, owner, state.version, decision.at):
            detail = "another invocation holds the group's lease or changed it since it was read"
            return decision.model_copy(update={"outcome": Outcome.SKIPPED_LEASE, "detail": detail})
        try:
            detail = self.actuator.apply(decision, obs, request_token(decision.event_id, decision.group))
        except Exception as exc:  # any AWS failure: free the lease, record, let the caller decide
            self.state.release(decision.group, owner)
            self.logger.exception("action failed", extra={"group": decision.group})
            return decision.model_copy(update={"outcome": Outcome.FAILED, "detail": f"{type(exc).__name__}: {exc}"})
        self.state.commit(decision.group, owner, decision)
        return decision.model_copy(update={"outcome": Outcome.APPLIED, "detail": detail})

    def record(self, decisions: Sequence[Decision], policy: FleetPolicy) -> None:
        """Audit every decision, log one line each, count outcomes and scale-in skips once per call."""
        self.state.record(decisions, policy.audit_ttl_days)
        outcomes = Counter(d.outcome for d in decisions)
        skipped: Counter[SkipReason] = Counter()
        for d in decisions:
            skipped.update(d.skipped)
            self.logger.info(
                f"{d.group}: {d.action} ({d.outcome}) {d.reason}",
                extra={"decision": d.model_dump(mode="json", exclude={"needs_instance_metrics"})},
            )
        self.emf.add_metric(name="Decisions", unit=MetricUnit.Count, value=len(decisions))
        for outcome, metric in _OUTCOME_METRICS.items():
            if outcomes[outcome]:
                self.emf.add_metric(name=metric, unit=MetricUnit.Count, value=outcomes[outcome])
        for reason, n in skipped.items():
            self.emf.add_metric(name=_SKIP_METRICS[reason], unit=MetricUnit.Count, value=n)


@dataclass(kw_only=True)
class ControlContext:
    """What every controller that may change capacity shares: the fleet reader, the state table, the
    execution path, the policy, logging/metrics and the notification queue."""

    fleet: FleetReader
    state: StateStore
    executor: Executor
    load_policy: Callable[[], FleetPolicy]
    logger: Logger
    emf: Metrics
    outbox: NotificationQueue | None = None
    region: str = "us-east-1"
    global_dry_run: bool = False

    def dry(self, policy: FleetPolicy) -> bool:
        return self.global_dry_run or policy.dry_run

    def send(self, notes: Sequence[Notification]) -> None:
        enqueue_or_log(self.outbox, notes, self.logger, self.emf)

    def managed(self, policy: FleetPolicy) -> list[tuple[GroupObservation, Any]]:
        """Every managed group (discovered by tag or named by a rule) with its settings."""
        found = []
        for obs in self.fleet.observe(policy.discovery, policy.explicit_groups()):
            settings = policy.settings_for(obs.ref, obs.tags)
            if settings is not None:
                found.append((obs, settings))
        return found
