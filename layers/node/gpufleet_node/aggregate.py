"""Windows of 1 Hz samples -> CloudWatch datums (Values/Counts, StatisticValues or counts). Pure.

A 60 s window of 8 GPUs becomes about 170 datums: one PutMetricData call per minute instead of one
per GPU every 10 s. Integer 0-100 metrics keep their full distribution (Values/Counts), so CloudWatch
computes exact percentiles; the rest keep count, sum, min and max.
Python >= 3.9.
"""

import math
from collections import Counter
from datetime import datetime
from typing import Any, Dict, Iterable, List, Optional, Tuple

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
        self.minimum = min(self.minimum, value)
        self.maximum = max(self.maximum, value)


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

    def datums(self, timestamp: datetime) -> List[Datum]:
        out: List[Datum] = []
        for (name, dims), series in sorted(self.series.items()):
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


class Scopes:
    """The dimension sets a GPU's samples land in: the GPU, its instance, its group."""

    def __init__(self, instance_id: str, group: Optional[Dict[str, str]]) -> None:
        self.instance: Dimensions = ((schema.DIM_INSTANCE_ID, instance_id),)
        self.group: Optional[Dimensions] = tuple(sorted(group.items())) if group else None
        self._gpu: Dict[int, Dimensions] = {}

    def gpu(self, index: int) -> Dimensions:
        dims = self._gpu.get(index)
        if dims is None:
            dims = self._gpu[index] = (self.instance[0], (schema.DIM_GPU_INDEX, str(index)))
        return dims

    def for_metric(self, metric: schema.Metric, index: int) -> List[Dimensions]:
        out = [self.gpu(index)]
        if metric in schema.INSTANCE_METRICS:
            out.append(self.instance)
        if self.group is not None and metric in schema.GROUP_METRICS:
            out.append(self.group)
        return out


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

    def put(metric: schema.Metric, value: Optional[float]) -> None:
        window.observe(metric, scopes.for_metric(metric, index), value)

    def add(metric: schema.Metric, n: float) -> None:
        window.count(metric, scopes.for_metric(metric, index), n)

    if s.lost:
        add(schema.GPU_LOST, 1.0)
        return
    add(schema.GPU_LOST, 0.0)  # an explicit 0, so alarms see data rather than a gap
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
    add(schema.GPU_ECC_DOUBLE_BIT, counters.delta(index, "ecc", s.ecc_double_bit_total))
    add(schema.GPU_REMAPPED_ROWS_UNCORRECTABLE, counters.delta(index, "remap", s.remapped_uncorrectable_total))
