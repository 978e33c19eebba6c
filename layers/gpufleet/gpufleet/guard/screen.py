"""What the OOM guard reads, cheapest first, because GetMetricData is billed per series requested and the
publisher sends a GPU's own series only while it matters (adaptive detail):

1. per group: the fullest GPU's memory and the average (GPUMemoryUsedPercent Maximum and Average) and
   the health summary (GPUHealthEvents Sum) - three series per group, whatever its size;
2. only for a group whose fullest GPU could run out within the warning horizon, whose average rises
   steadily, that had a health event, or that has a GPU already at risk or unhealthy: the same three
   series per instance;
3. only for such instances: their GPUs' own series (listed with ListMetrics: a GPU has them only while in
   detail) - memory, size, top process - and the per-GPU health counters.

The fullest GPU alone would hide a leak below a fuller, flat GPU until it became the fullest; the average
shows it earlier (diluted, but steady), and the leaking GPU's own series are there once it passes 70 %
(the publisher's detail threshold).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufleet.aws.metrics import GpuMetricsReader, SeriesQuery, group_dimensions
from gpufleet.domain.models import GroupObservation
from gpufleet.domain.policy import FleetPolicy
from gpufleet.guard.core import (
    Forecast,
    GpuRef,
    HealthCounts,
    HealthFinding,
    MemorySeries,
    Risk,
    forecast_gpu,
    health_findings,
    rising,
)
from gpufleet_node import schema

_HEALTH_METRICS = (
    ("xid_errors", schema.GPU_XID_ERRORS),
    ("ecc_double_bit", schema.GPU_ECC_DOUBLE_BIT),
    ("remapped_uncorrectable", schema.GPU_REMAPPED_ROWS_UNCORRECTABLE),
    ("lost", schema.GPU_LOST),
)
Points = dict[str, list[tuple[datetime, float]]]


def _gpu_dims(g: GpuRef) -> tuple[tuple[str, str], ...]:
    return ((schema.DIM_INSTANCE_ID, g.instance_id), (schema.DIM_GPU_INDEX, str(g.gpu_index)))


def _summary_queries(key: str, dims: tuple[tuple[str, str], ...]) -> list[SeriesQuery]:
    return [
        SeriesQuery(f"{key}|max", schema.GPU_MEMORY_USED_PERCENT, dims, "Maximum"),
        SeriesQuery(f"{key}|avg", schema.GPU_MEMORY_USED_PERCENT, dims, "Average"),
        SeriesQuery(f"{key}|health", schema.GPU_HEALTH_EVENTS, dims, "Sum"),
    ]


@dataclass
class GpuScreen:
    metrics: GpuMetricsReader

    def assess(
        self, groups: Sequence[GroupObservation], known: set[str], now: datetime, policy: FleetPolicy
    ) -> tuple[list[Forecast], list[HealthFinding]]:
        """Forecasts and health findings for the GPUs worth looking at; `known` are the GPU keys the
        guard already holds at risk or unhealthy (read again, so they resolve with a reason)."""
        guard = policy.guard
        start = now - timedelta(minutes=max(guard.memory.window_minutes, guard.health.lookback_minutes))
        since = now - timedelta(minutes=guard.health.lookback_minutes)
        known_instances = {k.rpartition("/gpu")[0] for k in known}
        queries = [q for obs in groups for q in _summary_queries(obs.ref.key, tuple(group_dimensions(obs.ref).items()))]
        points = self.metrics.fetch_points(queries, start, now) if queries else {}
        flagged = [obs for obs in groups if self._flag(obs.ref.key, points, since, now, policy)]
        flagged += [
            obs for obs in groups if obs not in flagged and {i.instance_id for i in obs.instances} & known_instances
        ]
        instances = {i.instance_id: obs.ref.key for obs in flagged for i in obs.instances if i.in_service}
        queries = [q for iid in instances for q in _summary_queries(iid, ((schema.DIM_INSTANCE_ID, iid),))]
        points.update(self.metrics.fetch_points(queries, start, now) if queries else {})
        suspects = {
            iid: g
            for iid, g in instances.items()
            if iid in known_instances or self._flag(iid, points, since, now, policy)
        }
        gpus = [
            GpuRef(group=g, instance_id=iid, gpu_index=i)
            for iid, g in suspects.items()
            for i in self.metrics.gpus_of(iid)
        ]
        latest = {iid: max(points.get(f"{iid}|max", []), default=None) for iid in suspects}
        return self._per_gpu(gpus, latest, start, since, now, policy)

    def _flag(self, key: str, points: Points, since: datetime, now: datetime, policy: FleetPolicy) -> bool:
        """Worth a closer look: a health event, the fullest GPU at risk by level or trend, or the average
        rising steadily (a leak below a fuller, flat GPU)."""
        if sum(v for t, v in points.get(f"{key}|health", []) if t >= since) > 0:
            return True
        if rising(sorted(points.get(f"{key}|avg", [])), policy.guard.memory.min_points):
            return True
        series = sorted(points.get(f"{key}|max", []))
        pseudo = GpuRef(group=key, instance_id=key, gpu_index=0)
        forecast = forecast_gpu(
            MemorySeries(gpu=pseudo, points=tuple(series), total_mib=100.0), now, policy.guard.memory
        )
        return forecast.risk is not Risk.OK

    def _per_gpu(
        self,
        gpus: list[GpuRef],
        latest: dict[str, tuple[datetime, float] | None],
        start: datetime,
        since: datetime,
        now: datetime,
        policy: FleetPolicy,
    ) -> tuple[list[Forecast], list[HealthFinding]]:
        """The suspects' own series: memory forecast in MiB with the top process, and health counters."""
        queries = [
            SeriesQuery(f"{g.key}|{n}", m, _gpu_dims(g), "Maximum")
            for g in gpus
            for n, m in (
                ("pct", schema.GPU_MEMORY_USED_PERCENT),
                ("total", schema.GPU_MEMORY_TOTAL),
                ("top", schema.GPU_TOP_PROCESS_MEMORY),
            )
        ]
        queries += [
            SeriesQuery(f"{g.key}|{name}", metric, _gpu_dims(g), "Sum")
            for g in gpus
            for name, metric in _HEALTH_METRICS
        ]
        points = self.metrics.fetch_points(queries, start, now) if queries else {}
        forecasts = [self._forecast(g, points, latest.get(g.instance_id), now, policy) for g in gpus]
        counts = [
            HealthCounts(
                gpu=g,
                **{name: sum(v for t, v in points[f"{g.key}|{name}"] if t >= since) for name, _ in _HEALTH_METRICS},
            )
            for g in gpus
        ]
        return forecasts, health_findings(counts, policy.guard.health)

    def _forecast(
        self, g: GpuRef, points: Points, bound: tuple[datetime, float] | None, now: datetime, policy: FleetPolicy
    ) -> Forecast:
        """A GPU whose own series stopped (it left detail: below the publisher's off threshold) is at most
        its instance's fullest GPU since: that later point bounds it, so a stale high point never lingers."""
        percent = sorted(points[f"{g.key}|pct"])
        if bound is not None and (not percent or percent[-1][0] < bound[0]):
            percent.append(bound)
        totals, top = points[f"{g.key}|total"], points[f"{g.key}|top"]
        mib = totals[0][1] if totals else 100.0  # without its size, judge in percent
        series = MemorySeries(
            gpu=g,
            points=tuple((t, v * mib / 100) for t, v in percent),
            total_mib=mib,
            top_process_mib=top[0][1] if top else None,
        )
        return forecast_gpu(series, now, policy.guard.memory)


def gpu_keys(states: Iterable[Any]) -> set[str]:
    """The GPUs the guard's memory holds at risk or unhealthy (they are read again until they resolve)."""
    return {k for s in states for k in (*s.risks, *s.unhealthy)}
