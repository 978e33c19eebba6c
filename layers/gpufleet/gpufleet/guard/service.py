"""The OOM guard's glue: read every managed GPU's memory and health counters (batched), forecast,
compare with what the group's guard state remembers, replace failed GPUs within the blast radius, tell
what changed, and ask the scaler for capacity under group-wide memory pressure. Rules live in
`guard.core`, notes in `guard.notes`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.documents import GUARD_SK
from gpufleet.aws.fleet import FleetActuator
from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.domain.models import Direction, GroupKind, GroupObservation, Trigger, TriggerKind
from gpufleet.domain.policy import FleetPolicy
from gpufleet.events import EventKind
from gpufleet.guard.core import (
    Forecast,
    GpuRef,
    GuardState,
    HealthFinding,
    Replacement,
    Risk,
    begin_replacements,
    choose_replacements,
    group_pressure,
    next_guard_state,
)
from gpufleet.guard.notes import GuardTeller, health_notes, risk_notes
from gpufleet.guard.screen import GpuScreen, gpu_keys
from gpufleet.notify.model import Notification
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.service import Scaler
from gpufleet_node import schema

INVENTORY_MAX_AGE = timedelta(minutes=15)
ACCEPTS = (EventKind.ALARM, EventKind.SCHEDULE)  # the memory alarms and the reconcile schedule
_HEALTH_METRICS = (
    ("xid_errors", schema.GPU_XID_ERRORS),
    ("ecc_double_bit", schema.GPU_ECC_DOUBLE_BIT),
    ("remapped_uncorrectable", schema.GPU_REMAPPED_ROWS_UNCORRECTABLE),
    ("lost", schema.GPU_LOST),
)


def _gpu_dims(g: GpuRef) -> tuple[tuple[str, str], ...]:
    return ((schema.DIM_INSTANCE_ID, g.instance_id), (schema.DIM_GPU_INDEX, str(g.gpu_index)))


@dataclass
class OomGuard:
    ctx: ControlContext
    scaler: Scaler
    actuator: FleetActuator
    metrics: GpuMetricsReader
    _gpu_inventory: tuple[datetime, list[tuple[str, int]]] | None = field(default=None, init=False)
    _no_gpu_data: set[str] = field(default_factory=set, init=False)

    def handle(self, event: Any, now: datetime) -> dict[str, Any]:
        """Any accepted event (schedule tick or memory alarm) runs one evaluation of the whole fleet."""
        events = self.ctx.begin(event, "oom_guard", ACCEPTS)
        return {"results": [self.evaluate(now, e.event_id) for e in events]}

    def evaluate(self, now: datetime, event_id: str) -> dict[str, Any]:
        policy = self.ctx.load_policy()
        managed = [obs for obs, _ in self.ctx.managed(policy)]
        memory = self.ctx.docs.load_docs([obs.ref.key for obs in managed], GUARD_SK, GuardState)
        forecasts, findings = GpuScreen(self.metrics).assess(managed, gpu_keys(memory.values()), now, policy)
        notes: list[Notification] = []
        replaced: list[Replacement] = []
        for obs in managed:
            try:
                group_notes, group_replaced = self._group(
                    obs, memory[obs.ref.key], forecasts, findings, now, event_id, policy
                )
            except Exception:  # one group's failure never stops the others; the next run retries it
                self.ctx.logger.exception("guard failed for a group", extra={"group": obs.ref.key})
                continue
            notes += group_notes
            replaced += group_replaced
        pressured = self._pressure(forecasts, managed, now, event_id, policy)
        self._report(forecasts, findings, replaced)
        return {
            "event_id": event_id,
            "gpus": len(forecasts),  # GPUs read in detail this run (the rest screened by aggregates)
            "at_risk": {f.gpu.key: f"{f.risk}: {f.reason}" for f in forecasts if f.risk is not Risk.OK},
            "unhealthy": {h.gpu.key: h.reason for h in findings},
            "replacements": [r.model_dump(mode="json") for r in replaced],
            "pressure": pressured,
            "notifications": len(notes),
        }

    def _group(
        self,
        obs: GroupObservation,
        before: GuardState,
        forecasts: Sequence[Forecast],
        findings: Sequence[HealthFinding],
        now: datetime,
        event_id: str,
        policy: FleetPolicy,
    ) -> tuple[list[Notification], list[Replacement]]:
        """One group, in the order that survives a crash anywhere: save the replacements about to be made
        (intent), make them (and retry any left pending), tell on-call, then save what is now known. A
        crash before the last save repeats the notes at most once and never counts a replacement twice."""
        key = obs.ref.key
        mine_f = [f for f in forecasts if f.gpu.group == key]
        mine_h = [h for h in findings if h.gpu.group == key]
        new = [h for h in mine_h if h.gpu.key not in before.unhealthy and h.gpu.instance_id not in before.pending]
        health = policy.guard.health
        choices = choose_replacements(
            new, {key: obs.in_service}, {key: obs.min_size}, {key: before.replacements}, now, health
        )
        dry = self.ctx.dry(policy)
        acting = [c.instance_id for c in choices if c.act and not dry]
        begun = begin_replacements(before, acting, now)
        if not self.ctx.docs.save_changes(key, GUARD_SK, before, begun):
            self.ctx.logger.warning("guard state changed concurrently; acting next run", extra={"group": key})
            return [], []
        begun = begun.model_copy(update={"version": before.version + 1}) if begun != before else before
        done, failed = self._replace_all(obs, choices, begun, dry)
        tell = GuardTeller(key, now, event_id, self.ctx.region)
        notes = risk_notes(tell, before, mine_f) + health_notes(tell, before, mine_h, done)
        after = next_guard_state(begun, mine_f, mine_h, failed)
        if not self.ctx.send(notes):  # not queued: remember nothing new, so the next run tells it again
            after = after.model_copy(update={"risks": begun.risks, "unhealthy": begun.unhealthy})
        if not self.ctx.docs.save_changes(key, GUARD_SK, begun, after):
            self.ctx.logger.warning("guard state changed concurrently after acting", extra={"group": key})
        return notes, done

    def _replace_all(
        self, obs: GroupObservation, choices: Sequence[Replacement], begun: GuardState, dry: bool
    ) -> tuple[list[Replacement], list[str]]:
        """Replace the chosen instances and retry those left pending; returns what was done and the
        instance ids whose call failed (they stay pending)."""
        done, failed = [], []
        retries = [iid for iid in begun.pending if iid not in {c.instance_id for c in choices}]
        todo = list(choices) + [
            Replacement(instance_id=iid, group=obs.ref.key, act=True, reason="unhealthy GPU: finish the replacement")
            for iid in retries
        ]
        for choice in todo:
            if not choice.act or dry:
                reason = f"dry-run: would {choice.reason}" if choice.act else choice.reason
                done.append(choice.model_copy(update={"act": False, "reason": reason}))
                continue
            try:
                if obs.ref.kind is GroupKind.EKS_NODEGROUP:
                    self.actuator.adopt_backing_asg(obs)
                result = self.actuator.mark_unhealthy(choice.instance_id)
                done.append(choice.model_copy(update={"reason": f"{choice.reason}: {result}"}))
            except Exception as exc:  # retried by the next run (pending), never counted twice
                self.ctx.logger.exception(
                    "replacement failed; retried next run", extra={"instance": choice.instance_id}
                )
                failed.append(choice.instance_id)
                done.append(
                    choice.model_copy(
                        update={
                            "act": False,
                            "reason": f"{choice.reason}: failed ({type(exc).__name__}), retried next run",
                        }
                    )
                )
        return done, failed

    def _pressure(
        self,
        forecasts: list[Forecast],
        managed: list[GroupObservation],
        now: datetime,
        event_id: str,
        policy: FleetPolicy,
    ) -> dict[str, str]:
        """Groups with `pressure_share` of their instances at risk ask the scaler for a step out."""
        if not policy.guard.memory.scale_out_on_pressure:
            return {}
        pressured = group_pressure(forecasts, {obs.ref.key: obs.in_service for obs in managed}, policy.guard.memory)
        refs = {obs.ref.key: obs.ref for obs in managed}
        for group_key, why in sorted(pressured.items()):
            self.scaler.request(refs[group_key], Direction.OUT, Trigger(kind=TriggerKind.OOM_GUARD), why, now, event_id)
        return pressured

    def _report(self, forecasts: list[Forecast], findings: list[HealthFinding], replaced: list[Replacement]) -> None:
        for f in forecasts:
            if f.risk is not Risk.OK:
                self.ctx.logger.warning(
                    f"{f.gpu.key}: {f.risk} {f.reason}", extra={"forecast": f.model_dump(mode="json")}
                )
        for h in findings:
            self.ctx.logger.error(h.reason, extra={"finding": h.model_dump(mode="json")})
        emf = self.ctx.emf
        emf.add_metric(name="GpusEvaluated", unit=MetricUnit.Count, value=len(forecasts))
        emf.add_metric(
            name="GpusAtMemoryRisk", unit=MetricUnit.Count, value=sum(f.risk is not Risk.OK for f in forecasts)
        )
        emf.add_metric(name="GpuHealthFindings", unit=MetricUnit.Count, value=len(findings))
        emf.add_metric(name="InstancesReplaced", unit=MetricUnit.Count, value=sum(r.act for r in replaced))
