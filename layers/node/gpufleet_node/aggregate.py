"""Windows of 1 Hz samples -> CloudWatch datums (Values/Counts, StatisticValues or counts). Pure.

A 60 s window of 8 GPUs becomes about 170 datums in full detail, about 5 in adaptive detail (`datums`
takes the adaptive filter, `adaptive_keep`): one PutMetricData call per minute instead of one per GPU
every 10 s. Integer 0-100 metrics keep their full distribution (Values/Counts), so CloudWatch
computes exact percentiles; the rest keep count, sum, min and max.
Python >= 3.9.
"""

import math
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple

from gpufleet_node import schema
from gpufleet_node.nvml import (
    THROTTLE_HW_POWER_BRAKE,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_POWER_CAP,
    THROTTLE_SW_THERMAL,
    GpuSample,
)

Dimensions = Tuple[Tuple[str, str], ...]
Datum = Dict[str, Any]
# keep(metric name, dimensions, counter value or None for a sampled series) -> send this datum?
Keep = Callable[[str, Dimensions, Optional[float]], bool]


def window_start(now: datetime, length_s: int) -> datetime:
    """The start of the `length_s` window `now` falls in, on the epoch's grid (UTC)."""
    epoch = int(now.timestamp())
    return datetime.fromtimestamp(epoch - epoch % length_s, timezone.utc)


class _Series:
    """Samples of one metric under one set of dimensions within a window."""

    __slots__ = ("count", "counts", "maximum", "minimum", "total")

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.count = 0
        self.total = 0.0
        self.minimum = math.inf
        self.maximum = -math.inf

    def add(self, value: float, distribution: bool) -> None:
        if distribution:
            self.counts[round(value)] += 1
        self.count += 1
        self.total += value
        if value < self.minimum:
            self.minimum = value
        if value > self.maximum:
            self.maximum = value


class Window:
    """Everything sampled between `start` and the window's close."""

    def __init__(
        self, start: datetime, storage_resolution: int = 60, only: Optional[Iterable[schema.Metric]] = None
    ) -> None:
        self.start = start
        self.storage_resolution = storage_resolution
        self.only = None if only is None else frozenset(m.name for m in only)
        self.series: Dict[Tuple[str, Dimensions], _Series] = {}
        self.counters: Dict[Tuple[str, Dimensions], float] = {}
        self.critical_xid_gpus: Set[int] = set()  # the XID counter has no code: which GPUs had a critical one

    def observe(self, metric: schema.Metric, dims: Iterable[Dimensions], value: Optional[float]) -> None:
        if value is None or (self.only is not None and metric.name not in self.only):
            return
        for d in dims:
            key = (metric.name, d)
            series = self.series.get(key)
            if series is None:
                series = self.series[key] = _Series()
            series.add(float(value), metric.aggregation == schema.DISTRIBUTION)

    def count(self, metric: schema.Metric, dims: Iterable[Dimensions], n: float = 1.0) -> None:
        if self.only is not None and metric.name not in self.only:
            return
        for d in dims:
            key = (metric.name, d)
            self.counters[key] = self.counters.get(key, 0.0) + n

    def datums(self, timestamp: datetime, keep: Optional[Keep] = None) -> List[Datum]:
        """The window as PutMetricData datums; `keep` (adaptive detail) decides which series are sent."""
        out: List[Datum] = []
        for (name, dims), series in sorted(self.series.items()):
            if keep is not None and not keep(name, dims, None):
                continue
            metric = schema.METRICS_BY_NAME[name]
            datum: Datum = {
                "MetricName": name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims],
                "Timestamp": timestamp,
                "Unit": metric.unit,
            }
            if metric.aggregation == schema.DISTRIBUTION:
                values = sorted(series.counts)
                datum["Values"] = [float(v) for v in values]
                datum["Counts"] = [float(series.counts[v]) for v in values]
            else:
                datum["StatisticValues"] = {
                    "SampleCount": float(series.count),
                    "Sum": series.total,
                    "Minimum": series.minimum,
                    "Maximum": series.maximum,
                }
            if self.storage_resolution != 60:
                datum["StorageResolution"] = self.storage_resolution
            out.append(datum)
        for (name, dims), total in sorted(self.counters.items()):
            if keep is not None and not keep(name, dims, total):
                continue
            out.append(
                {
                    "MetricName": name,
                    "Dimensions": [{"Name": k, "Value": v} for k, v in dims],
                    "Timestamp": timestamp,
                    "Unit": schema.METRICS_BY_NAME[name].unit,
                    "Value": total,
                }
            )
        return out

    def maximum(self, metric: schema.Metric, dims: Dimensions) -> Optional[float]:
        series = self.series.get((metric.name, dims))
        return None if series is None else series.maximum

    def total(self, metric: schema.Metric, dims: Dimensions) -> float:
        return self.counters.get((metric.name, dims), 0.0)


