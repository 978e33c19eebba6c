"""What the OOM guard reads, cheapest first, because GetMetricData is billed per series requested and the
publisher sends a GPU's own series only while it matters (adaptive detail):

1. per group: the fullest GPU's memory and the average (GPUMemoryUsedPercent Maximum and Average) and
   the health summary (GPUHealthEvents Sum) - three series per group, whatever its size;
2. only for a group whose fullest GPU could run out within the warning horizon, whose average rises
   steadily (the bar lowered by the group's size: one leak is diluted by every node), that had a health
   event, or that has a GPU already at risk or unhealthy: max and average per instance, and the health
   summary per instance only in a group that had a health event;
3. only for the instances that stand out: their GPUs' own series (listed with ListMetrics: a GPU has them
   only while in detail): memory percent for each, size and top process only for a GPU that forecasts at
   risk, the four health counters only on an instance whose summary counted something.

The fullest GPU alone would hide a leak below a fuller, flat GPU until it became the fullest; the average
shows it earlier (diluted, but steady), and the leaking GPU's own series are there once it passes 70 %
(the publisher's detail threshold).

Nodes outside every managed group publish too (a self-managed or Karpenter node, an ASG nobody put in the
policy). They have no group series the guard could screen them by: the publisher writes a group series
only for an ASG or an EKS managed node group, and its per-instance series carry InstanceId alone (no
cluster). So they are found by listing (ListMetrics: one request per 500 series, billed per 1,000
requests, not per metric) and screened per instance in step 1's batch: max and average (two series a
node), the health summary only for a node listed with one in the last 3 hours (the publisher sends it
only when non-zero). Each is its own group, `unmanaged:<instance id>`: a stable key the guard can derive
from the series alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpufleet.aws.metrics import GpuMetricsReader, SeriesQuery, group_dimensions
from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation
from gpufleet.guard import hosts
from gpufleet.guard.core import (
    HOST_SUFFIX,
    Forecast,
    GpuRef,
    HealthCounts,
    HealthFinding,
    MemorySeries,
    Risk,
    forecast_gpu,
    health_findings,
    instance_of,
    rising,
)
from gpufleet.policy.fleet import FleetPolicy
from gpufleet_node import schema

_HEALTH_METRICS = (
    ("xid_errors", schema.GPU_XID_ERRORS),
    ("ecc_double_bit", schema.GPU_ECC_DOUBLE_BIT),
    ("remapped_uncorrectable", schema.GPU_REMAPPED_ROWS_UNCORRECTABLE),
    ("lost", schema.GPU_LOST),
)
Points = dict[str, list[tuple[datetime, float]]]
UNMANAGED_PREFIX = "unmanaged:"


def unmanaged_group(instance_id: str) -> str:
    """The group key of a node outside every managed group (see the module's docstring for why by instance)."""
    return f"{UNMANAGED_PREFIX}{instance_id}"


def is_unmanaged(group: str) -> bool:
    return group.startswith(UNMANAGED_PREFIX)


@dataclass(frozen=True)
class Outside:
    """Nodes that publish GPU metrics outside every managed group: instance id -> its group key, and the
    ones listed with a health summary recently (only theirs is read, with the already known ones')."""

    groups: dict[str, str] = field(default_factory=dict)
    ill: frozenset[str] = frozenset()


def _gpu_dims(g: GpuRef) -> tuple[tuple[str, str], ...]:
    return ((schema.DIM_INSTANCE_ID, g.instance_id), (schema.DIM_GPU_INDEX, str(g.gpu_index)))


def _pct(g: GpuRef) -> tuple[Any, tuple[tuple[str, str], ...], str]:
    return schema.GPU_MEMORY_USED_PERCENT, _gpu_dims(g), "Maximum"


def _summary_queries(key: str, dims: tuple[tuple[str, str], ...], health: bool = True) -> list[SeriesQuery]:
    queries = [
        SeriesQuery(f"{key}|max", schema.GPU_MEMORY_USED_PERCENT, dims, "Maximum"),
        SeriesQuery(f"{key}|avg", schema.GPU_MEMORY_USED_PERCENT, dims, "Average"),
    ]
    return [*queries, SeriesQuery(f"{key}|health", schema.GPU_HEALTH_EVENTS, dims, "Sum")] if health else queries


def _had_events(key: str, points: Points, since: datetime) -> bool:
    return sum(v for t, v in points.get(f"{key}|health", []) if t >= since) > 0


@dataclass
class GpuScreen:
    metrics: GpuMetricsReader
    host_screening: hosts.HostScreening = field(default_factory=hosts.HostScreening)  # the container's

    def assess(
        self,
        groups: Sequence[GroupObservation],
        known: set[str],
        now: datetime,
        policy: FleetPolicy,
        outside: Outside | None = None,
    ) -> tuple[list[Forecast], list[HealthFinding]]:
        """Forecasts and health findings for the GPUs worth looking at; `known` are the GPU keys the
        guard already holds at risk or unhealthy (read again, so they resolve with a reason); `outside`
        the nodes outside managed groups (screened per instance). Long because it is one pass of three
        reads, each narrowing the next; split, the order of the reads would hide between functions."""
        guard = policy.guard
        start = now - timedelta(minutes=max(guard.memory.window_minutes, guard.health.lookback_minutes))
        since = now - timedelta(minutes=guard.health.lookback_minutes)
        known_instances = {instance_of(k) for k in known if not k.endswith(HOST_SUFFIX)}
        outside = outside or Outside()
        queries = [q for obs in groups for q in _summary_queries(obs.ref.key, tuple(group_dimensions(obs.ref).items()))]
        queries += _outside_queries(outside, known_instances)  # in the same batch: no extra call
        due = self.host_screening.due(now)  # host memory: every HOST_SCREEN_EVERY_MIN minutes or more
        queries += hosts.screen_queries(groups, list(outside.groups), due)
        points = self.metrics.fetch_points(queries, start, now) if queries else {}
        if due:
            self.host_screening.screened(now)
        host = hosts.host_forecasts(self.metrics, groups, outside.groups, points, known, (start, now), policy)
        flagged = [
            obs
            for obs in groups
            if self._flag(obs.ref.key, points, since, now, policy, sum(i.in_service for i in obs.instances))
        ]
        flagged += [
            obs for obs in groups if obs not in flagged and {i.instance_id for i in obs.instances} & known_instances
        ]
        instances = {i.instance_id: obs.ref.key for obs in flagged for i in obs.instances if i.in_service}
        ill = {g for g in instances.values() if _had_events(g, points, since)}  # health per instance only there
        queries = [
            q
            for iid, g in instances.items()
            for q in _summary_queries(iid, ((schema.DIM_INSTANCE_ID, iid),), g in ill or iid in known_instances)
        ]
        points.update(self.metrics.fetch_points(queries, start, now) if queries else {})
        suspects = {
            iid: g
            for iid, g in instances.items()
            if iid in known_instances or self._flag(iid, points, since, now, policy)
        }
        suspects.update(
            (iid, g)
            for iid, g in outside.groups.items()
            if iid in known_instances or self._flag(iid, points, since, now, policy)
        )
        gpus = [
            GpuRef(group=g, instance_id=iid, gpu_index=i)
            for iid, g in suspects.items()
            for i in self.metrics.gpus_of(iid)
        ]
        latest = {iid: max(points.get(f"{iid}|max", []), default=None) for iid in suspects}
        sick = {
            iid
            for iid in suspects
            if iid in known_instances or sum(v for t, v in points.get(f"{iid}|health", []) if t >= since) > 0
        }
        forecasts, findings = self._per_gpu(gpus, latest, sick, (start, since, now), policy)
        return forecasts + host, findings

    def _flag(
        self, key: str, points: Points, since: datetime, now: datetime, policy: FleetPolicy, instances: int = 1
    ) -> bool:
        """Worth a closer look: a health event, the fullest GPU at risk by level or trend, or the average
        rising steadily (a leak below a fuller, flat GPU; over `instances` nodes for a group)."""
        if _had_events(key, points, since):
            return True
        if rising(sorted(points.get(f"{key}|avg", [])), policy.guard.memory.min_points, instances):
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
        sick: set[str],
        window: tuple[datetime, datetime, datetime],
        policy: FleetPolicy,
    ) -> tuple[list[Forecast], list[HealthFinding]]:
        """The suspects' own series, cheapest first: memory percent for each; size and top process only
        for the GPUs that forecast at risk (for the MiB and the culprit in the message); the four health
        counters only on instances whose health summary counted something (`sick`).
        `window` is (start, since, now): memory from start, health events from since."""
        start, since, now = window
        pct = (
            self.metrics.fetch_points([SeriesQuery(f"{g.key}|pct", *_pct(g)) for g in gpus], start, now) if gpus else {}
        )
        risky = [g for g in gpus if self._forecast(g, pct, latest.get(g.instance_id), now, policy).risk is not Risk.OK]
        queries = [
            SeriesQuery(f"{g.key}|{n}", m, _gpu_dims(g), "Maximum")
            for g in risky
            for n, m in (("total", schema.GPU_MEMORY_TOTAL), ("top", schema.GPU_TOP_PROCESS_MEMORY))
        ]
        ill = [g for g in gpus if g.instance_id in sick]
        queries += [
            SeriesQuery(f"{g.key}|{name}", metric, _gpu_dims(g), "Sum") for g in ill for name, metric in _HEALTH_METRICS
        ]
        points = {**pct, **(self.metrics.fetch_points(queries, start, now) if queries else {})}
        forecasts = [self._forecast(g, points, latest.get(g.instance_id), now, policy) for g in gpus]
        counts = [
            HealthCounts(
                gpu=g,
                **{name: sum(v for t, v in points[f"{g.key}|{name}"] if t >= since) for name, _ in _HEALTH_METRICS},
            )
            for g in ill
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
        totals, top = points.get(f"{g.key}|total", []), points.get(f"{g.key}|top", [])
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


def list_publishers(metrics: GpuMetricsReader) -> tuple[set[str], set[str]]:
    """Every instance with a per-instance memory series active in the last 3 hours (every detail mode
    sends one), and those with a health summary in that time. Two listings, one request per 500 series,
    at most LIST_METRICS_MAX_PAGES each: a token that never ends stops there instead of looping."""
    return _instances_with(metrics, schema.GPU_MEMORY_USED_PERCENT), _instances_with(metrics, schema.GPU_HEALTH_EVENTS)


def _instances_with(metrics: GpuMetricsReader, metric: schema.Metric) -> set[str]:
    found: set[str] = set()
    kwargs: dict[str, Any] = {
        "Namespace": schema.NAMESPACE,
        "MetricName": metric.name,
        "Dimensions": [{"Name": schema.DIM_INSTANCE_ID}],
        "RecentlyActive": "PT3H",
    }
    for _ in range(defaults.LIST_METRICS_MAX_PAGES):
        page = metrics.cloudwatch.list_metrics(**kwargs)
        for m in page.get("Metrics", []):
            dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
            if set(dims) == set(schema.INSTANCE_DIMENSIONS):  # the instance's own series, not a GPU's
                found.add(dims[schema.DIM_INSTANCE_ID])
        token = page.get("NextToken")
        if not token or token == kwargs.get("NextToken"):
            break
        kwargs["NextToken"] = token
    return found


def _outside_queries(outside: Outside, known_instances: set[str]) -> list[SeriesQuery]:
    """Nodes outside managed groups, per instance: max and average, health only where it was listed."""
    return [
        q
        for iid in sorted(outside.groups)
        for q in _summary_queries(iid, ((schema.DIM_INSTANCE_ID, iid),), iid in outside.ill or iid in known_instances)
    ]
