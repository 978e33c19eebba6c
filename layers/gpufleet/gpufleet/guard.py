"""The OOM guard's glue: read every managed GPU's memory and health counters (batched), forecast,
compare with what the group's guard state remembers, notify changes, replace failed GPUs within the
blast radius, and ask the scaler for capacity under group-wide memory pressure. Rules live in
`gpufleet.oom`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.fleet import FleetActuator
from gpufleet.aws.metrics import GpuMetricsReader, SeriesQuery
from gpufleet.aws.state import GUARD_SK
from gpufleet.controller import Controller
from gpufleet.fleet_policy import FleetPolicy
from gpufleet.models import Direction, GuardState
from gpufleet.notifications import IncidentState, Link, Notification, Severity, console_links, notification_id
from gpufleet.oom import (
    Forecast,
    GpuRef,
    HealthCounts,
    HealthFinding,
    MemorySeries,
    Replacement,
    Risk,
    choose_replacements,
    forecast_gpu,
    group_pressure,
    health_findings,
)
from gpufleet.triggers import parse_trigger_events
from gpufleet_node import schema

INVENTORY_MAX_AGE = timedelta(minutes=15)
_HEALTH_METRICS = (
    ("xid_errors", schema.GPU_XID_ERRORS),
    ("ecc_double_bit", schema.GPU_ECC_DOUBLE_BIT),
    ("remapped_uncorrectable", schema.GPU_REMAPPED_ROWS_UNCORRECTABLE),
    ("lost", schema.GPU_LOST),
)


def _gpu_dims(g: GpuRef) -> tuple[tuple[str, str], ...]:
    return ((schema.DIM_INSTANCE_ID, g.instance_id), (schema.DIM_GPU_INDEX, str(g.gpu_index)))


def metric_link(region: str, gpu: GpuRef) -> Link:
    """The GPU's memory graph in the CloudWatch console."""
    source = (
        f'~(metrics~(~(~"{schema.NAMESPACE}~"{schema.GPU_MEMORY_USED.name}~"{schema.DIM_INSTANCE_ID}~"'
        f'{gpu.instance_id}~"{schema.DIM_GPU_INDEX}~"{gpu.gpu_index}))~period~60~stat~"Maximum)'
    )
    url = f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#metricsV2:graph={quote(source)}"
    return Link(title="GPU memory graph", url=url)


