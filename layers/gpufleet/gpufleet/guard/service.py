"""The OOM guard's glue: read every managed GPU's memory and health counters (batched), forecast,
compare with what the group's guard state remembers, replace failed GPUs within the blast radius, tell
what changed, and ask the scaler for capacity under group-wide memory pressure. Rules live in
`guard.core`, notes in `guard.notes`.

Nodes that publish GPU metrics outside every managed group are forecast and checked too, and told about
as `unmanaged:<instance id>`; they are never replaced and never scaled for: gpufleet acts only on the
groups the policy gives it. What the guard remembers about all of them is one document (UNMANAGED_DOC).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.documents import GUARD_SK
from gpufleet.aws.fleet import FleetActuator
from gpufleet.aws.hyperpod import HYPERPOD_NOT_REPLACED
from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.domain.kinds import traits
from gpufleet.domain.models import Direction, GroupObservation, Trigger, TriggerKind
from gpufleet.domain.notification import Notification
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
    instance_of,
    next_guard_state,
)
from gpufleet.guard.hosts import HostScreening
from gpufleet.guard.notes import GuardTeller, health_notes, risk_notes
from gpufleet.guard.screen import GpuScreen, Outside, gpu_keys, is_unmanaged, list_publishers, unmanaged_group
from gpufleet.guard.witness import corroborate
from gpufleet.policy.fleet import FleetPolicy
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
UNMANAGED_DOC = "unmanaged"  # the guard's memory of every node outside managed groups (GROUP#unmanaged)
TOLD_ONLY = "not in a managed group: told only, never replaced"


def unmanaged_notes(
    before: GuardState,
    forecasts: Sequence[Forecast],
    findings: Sequence[HealthFinding],
    now: datetime,
    event_id: str,
    region: str,
) -> tuple[list[Notification], GuardState]:
    """What changed on nodes outside managed groups, one incident group per node, and the state after."""
    mine_f = [f for f in forecasts if is_unmanaged(f.gpu.group)]
    mine_h = [h for h in findings if is_unmanaged(h.gpu.group)]

    def group_of(gpu_key: str) -> str:
        return unmanaged_group(instance_of(gpu_key))

    groups = {f.gpu.group for f in mine_f} | {h.gpu.group for h in mine_h}
    groups |= {group_of(k) for k in (*before.risks, *before.unhealthy)}
    notes: list[Notification] = []
    for group in sorted(groups):
        part = before.model_copy(
            update={
                "risks": {k: v for k, v in before.risks.items() if group_of(k) == group},
                "unhealthy": {k: v for k, v in before.unhealthy.items() if group_of(k) == group},
            }
        )
        told = [
            Replacement(instance_id=iid, group=group, act=False, reason=TOLD_ONLY)
            for iid in sorted({h.gpu.instance_id for h in mine_h if h.gpu.group == group})
        ]
        tell = GuardTeller(group, now, event_id, region)
        notes += risk_notes(tell, part, [f for f in mine_f if f.gpu.group == group])
        notes += health_notes(tell, part, [h for h in mine_h if h.gpu.group == group], told)
    return notes, next_guard_state(before, mine_f, mine_h, ())


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
    host_screening: HostScreening = field(default_factory=HostScreening, init=False)  # this container's

    def handle(self, event: Any, now: datetime) -> dict[str, Any]:
        """Any accepted event (schedule tick or memory alarm) runs one evaluation of the whole fleet."""
        events = self.ctx.begin(event, "oom_guard", ACCEPTS)
        return {"results": [self.evaluate(now, e.event_id) for e in events]}

    def evaluate(self, now: datetime, event_id: str) -> dict[str, Any]:
        policy = self.ctx.load_policy()
        managed = [obs for obs, _ in self.ctx.managed(policy)]
        keys = [obs.ref.key for obs in managed] + ([UNMANAGED_DOC] if policy.guard.unmanaged_nodes else [])
        memory = self.ctx.docs.load_docs(keys, GUARD_SK, GuardState)
        outside = self._outside(memory.get(UNMANAGED_DOC), managed)
        forecasts, findings = GpuScreen(self.metrics, self.host_screening).assess(
            managed, gpu_keys(memory.values()), now, policy, outside
        )
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
        if outside is not None:
            try:
                notes += self._unmanaged(memory[UNMANAGED_DOC], forecasts, findings, now, event_id)
            except Exception:  # like a group's failure: the managed groups' run goes on, the next retries it
                self.ctx.logger.exception("guard failed for the nodes outside managed groups")
        managed_forecasts = [f for f in forecasts if not is_unmanaged(f.gpu.group)]
        pressured = self._pressure(managed_forecasts, managed, now, event_id, policy)
        _report(self.ctx, forecasts, findings, replaced)
        return {
            "event_id": event_id,
            "gpus": sum(not f.gpu.is_host for f in forecasts),  # GPUs read in detail (the rest screened)
            "hosts": sum(f.gpu.is_host for f in forecasts),  # hosts read on their own (the rest screened)
            "at_risk": {f.gpu.key: f"{f.risk}: {f.reason}" for f in forecasts if f.risk is not Risk.OK},
            "unhealthy": {h.gpu.key: h.reason for h in findings},
            "replacements": [r.model_dump(mode="json") for r in replaced],
            "pressure": pressured,
            "notifications": len(notes),
            "unmanaged": None if outside is None else len(outside.groups),  # None: not screened this run
        }

    def _outside(self, before: GuardState | None, managed: Sequence[GroupObservation]) -> Outside | None:
        """The nodes publishing outside managed groups, with those the guard already holds at risk or
        unhealthy (read again even before they are listed, so they never resolve by a listing's lag).
        None when switched off or the listing failed: nothing about them is told or forgotten this run."""
        if before is None:
            return None
        try:
            publishing, ill = list_publishers(self.metrics)
        except Exception:
            self.ctx.logger.exception("listing the nodes outside managed groups failed; retried next run")
            return None
        members = {i.instance_id for obs in managed for i in obs.instances}
        known = {instance_of(k) for k in gpu_keys([before])}
        ids = (publishing | known) - members
        return Outside(groups={iid: unmanaged_group(iid) for iid in sorted(ids)}, ill=frozenset(ill & ids))

    def _unmanaged(
        self,
        before: GuardState,
        forecasts: Sequence[Forecast],
        findings: Sequence[HealthFinding],
        now: datetime,
        event_id: str,
    ) -> list[Notification]:
        """Tell what changed on nodes outside managed groups, one incident group per node, then remember
        it (a crash in between repeats the notes at most once). Nothing is replaced or scaled."""
        notes, after = unmanaged_notes(before, forecasts, findings, now, event_id, self.ctx.region)
        if not self.ctx.send(notes):  # not queued: remember nothing new, so the next run tells it again
            after = before
        if not self.ctx.docs.save_changes(UNMANAGED_DOC, GUARD_SK, before, after):
            self.ctx.logger.warning("guard state of the nodes outside managed groups changed concurrently")
        return notes

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
        again = [h for h in mine_h if h not in new and h.gpu.instance_id in before.unconfirmed]  # held: look again
        health = policy.guard.health
        ready, held = corroborate(self.metrics.cloudwatch, key, new + again, now, health, self.ctx.logger)
        choices = choose_replacements(
            ready, {key: obs.in_service}, {key: obs.min_size}, {key: before.replacements}, now, health
        )
        choices += held
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
        after = next_guard_state(begun, mine_f, mine_h, failed, held)
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
            if not traits(obs.ref.kind).replaced_by_asg:  # told, never acted on: it recovers its own nodes
                done.append(
                    choice.model_copy(update={"act": False, "reason": f"{choice.reason}: {HYPERPOD_NOT_REPLACED}"})
                )
                continue
            try:
                result = self.actuator.replace_failed(obs, choice.instance_id)
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


def _report(
    ctx: ControlContext, forecasts: list[Forecast], findings: list[HealthFinding], replaced: list[Replacement]
) -> None:
    """Log each risk and finding, and count them in the guard's EMF metrics."""
    for f in forecasts:
        if f.risk is not Risk.OK:
            ctx.logger.warning(f"{f.gpu.key}: {f.risk} {f.reason}", extra={"forecast": f.model_dump(mode="json")})
    for h in findings:
        ctx.logger.error(h.reason, extra={"finding": h.model_dump(mode="json")})
    emf = ctx.emf
    at_risk = [f.gpu.is_host for f in forecasts if f.risk is not Risk.OK]
    emf.add_metric(name="GpusEvaluated", unit=MetricUnit.Count, value=sum(not f.gpu.is_host for f in forecasts))
    emf.add_metric(name="GpusAtMemoryRisk", unit=MetricUnit.Count, value=at_risk.count(False))
    emf.add_metric(name="HostsAtMemoryRisk", unit=MetricUnit.Count, value=at_risk.count(True))
    emf.add_metric(name="GpuHealthFindings", unit=MetricUnit.Count, value=len(findings))
    emf.add_metric(name="InstancesReplaced", unit=MetricUnit.Count, value=sum(r.act for r in replaced))