class Scopes:
    """The dimension sets a GPU's samples land in: the GPU, its instance, its group. Which metrics also
    go to the instance and the group depends on the detail mode (schema.py says why)."""

    def __init__(self, instance_id: str, group: Optional[Dict[str, str]], detail: str = schema.DETAIL_FULL) -> None:
        self.instance: Dimensions = ((schema.DIM_INSTANCE_ID, instance_id),)
        self.group: Optional[Dimensions] = tuple(sorted(group.items())) if group else None
        self._gpu: Dict[int, Dimensions] = {}
        self._routes: Dict[Tuple[str, int], List[Dimensions]] = {}
        if detail == schema.DETAIL_ADAPTIVE:
            self._instance_metrics = frozenset(schema.ADAPTIVE_INSTANCE_METRICS + schema.GPU_EVENT_COUNTERS)
            self._group_metrics = frozenset(schema.ADAPTIVE_GROUP_METRICS + schema.ADAPTIVE_GROUP_EVENTS)
        else:
            self._instance_metrics = frozenset(schema.INSTANCE_METRICS)
            self._group_metrics = frozenset(schema.GROUP_METRICS)

    def gpu(self, index: int) -> Dimensions:
        dims = self._gpu.get(index)
        if dims is None:
            dims = self._gpu[index] = (self.instance[0], (schema.DIM_GPU_INDEX, str(index)))
        return dims

    def for_metric(self, metric: schema.Metric, index: int) -> List[Dimensions]:
        key = (metric.name, index)
        out = self._routes.get(key)  # cached: this runs ~20 times per GPU per sample
        if out is None:
            out = self._routes[key] = [self.gpu(index)]
            if metric in self._instance_metrics:
                out.append(self.instance)
            if self.group is not None and metric in self._group_metrics:
                out.append(self.group)
        return out

    def host(self) -> List[Dimensions]:
        """Where a host reading goes: the instance (sent in adaptive detail only while under pressure:
        `adaptive_keep`) and its group (always: the group's Maximum is its fullest node)."""
        return self.summary()

    def summary(self) -> List[Dimensions]:
        """Where the health summary (GPUHealthEvents) goes: the instance and its group, never a GPU."""
        return [self.instance] if self.group is None else [self.instance, self.group]


class GpuCounters:
    """Monotonic NVML totals (ECC, remapped rows) turned into per-window deltas; the first reading is
    the baseline, and a total that goes down (driver reload) restarts the baseline."""

    def __init__(self) -> None:
        self._last: Dict[Tuple[int, str], float] = {}

    def delta(self, index: int, name: str, total: Optional[float]) -> float:
        if total is None:
            return 0.0
        key = (index, name)
        last = self._last.get(key)
        self._last[key] = total
        if last is None or total < last:
            return 0.0
        return total - last


