"""Who held each GPU and how hard they used it, summed per usage window into one compact record. Pure.

Each sample says, per GPU, which workloads hold it (`Holder`: a pod the kubelet allocated it to, or the
owner of a process on it) and how busy it was. Time is split evenly between the holders of a shared GPU;
busy time follows each process's own SM utilization when NVML reports it, else it is split between the
holders that run a process (a pod holding a GPU without a process gets none of it: that is the waste the
report is about). A GPU nobody holds is counted as unallocated. The record format is in schema.py.
Python >= 3.9.
"""

import json
from datetime import datetime
from typing import Any, Dict, List, Optional, Tuple

from gpufleet_node import schema
from gpufleet_node.workload import POD, UNIT, Workload


class Holder:
    """One workload on one GPU in one sample: its processes' memory and SM share (None: unknown)."""

    __slots__ = ("memory_mib", "processes", "sm_util", "workload")

    def __init__(
        self, workload: Workload, memory_mib: float = 0.0, sm_util: Optional[float] = None, processes: int = 0
    ) -> None:
        self.workload = workload
        self.memory_mib = memory_mib
        self.sm_util = sm_util
        self.processes = processes


class _Row:
    __slots__ = ("busy_s", "held_s", "idle_s", "peak_mib")

    def __init__(self) -> None:
        self.held_s = 0.0
        self.busy_s = 0.0
        self.idle_s = 0.0
        self.peak_mib = 0.0


def _shares(utilization: Optional[float], holders: List[Holder]) -> List[float]:
    """Each holder's busy fraction of the sample (0..1)."""
    util = max(0.0, min(100.0, utilization or 0.0)) / 100.0
    if any(h.processes for h in holders) and all(h.sm_util is not None for h in holders if h.processes):
        return [min(1.0, (h.sm_util or 0.0) / 100.0) if h.processes else 0.0 for h in holders]
    running = [h for h in holders if h.processes] or holders
    return [util / len(running) if h in running else 0.0 for h in holders]


class UsageWindow:
    """One node's usage in one window: rows per (GPU, workload key)."""

    def __init__(self, start: datetime, length_s: int, gpus: int) -> None:
        self.start = start
        self.length_s = length_s
        self.gpus = gpus
        self.workloads: Dict[str, Workload] = {}
        self.rows: Dict[Tuple[int, Optional[str]], _Row] = {}
        self.unknown: Dict[str, str] = {}

    def add(self, gpu: int, dt_s: float, utilization: Optional[float], holders: List[Holder]) -> None:
        """One sample of one GPU, standing for `dt_s` seconds."""
        if dt_s <= 0:
            return
        if not holders:
            row = self._row(gpu, None)
            row.held_s += dt_s
            row.busy_s += dt_s * max(0.0, min(100.0, utilization or 0.0)) / 100.0
            row.idle_s += dt_s if (utilization or 0.0) <= schema.IDLE_UTIL_PERCENT else 0.0
            return
        share_s = dt_s / len(holders)
        shares = _shares(utilization, holders)
        for i, holder in enumerate(holders):
            busy = shares[i]
            self.workloads.setdefault(holder.workload.key, holder.workload)
            row = self._row(gpu, holder.workload.key)
            row.held_s += share_s
            # capped at the holder's share of the time, so busy <= held always holds: a time-sliced pod
            # that used more than its share is counted as fully busy, not as busier than it held
            row.busy_s += min(dt_s * busy, share_s)
            row.idle_s += share_s if busy * 100.0 <= schema.IDLE_UTIL_PERCENT else 0.0
            row.peak_mib = max(row.peak_mib, holder.memory_mib)

    def _row(self, gpu: int, key: Optional[str]) -> _Row:
        row = self.rows.get((gpu, key))
        if row is None:
            row = self.rows[(gpu, key)] = _Row()
        return row

    def record(self, node: str, instance_type: str, group: Optional[str]) -> Dict[str, Any]:
        """The window as one usage record (schema.py: "One usage record")."""
        refs = {key: str(i) for i, key in enumerate(sorted(self.workloads))}
        rows = [
            [
                gpu,
                refs[key] if key is not None else None,
                _r(row.held_s),
                _r(row.busy_s),
                _r(row.idle_s),
                _r(row.peak_mib),
            ]
            for (gpu, key), row in sorted(self.rows.items(), key=lambda item: (item[0][0], item[0][1] or ""))
        ]
        doc: Dict[str, Any] = {
            "v": schema.USAGE_RECORD_VERSION,
            "start": self.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "s": self.length_s,
            "node": node,
            "type": instance_type,
            "group": group,
            "gpus": self.gpus,
            "w": {ref: self.workloads[key].to_record() for key, ref in refs.items()},
            "u": rows,
        }
        if self.unknown:
            doc["gone"] = dict(self.unknown)
        return doc

    def team_hours(self) -> Dict[str, Tuple[float, float]]:
        """GPU-hours (allocated, busy) per team in the window; unallocated GPUs under TEAM_UNALLOCATED."""
        out: Dict[str, Tuple[float, float]] = {}
        for (_, key), row in self.rows.items():
            team = _series_team(self.workloads[key]) if key is not None else schema.TEAM_UNALLOCATED
            held, busy = out.get(team, (0.0, 0.0))
            out[team] = (held + row.held_s / 3600.0, busy + row.busy_s / 3600.0)
        return out


def split_record(record: Dict[str, Any], max_bytes: int = schema.USAGE_RECORD_MAX_BYTES) -> List[str]:
    """The record as one or more log messages of at most `max_bytes` (CloudWatch Logs refuses events over
    256 KB): a node with many time-sliced pods can pass it. Each part carries the rows of some GPUs and
    only the workloads they name; together they hold every row once (the report sums rows)."""
    text = json.dumps(record, separators=(",", ":"))
    rows = record["u"]
    if len(text.encode()) <= max_bytes or len(rows) < 2:
        return [text]
    half = len(rows) // 2
    parts = []
    for chunk in (rows[:half], rows[half:]):
        refs = {r[1] for r in chunk}
        part = dict(record, u=chunk, w={k: v for k, v in record["w"].items() if k in refs})
        parts.extend(split_record(part, max_bytes))
    return parts


def _series_team(workload: Workload) -> str:
    """The team a fleet-wide series is named by: an unnamed pod or a unit nobody runs as a user (a
    container's `docker-<id>.scope`) would make one series each, so they share TEAM_UNKNOWN (the record
    keeps the detail for the report)."""
    if (workload.kind == POD and not workload.namespace) or (workload.kind == UNIT and not workload.user):
        return schema.TEAM_UNKNOWN
    return workload.team


def _r(value: float) -> float:
    return round(value, 1)


def team_datums(hours: Dict[str, Tuple[float, float]], timestamp: datetime) -> List[Dict[str, Any]]:
    """The per-team series (dimension Team only, shared by the whole fleet): CloudWatch sums them."""
    datums = []
    for team, (held, busy) in sorted(hours.items()):
        dims = [{"Name": schema.DIM_TEAM, "Value": team[:255] or schema.TEAM_UNKNOWN}]
        for metric, value in ((schema.TEAM_GPU_HOURS_ALLOCATED, held), (schema.TEAM_GPU_HOURS_BUSY, busy)):
            datums.append(
                {
                    "MetricName": metric.name,
                    "Dimensions": dims,
                    "Timestamp": timestamp,
                    "Value": round(value, 6),
                    "Unit": metric.unit,
                    "StorageResolution": 60,
                }
            )
    return datums
