"""Attribution on the node: each sample's processes and kubelet allocations become holders of each GPU,
summed into a usage window (usage.py); each closed window goes out as one log record plus the per-team
series. Never blocks sampling: the owners of processes are cached per PID, the kubelet is read by its
own thread, and anything unknown is written into the record's `gone` instead of stopping anything.
Python >= 3.9.
"""

import logging
import re
from datetime import datetime, timedelta
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from gpufleet_node import schema
from gpufleet_node.aggregate import window_start
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import GpuSample
from gpufleet_node.podresources import Allocations
from gpufleet_node.sender import Sender
from gpufleet_node.usage import Holder, UsageWindow, split_record, team_datums
from gpufleet_node.workload import POD, UNKNOWN, Workload

log = logging.getLogger("gpufleet.publisher")

MAX_GAP_FACTOR = 10  # a sample stands for at most this many intervals (a stalled loop is not usage)


class Allocated:
    """The pods the kubelet gave one GPU, indexed once (per kubelet answer, not per process): by (namespace,
    pod) so that placing a process is one lookup. Before, each process scanned every holder: quadratic in
    time-sliced holders (issue 29)."""

    __slots__ = ("by_pod", "workloads")

    def __init__(self, workloads: Iterable[Workload] = ()) -> None:
        self.workloads: List[Workload] = list(workloads)
        self.by_pod: Dict[Tuple[Optional[str], Optional[str]], List[Workload]] = {}
        for w in self.workloads:
            self.by_pod.setdefault((w.namespace, w.pod), []).append(w)


NONE_ALLOCATED = Allocated()


def index_allocations(allocations: Optional[Allocations]) -> Dict[str, Allocated]:
    """Device id -> its holders, indexed: built once for each kubelet answer (every refresh_s)."""
    if allocations is None:
        return {}
    index = {device: Allocated([w]) for device, w in allocations.by_device.items()}
    index.update((device, Allocated(held)) for device, held in allocations.shared.items() if held)
    return index


def _placed(w: Workload, allocated: Allocated) -> Workload:
    """The allocated pod a process belongs to when its own identity is incomplete: its pod named but not
    its container (a pod with several containers), or its pod unnamed, or its owner unknown. Counting it
    apart would show the pod as holding an idle GPU it is in fact using."""
    if w.kind == POD and w.namespace and w.pod and not w.container:
        same = allocated.by_pod.get((w.namespace, w.pod), ())
        return same[0] if len(same) == 1 else w
    if len(allocated.workloads) == 1 and (w.kind == UNKNOWN or (w.kind == POD and not w.namespace)):
        return allocated.workloads[0]
    return w


def merge_holders(processes: Sequence[Holder], allocated: Union[Allocated, Sequence[Workload]]) -> List[Holder]:
    """Processes' owners plus the pods the kubelet allocated the GPU to, one holder per workload. Linear
    in processes plus holders."""
    if not isinstance(allocated, Allocated):
        allocated = Allocated(allocated)
    holders: Dict[str, Holder] = {}
    for h in processes:
        w = _placed(h.workload, allocated)
        mine = holders.get(w.key)
        if mine is None:
            holders[w.key] = Holder(w, h.memory_mib, h.sm_util, h.processes)
            continue
        mine.memory_mib += h.memory_mib
        mine.processes += h.processes
        mine.sm_util = None if mine.sm_util is None or h.sm_util is None else mine.sm_util + h.sm_util
    for w in allocated.workloads:
        if w.key not in holders:
            holders[w.key] = Holder(w)
    return list(holders.values())


def _allocation_notes(allocations: Allocations) -> Dict[str, str]:
    """What the kubelet's answer leaves unknown, as the record's `gone` entries."""
    notes = {"allocations " + topic: _category(note) for topic, note in allocations.notes.items()}
    if allocations.unknown:
        notes["allocations"] = allocations.unknown
    if any(device.startswith("MIG-") for device in allocations.by_device):
        notes["allocations mig"] = "MIG devices allocated: not matched to their GPU yet"
    return notes


