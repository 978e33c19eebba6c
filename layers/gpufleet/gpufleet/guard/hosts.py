"""Host memory in the OOM guard: a node whose own memory will run out kills its GPU job as surely as a
full GPU does. Read like the GPUs, cheapest first:

1. every HOST_SCREEN_EVERY_MIN minutes or more, per group: the fullest node's memory
   (HostMemoryUsedPercent Maximum of the group's shared series; every node writes it, always on), in
   the GPU screen's batch. Timed from this container's last screen (`HostScreening`), not on a minute
   grid: a rate(5 minutes) schedule created at :02 runs at :02, :07, ..., never on a multiple of 5;
2. for a group whose fullest node forecasts at risk (the GPU thresholds: 90 % or full within 30 min), and
   for every host the guard already holds at risk (each run, so it resolves on time): each node's own
   series, which the publisher sends only while that node is above 70 % (until below 60 %).

Nodes outside managed groups have no group series: their own series are read on the same screening
runs. A fast leak that the group's Maximum flags while the node is still below 70 % is named once
the node passes 70 %: minutes later at the rates that can fill it within the horizon.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpufleet.aws.metrics import GpuMetricsReader, SeriesQuery, group_dimensions
from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation
from gpufleet.guard.core import HOST_INDEX, HOST_SUFFIX, Forecast, GpuRef, Risk, forecast_host, instance_of
from gpufleet.policy.fleet import FleetPolicy
from gpufleet_node import schema

Points = dict[str, list[tuple[datetime, float]]]


@dataclass
class HostScreening:
    """When this container last screened host memory. Kept by the OOM guard for its container's life: a
    new container screens at once; then a run screens once HOST_SCREEN_EVERY_MIN minutes (less
    HOST_SCREEN_SLACK_S of schedule jitter) have passed, whatever minute of the hour it falls on. So
    rate(1 minute) screens every 5th run, rate(2 minutes) every 3rd (6 minutes), rate(5 minutes) and
    slower every run. A clock that went back screens too (never a long pause)."""

    last: datetime | None = None

    def due(self, now: datetime) -> bool:
        if self.last is None or now < self.last:
            return True
        every = timedelta(minutes=defaults.HOST_SCREEN_EVERY_MIN, seconds=-defaults.HOST_SCREEN_SLACK_S)
        return now - self.last >= every

    def screened(self, now: datetime) -> None:
        self.last = now


def _own(iid: str) -> SeriesQuery:
    return SeriesQuery(f"{iid}|host", schema.HOST_MEMORY_USED_PERCENT, ((schema.DIM_INSTANCE_ID, iid),), "Maximum")


def screen_queries(groups: Sequence[GroupObservation], outside: Sequence[str], due: bool) -> list[SeriesQuery]:
    """Step 1's host queries (in the GPU screen's batch): the groups' fullest node, and the own series of
    nodes outside managed groups; none on a run that is not `due` (HostScreening.due)."""
    if not due:
        return []
    queries = [
        SeriesQuery(
            f"{obs.ref.key}|hostmax",
            schema.HOST_MEMORY_USED_PERCENT,
            tuple(group_dimensions(obs.ref).items()),
            "Maximum",
        )
        for obs in groups
    ]
    return queries + [_own(iid) for iid in sorted(outside)]


def known_hosts(known: set[str]) -> set[str]:
    """The instances whose host the guard holds at risk (keys "INSTANCE/host")."""
    return {instance_of(k) for k in known if k.endswith(HOST_SUFFIX)}


def host_forecasts(
    metrics: GpuMetricsReader,
    groups: Sequence[GroupObservation],
    outside: dict[str, str],
    points: Points,
    known: set[str],
    window: tuple[datetime, datetime],
    policy: FleetPolicy,
) -> list[Forecast]:
    """Forecasts for the hosts worth naming: the nodes of groups whose fullest node is at risk, nodes
    outside groups (read in step 1), and the hosts already held at risk. `points` holds step 1's answers;
    `window` is (start, now). Hosts at no risk are returned only when held (so they resolve)."""
    start, now = window
    s = policy.guard.memory
    held = known_hosts(known)
    owner = {i.instance_id: obs.ref.key for obs in groups for i in obs.instances}
    wanted: dict[str, str] = {}
    for obs in groups:
        fullest = forecast_host(
            GpuRef(group=obs.ref.key, instance_id=obs.ref.key, gpu_index=HOST_INDEX),
            sorted(points.get(f"{obs.ref.key}|hostmax", [])),
            now,
            s,
        )
        if fullest.risk is not Risk.OK:
            wanted.update((i.instance_id, obs.ref.key) for i in obs.instances if i.in_service)
    for iid in held:
        if iid in owner or iid in outside:
            wanted.setdefault(iid, owner.get(iid) or outside[iid])
    fresh = [
        _own(iid)
        for iid in sorted(wanted)
        if f"{iid}|host" not in points or (iid in held and not points[f"{iid}|host"])
    ]
    since = now - timedelta(minutes=defaults.HOST_SILENT_LOOKBACK_MIN)  # a silent host's last reading
    read = {**points, **(metrics.fetch_points(fresh, min(start, since), now) if fresh else {})}
    wanted.update((iid, g) for iid, g in outside.items() if f"{iid}|host" in points)
    out = []
    for iid, group in sorted(wanted.items()):
        f = forecast_host(
            GpuRef(group=group, instance_id=iid, gpu_index=HOST_INDEX), sorted(read.get(f"{iid}|host", [])), now, s
        )
        if f.risk is not Risk.OK or iid in held:
            out.append(f)
    return out