def add_sample(window: Window, scopes: Scopes, index: int, s: GpuSample, counters: GpuCounters) -> None:
    """Fold one GPU reading into the window."""

    only = window.only

    def put(metric: schema.Metric, value: Optional[float]) -> None:
        if value is not None and (only is None or metric.name in only):
            window.observe(metric, scopes.for_metric(metric, index), value)

    def add(metric: schema.Metric, n: float) -> None:
        if only is None or metric.name in only:
            window.count(metric, scopes.for_metric(metric, index), n)

    if s.lost:
        add(schema.GPU_LOST, 1.0)
        window.count(schema.GPU_HEALTH_EVENTS, scopes.summary(), 1.0)
        return
    add(schema.GPU_LOST, 0.0)  # an explicit 0, so alarms see data rather than a gap (full/essential)
    put(schema.GPU_UTILIZATION, s.utilization)
    put(schema.GPU_MEMORY_CONTROLLER_BUSY, s.mem_controller_busy)
    if s.memory_total_mib:
        put(schema.GPU_MEMORY_TOTAL, s.memory_total_mib)
        put(schema.GPU_MEMORY_USED, s.memory_used_mib)
        put(schema.GPU_MEMORY_FREE, s.memory_free_mib)
        if s.memory_used_mib is not None:
            put(schema.GPU_MEMORY_USED_PERCENT, 100.0 * s.memory_used_mib / s.memory_total_mib)
    put(schema.GPU_TOP_PROCESS_MEMORY, s.top_process_mib)
    put(schema.GPU_PROCESS_COUNT, s.process_count)
    put(schema.GPU_POWER_DRAW, s.power_w)
    if s.power_w is not None and s.power_limit_w:
        put(schema.GPU_POWER_PERCENT, 100.0 * s.power_w / s.power_limit_w)
    put(schema.GPU_TEMPERATURE, s.temperature_c)
    put(schema.GPU_MEMORY_TEMPERATURE, s.memory_temperature_c)
    if s.throttle_reasons is not None:
        r = s.throttle_reasons
        add(schema.GPU_THROTTLE_HW_SLOWDOWN, 1.0 if r & (THROTTLE_HW_SLOWDOWN | THROTTLE_HW_POWER_BRAKE) else 0.0)
        add(schema.GPU_THROTTLE_THERMAL, 1.0 if r & (THROTTLE_HW_THERMAL | THROTTLE_SW_THERMAL) else 0.0)
        add(schema.GPU_THROTTLE_POWER_CAP, 1.0 if r & THROTTLE_SW_POWER_CAP else 0.0)
    ecc = counters.delta(index, "ecc", s.ecc_double_bit_total)
    remapped = counters.delta(index, "remap", s.remapped_uncorrectable_total)
    add(schema.GPU_ECC_DOUBLE_BIT, ecc)
    add(schema.GPU_REMAPPED_ROWS_UNCORRECTABLE, remapped)
    if ecc or remapped:
        window.count(schema.GPU_HEALTH_EVENTS, scopes.summary(), ecc + remapped)


def add_high_resolution(window: Window, scopes: Scopes, index: int, s: GpuSample) -> None:
    """Fold one GPU reading into a 10 s window (the HIGH_RESOLUTION_METRICS subset)."""
    if s.lost:
        return
    used_percent = None
    if s.memory_total_mib and s.memory_used_mib is not None:
        used_percent = 100.0 * s.memory_used_mib / s.memory_total_mib
    values = {schema.GPU_UTILIZATION: s.utilization, schema.GPU_MEMORY_USED_PERCENT: used_percent}
    for metric in schema.HIGH_RESOLUTION_METRICS:
        window.observe(metric, scopes.for_metric(metric, index), values[metric])


def add_host_sample(window: Window, scopes: Scopes, s: Any) -> None:
    """Fold one host reading (host.HostSample) into the window: memory, swap where the node has swap,
    the fullest filesystem."""
    dims = scopes.host()
    window.observe(schema.HOST_MEMORY_USED_PERCENT, dims, s.memory_used_percent)
    window.observe(schema.HOST_SWAP_USED_PERCENT, dims, s.swap_used_percent)
    window.observe(schema.HOST_DISK_USED_PERCENT, dims, s.disk_used_percent)


_HOST = frozenset(m.name for m in schema.HOST_METRICS)


def gpu_index_of(dims: Dimensions) -> Optional[int]:
    """The GPU index of a per-GPU series, None for an instance or group series."""
    for name, value in dims:
        if name == schema.DIM_GPU_INDEX:
            return int(value)
    return None


def adaptive_keep(detail_gpus: FrozenSet[int], host_on: FrozenSet[str] = frozenset()) -> Keep:
    """The adaptive rule for one window: instance and group series are always sent (their routing in
    `Scopes` already limits them to the always-on set and the event counters), counters only when
    non-zero, a GPU's own series only while it is in detail (plus its event counters when non-zero), a
    host series of the instance only while it is in `host_on` (host.HostDetail: under pressure); the
    group's host series always."""
    detail = frozenset(m.name for m in schema.DETAIL_GPU_METRICS)
    events = frozenset(m.name for m in schema.GPU_EVENT_COUNTERS)

    def keep(name: str, dims: Dimensions, value: Optional[float]) -> bool:
        if value is not None and value == 0:
            return False
        if name in _HOST and dims and dims[0][0] == schema.DIM_INSTANCE_ID:
            return name in host_on
        gpu = gpu_index_of(dims)
        if gpu is None:
            return True
        return (gpu in detail_gpus and name in detail) or (value is not None and name in events)

    return keep