def _category(reason: str) -> str:
    """A reason without its PIDs, UIDs and ids, so a report can count them instead of listing each."""
    return re.sub(r"\b[0-9a-f]{12,}\b|\d+", "N", reason)[:200]


class UsageTracker:
    """Folds samples into the current usage window and submits it when the window is over."""

    def __init__(
        self,
        attributor: Any,
        pod_resources: Optional[Any],
        uuids: Sequence[str],
        log_sender: Sender,
        metric_sender: Sender,
        window_s: int = schema.USAGE_WINDOW_S,
        sample_s: float = 1.0,
        jobs: Optional[Any] = None,
    ) -> None:
        self.attributor = attributor
        self.jobs = jobs  # slurm_jobs.SlurmJobs on a Slurm node: each job's account and partition
        self.pod_resources = pod_resources
        self.uuids = list(uuids)
        self.log_sender = log_sender
        self.metric_sender = metric_sender
        self.window_s = window_s
        self.sample_s = sample_s
        self.window: Optional[UsageWindow] = None
        self.current: Dict[int, List[Holder]] = {}  # the latest holders per GPU (the Prometheus endpoint)
        self._last: Optional[datetime] = None
        self._dt = sample_s
        self._allocations: Optional[Allocations] = None
        self._indexed: Optional[Allocations] = None  # the kubelet answer self._index was built from
        self._index: Dict[str, Allocated] = {}
        self.records = 0

    def begin(self, now: datetime, identity: Identity) -> None:
        """Start a sampling round: close the window if it is over (written as `identity`: the publisher's,
        which changes when the tags are read again), and take the round's allocations."""
        self._dt = self.sample_s
        if self._last is not None:
            self._dt = max(0.0, min((now - self._last).total_seconds(), MAX_GAP_FACTOR * self.sample_s))
        self._last = now
        start = window_start(now, self.window_s)
        if self.window is not None and self.window.start != start:
            self.close(now, identity)
        if self.window is None:
            self.window = UsageWindow(start, self.window_s, len(self.uuids))
        self._allocations = None
        if self.pod_resources is not None:
            self._allocations = self.pod_resources.current()
            self.window.unknown.update(_allocation_notes(self._allocations))
        if self._allocations is not self._indexed:  # a new kubelet answer (every refresh_s): index it once
            self._indexed, self._index = self._allocations, index_allocations(self._allocations)

    def add(self, index: int, sample: GpuSample) -> None:
        """One GPU's sample of this round."""
        if self.window is None:
            return
        if sample.lost:  # still paid for: counted unallocated and idle, and said
            self.current.pop(index, None)
            self.window.add(index, self._dt, 0.0, [])
            self.window.unknown["lost"] = "GPU %d lost (fell off the bus): counted unallocated" % index
            return
        holders = self.holders(index, sample)
        self.current[index] = holders
        self.window.add(index, self._dt, sample.utilization, holders)

    def holders(self, index: int, sample: GpuSample) -> List[Holder]:
        procs = [
            Holder(self.attributor.workload_of(p.pid), p.memory_mib or 0.0, p.sm_util, 1)
            for p in sample.processes or ()
        ]
        uuid = self.uuids[index] if index < len(self.uuids) else ""
        return merge_holders(procs, self._index.get(uuid, NONE_ALLOCATED))

    def close(self, now: datetime, identity: Identity) -> None:
        """Submit the open window (also at shutdown): its record to Logs, its team hours as metrics."""
        window, self.window = self.window, None
        if window is None or not window.rows:
            return
        for topic, reason in self.attributor.unknown().items():
            window.unknown[topic] = _category(reason)
        if self.jobs is not None:
            self.jobs.enrich(window.workloads)
        record = window.record(identity.instance_id, identity.instance_type, identity.group_key())
        stamp = int(window.start.timestamp() * 1000)
        events = [{"timestamp": stamp, "message": text} for text in split_record(record)]
        # aged from the window's end: a buffer as short as one window still keeps it until it is sent
        self.log_sender.submit(window.start + timedelta(seconds=window.length_s), events, now)
        # queued, not sent: they go out in the same PutMetricData as the next closed metrics window
        self.metric_sender.enqueue(window.start, team_datums(window.team_hours(), window.start))
        self.records += 1