@dataclass(kw_only=True)
class OomGuard(Controller):
    actuator: FleetActuator
    metrics: GpuMetricsReader
    _gpu_inventory: tuple[datetime, list[tuple[str, int]]] | None = field(default=None, init=False)
    _no_gpu_data: set[str] = field(default_factory=set, init=False)

    def handle(self, event: Any, now: datetime) -> dict[str, Any]:
        """Any trigger (schedule tick or memory alarm) runs one evaluation of the whole managed fleet."""
        triggers = parse_trigger_events(event)
        results = [self.evaluate(now, t.event_id) for t in triggers]
        return {"results": results}

    def _inventory(self, managed_instances: set[str], now: datetime) -> list[tuple[str, int]]:
        """The fleet's GPUs (ListMetrics), kept between runs of a warm function: listed again only when a
        managed instance is unknown or the list is older than INVENTORY_MAX_AGE. A new node is not judged
        before it has a few minutes of data anyway, so this costs no detection time."""
        cached = self._gpu_inventory
        if cached is not None:
            listed_at, gpus = cached
            known = {iid for iid, _ in gpus}
            if now - listed_at < INVENTORY_MAX_AGE and managed_instances <= known | self._no_gpu_data:
                return gpus
        gpus = self.metrics.list_gpus()
        self._gpu_inventory = (now, gpus)
        self._no_gpu_data = managed_instances - {iid for iid, _ in gpus}
        return gpus

    def evaluate(self, now: datetime, event_id: str) -> dict[str, Any]:
        policy = self.load_policy()
        guard = policy.guard
        dry = self.global_dry_run or policy.dry_run
        managed = [
            obs
            for obs in self.fleet.observe(policy.discovery, policy.explicit_groups())
            if policy.settings_for(obs.ref, obs.tags) is not None
        ]
        group_of = {i.instance_id: obs.ref.key for obs in managed for i in obs.instances}
        inventory = self._inventory(set(group_of), now)
        gpus = [
            GpuRef(group=group_of[iid], instance_id=iid, gpu_index=idx) for iid, idx in inventory if iid in group_of
        ]
        forecasts, findings = self._assess(gpus, now, policy)
        notes: list[Notification] = []
        replaced: list[Replacement] = []
        by_group_f: dict[str, list[Forecast]] = defaultdict(list)
        by_group_h: dict[str, list[HealthFinding]] = defaultdict(list)
        for f in forecasts:
            by_group_f[f.gpu.group].append(f)
        for h in findings:
            by_group_h[h.gpu.group].append(h)
        memory = self.state.load_docs([obs.ref.key for obs in managed], GUARD_SK, GuardState)
        for obs in managed:
            key = obs.ref.key
            before = memory[key]
            risks = {f.gpu.key: str(f.risk) for f in by_group_f[key] if f.risk is not Risk.OK}
            unhealthy = {h.gpu.key: h.reason for h in by_group_h[key]}
            choices = choose_replacements(
                [h for h in by_group_h[key] if h.gpu.key not in before.unhealthy],  # new findings only
                {key: sum(1 for i in obs.instances if i.lifecycle_state == "InService")},
                {key: obs.min_size},
                {key: before.replacements},
                now,
                guard.health,
            )
            acting = [c for c in choices if c.act and not dry]
            after = GuardState(
                risks=risks,
                unhealthy=unhealthy,
                replacements=tuple(t for t in before.replacements if t > now - timedelta(hours=1))
                + tuple(now for _ in acting),
            )
            changed = after.model_dump(exclude={"version"}) != before.model_dump(exclude={"version"})
            if changed and not self.state.save_doc(key, GUARD_SK, after, before.version):
                self.logger.warning("guard state changed concurrently; acting next run", extra={"group": key})
                continue
            notes += self._risk_notes(key, before, by_group_f[key], now, event_id)
            notes += self._health_notes(key, before, by_group_h[key], choices, dry, now, event_id)
            for c in choices:
                if c.act and dry:
                    c = c.model_copy(update={"act": False, "reason": f"dry-run: would {c.reason}"})
                elif c.act:
                    c = c.model_copy(update={"reason": f"{c.reason}: {self.actuator.mark_unhealthy(c.instance_id)}"})
                replaced.append(c)
        pressured = {}
        if guard.memory.scale_out_on_pressure:
            per_group: dict[str, int] = defaultdict(int)
            for g in gpus:
                per_group[g.group] += 1
            pressured = group_pressure(forecasts, dict(per_group), guard.memory)
            for group_key, why in sorted(pressured.items()):
                obs = next(o for o in managed if o.ref.key == group_key)
                self.scaler.request(obs.ref, Direction.OUT, "oom-guard", why, now, event_id)
        self._send(notes)
        self._report(forecasts, findings, replaced)
        return {
            "event_id": event_id,
            "gpus": len(gpus),
            "at_risk": {f.gpu.key: f"{f.risk}: {f.reason}" for f in forecasts if f.risk is not Risk.OK},
            "unhealthy": {h.gpu.key: h.reason for h in findings},
            "replacements": [r.model_dump(mode="json") for r in replaced],
            "pressure": pressured,
            "notifications": len(notes),
        }

    # ---- reading ----

    def _assess(
        self, gpus: list[GpuRef], now: datetime, policy: FleetPolicy
    ) -> tuple[list[Forecast], list[HealthFinding]]:
        """Two phases, because GetMetricData is billed per series requested: first one memory series per
        GPU and four health counters per instance; then detail (MiB, top process, per-GPU counters) only
        for the GPUs at risk and the instances with errors."""
        guard = policy.guard
        start = now - timedelta(minutes=max(guard.memory.window_minutes, guard.health.lookback_minutes))
        health_since = now - timedelta(minutes=guard.health.lookback_minutes)
        instances = sorted({g.instance_id for g in gpus})
        first = [SeriesQuery(f"{g.key}|pct", schema.GPU_MEMORY_USED_PERCENT, _gpu_dims(g), "Maximum") for g in gpus]
        for iid in instances:
            for name, metric in _HEALTH_METRICS:
                first.append(SeriesQuery(f"{iid}|{name}", metric, ((schema.DIM_INSTANCE_ID, iid),), "Sum"))
        points = self.metrics.fetch_points(first, start, now) if first else {}

        def total(key: str) -> float:
            return sum(v for t, v in points[key] if t >= health_since)

        percent = {g.key: sorted(points[f"{g.key}|pct"]) for g in gpus}
        screened = {
            g.key: forecast_gpu(MemorySeries(gpu=g, points=tuple(percent[g.key]), total_mib=100.0), now, guard.memory)
            for g in gpus
        }
        at_risk = [g for g in gpus if screened[g.key].risk is not Risk.OK]
        with_errors = {iid for iid in instances if any(total(f"{iid}|{name}") > 0 for name, _ in _HEALTH_METRICS)}
        suspects = [g for g in gpus if g.instance_id in with_errors]
        second = []
        for g in at_risk:
            second.append(SeriesQuery(f"{g.key}|total", schema.GPU_MEMORY_TOTAL, _gpu_dims(g), "Maximum"))
            second.append(SeriesQuery(f"{g.key}|top", schema.GPU_TOP_PROCESS_MEMORY, _gpu_dims(g), "Maximum"))
        for g in suspects:
            for name, metric in _HEALTH_METRICS:
                second.append(SeriesQuery(f"{g.key}|{name}", metric, _gpu_dims(g), "Sum"))
        if second:
            points.update(self.metrics.fetch_points(second, start, now))
        forecasts = []
        for g in gpus:
            totals = points.get(f"{g.key}|total")
            if g not in at_risk or not totals:
                forecasts.append(screened[g.key])
                continue
            mib = totals[0][1]
            top = points[f"{g.key}|top"]
            series = MemorySeries(
                gpu=g,
                points=tuple((t, v * mib / 100) for t, v in percent[g.key]),
                total_mib=mib,
                top_process_mib=top[0][1] if top else None,
            )
            forecasts.append(forecast_gpu(series, now, guard.memory))
        counts = [
            HealthCounts(gpu=g, **{name: total(f"{g.key}|{name}") for name, _ in _HEALTH_METRICS}) for g in suspects
        ]
        return forecasts, health_findings(counts, guard.health)

    # ---- telling ----

    def _risk_notes(
        self, group: str, before: GuardState, forecasts: list[Forecast], now: datetime, event_id: str
    ) -> list[Notification]:
        out = []
        current = {f.gpu.key: f for f in forecasts}
        for key, f in current.items():
            if f.risk is Risk.OK or before.risks.get(key) == str(f.risk):
                continue
            facts = {
                "instance": f.gpu.instance_id,
                "GPU": str(f.gpu.gpu_index),
                "memory": f"{(f.used_mib or 0) / 1024:.1f} / {(f.total_mib or 0) / 1024:.1f} GiB "
                f"({f.used_percent or 0:.1f}%)",
            }
            if f.slope_mib_per_min is not None:
                facts["trend"] = f"{f.slope_mib_per_min:+.0f} MiB/min over {f.points_used} min"
            if f.minutes_to_full is not None:
                facts["forecast"] = f"full in ~{f.minutes_to_full:.0f} min"
            if f.top_process_mib is not None:
                facts["top process"] = f"{f.top_process_mib / 1024:.1f} GiB"
            out.append(
                self._note(
                    group,
                    f.gpu,
                    "oom",
                    Severity(str(f.risk)),
                    f"GPU memory {f.risk}: {f.gpu.key}",
                    facts,
                    f.reason,
                    now,
                    event_id,
                )
            )
        for key in before.risks:
            if key not in current or current[key].risk is Risk.OK:
                now_ok = current.get(key)
                instance, _, gpu_index = key.partition("/gpu")
                gpu = GpuRef(group=group, instance_id=instance, gpu_index=int(gpu_index))
                why = now_ok.reason if now_ok is not None else "the GPU no longer reports memory (instance gone)"
                out.append(
                    self._note(
                        group,
                        gpu,
                        "oom",
                        Severity.INFO,
                        f"GPU memory back to normal: {key}",
                        {},
                        why,
                        now,
                        event_id,
                        resolved=True,
                    )
                )
        return out

    def _health_notes(
        self,
        group: str,
        before: GuardState,
        findings: list[HealthFinding],
        choices: list[Replacement],
        dry: bool,
        now: datetime,
        event_id: str,
    ) -> list[Notification]:
        out = []
        action = {c.instance_id: c for c in choices}
        for h in findings:
            if h.gpu.key in before.unhealthy:
                continue
            c = action.get(h.gpu.instance_id)
            facts = {"instance": h.gpu.instance_id, "GPU": str(h.gpu.gpu_index), "problems": "; ".join(h.problems)}
            if c is not None:
                facts["action"] = f"dry-run: would {c.reason}" if dry and c.act else c.reason
            out.append(
                self._note(
                    group,
                    h.gpu,
                    "gpu-health",
                    Severity.CRITICAL,
                    f"GPU failure on {h.gpu.key}",
                    facts,
                    h.reason,
                    now,
                    event_id,
                )
            )
        current = {h.gpu.key for h in findings}
        for key in before.unhealthy:
            if key not in current:
                instance, _, gpu_index = key.partition("/gpu")
                gpu = GpuRef(group=group, instance_id=instance, gpu_index=int(gpu_index))
                out.append(
                    self._note(
                        group,
                        gpu,
                        "gpu-health",
                        Severity.INFO,
                        f"GPU health clear: {key}",
                        {},
                        "no new errors in the lookback window",
                        now,
                        event_id,
                        resolved=True,
                    )
                )
        return out

    def _note(
        self,
        group: str,
        gpu: GpuRef,
        kind: str,
        severity: Severity,
        title: str,
        facts: dict[str, str],
        reason: str,
        now: datetime,
        event_id: str,
        resolved: bool = False,
    ) -> Notification:
        return Notification(
            notification_id=notification_id(event_id, gpu.key, kind, str(severity), str(resolved)),
            kind=kind,
            severity=severity,
            group=group,
            incident_key=f"{group}|{kind}|{gpu.key}",
            title=f"{group}: {title}",
            facts=facts,
            reason=reason,
            links=(metric_link(self.region, gpu), *console_links(group, self.region)),
            state=IncidentState.RESOLVED if resolved else IncidentState.FIRING,
            at=now,
            source="oom_guard",
        )

    def _report(self, forecasts: list[Forecast], findings: list[HealthFinding], replaced: list[Replacement]) -> None:
        for f in forecasts:
            if f.risk is not Risk.OK:
                self.logger.warning(f"{f.gpu.key}: {f.risk} {f.reason}", extra={"forecast": f.model_dump(mode="json")})
        for h in findings:
            self.logger.error(h.reason, extra={"finding": h.model_dump(mode="json")})
        self.emf.add_metric(name="GpusEvaluated", unit=MetricUnit.Count, value=len(forecasts))
        self.emf.add_metric(
            name="GpusAtMemoryRisk", unit=MetricUnit.Count, value=sum(f.risk is not Risk.OK for f in forecasts)
        )
        self.emf.add_metric(name="GpuHealthFindings", unit=MetricUnit.Count, value=len(findings))
        self.emf.add_metric(name="InstancesReplaced", unit=MetricUnit.Count, value=sum(r.act for r in replaced))
