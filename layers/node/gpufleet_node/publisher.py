"""The publisher loop: sample every GPU each second, close a window each minute, hand it to the sender.

`Publisher.step(now)` does one sampling round and, at a window boundary, closes the window and submits
it; `run()` calls it on the wall clock until stopped, with the sender on a thread of its own so the
network never delays a sample. Tests, the rehearsal and the benchmarks drive `step` with a simulated
clock (windows are then sent inline). XID events are counted by a background thread into the current
window. In `detail: adaptive` a `DetailSelector` decides at each close which GPUs send their own series.
With `caller` (the credentials' aws:userid) a window with a GPU fault also sends that fault into the node's
own namespace (schema.node_namespace), which only this instance's credentials may write: the OOM guard
replaces an instance for a GPU fault only when it finds it there (docs/node-publisher.md, "IAM").
Python >= 3.9.
"""

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Optional, Tuple

from gpufleet_node import schema
from gpufleet_node.aggregate import GpuCounters, Scopes, Window, add_high_resolution, add_sample, window_start
from gpufleet_node.detail import DetailSelector
from gpufleet_node.host import HostFeed
from gpufleet_node.identity import Identity
from gpufleet_node.sender import Sender, Ticks, WallClock
from gpufleet_node.tracker import UsageTracker

log = logging.getLogger("gpufleet.publisher")

DETAIL_GPUS = ("auto", "always")
# What a window aggregates in adaptive mode: everything it may send, nothing else (less work per sample).
_ADAPTIVE_ONLY = (
    schema.ADAPTIVE_INSTANCE_METRICS + schema.DETAIL_GPU_METRICS + schema.EVENT_COUNTERS + schema.HOST_METRICS
)


_AGGREGATED = {
    schema.DETAIL_ESSENTIAL: schema.ESSENTIAL_METRICS + schema.HOST_METRICS,
    schema.DETAIL_ADAPTIVE: _ADAPTIVE_ONLY,
}
_FAULTS = frozenset(m.name for m in schema.HEALTH_EVENT_METRICS)  # what the guard replaces an instance for


def fault_datums(window: Window) -> List[Dict[str, Any]]:
    """The window's non-zero GPU fault counters, per GPU, as GPUFaultReported{InstanceId, GpuIndex, Fault}
    (what the guard reads back to corroborate a finding). Empty in a healthy window, so the own namespace
    costs nothing while the GPUs are well."""
    out: List[Dict[str, Any]] = []
    for (name, dims), total in sorted(window.counters.items()):
        if name in _FAULTS and total > 0 and tuple(k for k, _ in dims) == schema.GPU_DIMENSIONS:
            out.append(
                {
                    "MetricName": schema.GPU_FAULT_REPORTED.name,
                    "Dimensions": [{"Name": k, "Value": v} for k, v in (*dims, (schema.DIM_FAULT, name))],
                    "Timestamp": window.start,
                    "Unit": schema.GPU_FAULT_REPORTED.unit,
                    "Value": total,
                }
            )
    return out


def _corroborate(witness: Optional[Sender], window: Window, now: datetime) -> None:
    """A minute's GPU faults also into the node's own namespace (nothing sent while healthy)."""
    faults = fault_datums(window) if witness is not None and window.storage_resolution == 60 else []
    if witness is not None and faults:
        witness.submit(window.start, faults, now)


def witness_sender(sender: Sender, caller: Optional[str], instance_id: str) -> Optional[Sender]:
    """A sender into the node's own namespace, when `caller` is this instance's own aws:userid
    ("ROLEID:<instance id>"); None otherwise, said once (other credentials could not corroborate it)."""
    if not caller:
        return None
    if not caller.endswith(":" + instance_id):
        log.warning(
            "credentials are not this instance's profile (aws:userid %s does not end in :%s); publishing without "
            "GPU fault corroboration: the OOM guard will not replace this node for a GPU fault",
            caller,
            instance_id,
        )
        return None
    return Sender(sender.cloudwatch, max_buffer_age=sender.max_buffer_age, namespace=schema.node_namespace(caller))


def _check(detail: str, detail_gpus: str, sender: Sender, window_s: int) -> None:
    if detail not in schema.DETAIL_MODES:
        raise ValueError("detail must be one of %s" % ", ".join(schema.DETAIL_MODES))
    if detail_gpus not in DETAIL_GPUS:
        raise ValueError("detail_gpus must be 'auto' or 'always'")
    if sender.max_buffer_age <= timedelta(seconds=window_s):
        raise ValueError("the sender's buffer must keep windows longer than one window, or none is ever sent")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Publisher:
    """One node's publisher. The library default for `detail` stays "full" (what the rehearsal and the
    controller's integration tests were written against); the service's default comes from the config
    file, where it is "adaptive" (schema.DEFAULT_DETAIL)."""

    def __init__(
        self,
        backend: Any,
        identity: Identity,
        sender: Sender,
        window_s: int = 60,
        high_resolution: bool = False,
        high_resolution_sender: Optional[Sender] = None,
        detail: str = schema.DETAIL_FULL,
        detail_gpus: str = "auto",
        memory_on_percent: float = schema.DETAIL_MEMORY_ON_PERCENT,
        memory_off_percent: float = schema.DETAIL_MEMORY_OFF_PERCENT,
        usage: Optional[UsageTracker] = None,
        caller: Optional[str] = None,
        host: Optional[HostFeed] = None,
    ) -> None:
        _check(detail, detail_gpus, sender, window_s)
        self.host = host or HostFeed()  # memory, swap, disk (and EFA in `full`): in the same PutMetricData
        self.witness = witness_sender(sender, caller, identity.instance_id)  # the node's own namespace
        self.usage = usage  # attribution: who holds each GPU, one record per usage window
        self.latest: Dict[int, Any] = {}  # the last sample per GPU (the Prometheus endpoint reads it)
        self.last_xid: Dict[int, int] = {}
        self.detail = detail
        self.detail_gpus = detail_gpus
        self.only = _AGGREGATED.get(detail)
        self.backend = backend
        self.identity = identity
        self.sender = sender
        self.window_s = window_s
        self.high_resolution = high_resolution
        self.hr_sender = high_resolution_sender or sender
        self.scopes = Scopes(identity.instance_id, identity.group_dimensions(), detail)
        self.selector: Optional[DetailSelector] = None
        always = detail_gpus == "always" or identity.detail_on()
        if detail == schema.DETAIL_ADAPTIVE:
            self.selector = DetailSelector(self.scopes, memory_on_percent, memory_off_percent, always=always)
        self.counters = GpuCounters()
        self.gpus = 0
        self.window: Optional[Window] = None
        self.hr_window: Optional[Window] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._xid_thread: Optional[threading.Thread] = None
        self.xid_count = 0
        self._pending_xids: Dict[int, List[int]] = {}

    def start(self, xid_thread: bool = True) -> int:
        """Initialise NVML (raises NvmlUnavailable) and the XID listener."""
        self.gpus = self.backend.init()
        log.info(
            "publishing %d GPU(s) of %s (%s) as %s, driver %s, detail %s",
            self.gpus,
            self.identity.instance_id,
            self.identity.instance_type or "?",
            self.identity.group_dimensions() or "no group",
            self.backend.driver_version(),
            self.detail,
        )
        if xid_thread and self.backend.open_events():
            self._xid_thread = threading.Thread(target=_listen_xids, args=(self,), name="nvml-xid", daemon=True)
            self._xid_thread.start()
        return self.gpus

    def set_identity(self, identity: Identity) -> None:
        """New tags (the group found after a failed lookup, detail switched on or off): applies from the
        next sample on."""
        with self._lock:
            self.identity = identity
            self.scopes = Scopes(identity.instance_id, identity.group_dimensions(), self.detail)
            if self.selector is not None:
                self.selector.scopes = self.scopes
                self.selector.always = self.detail_gpus == "always" or identity.detail_on()
        log.info("identity now %s, detail tag %s", identity.group_dimensions() or "no group", identity.detail)

    def _new_window(self, start: datetime, resolution: int = 60) -> Window:
        w = Window(start, storage_resolution=resolution, only=self.only if resolution == 60 else None)
        if resolution == 60:
            for i in range(self.gpus):  # explicit zeros, so an XID alarm has data to evaluate (full/essential)
                codes = self._pending_xids.pop(i, [])
                w.count(schema.GPU_XID_ERRORS, self.scopes.for_metric(schema.GPU_XID_ERRORS, i), float(len(codes)))
                critical = sum(code in schema.CRITICAL_XIDS for code in codes)
                if critical:
                    w.count(schema.GPU_HEALTH_EVENTS, self.scopes.summary(), float(critical))
                    w.critical_xid_gpus.add(i)
            w.count(schema.NVML_UP, [self.scopes.instance], 1.0)
        return w

    # ---- one round ----

    def step(self, now: datetime) -> None:
        """Sample every GPU once at `now`; close and submit windows whose time is up (outside the lock:
        the XID thread never waits for a send)."""
        if self.usage is not None:  # first: its team series ride along with the metrics window closed below
            self.usage.begin(now, self.identity)
        with self._lock:
            closed = self._roll(now)
        self._submit(closed, now)
        for index in range(self.gpus):
            sample = self.backend.sample(index)
            self.latest[index] = sample
            if self.usage is not None:
                self.usage.add(index, sample)
            with self._lock:
                add_sample(self.window, self.scopes, index, sample, self.counters)  # type: ignore[arg-type]
                if self.hr_window is not None:
                    add_high_resolution(self.hr_window, self.scopes, index, sample)
        self.host.sample(self.window, self.scopes, self._lock)

    def _roll(self, now: datetime) -> List[Tuple[Window, Sender]]:
        closed = []
        start = window_start(now, self.window_s)
        if self.window is not None and self.window.start != start:
            self.host.close(self.window, self.scopes, self.detail)
            closed.append((self.window, self.sender))
            self.window = None
        if self.window is None:
            self.window = self._new_window(start)
        if self.high_resolution:
            hr_start = window_start(now, 10)
            if self.hr_window is not None and self.hr_window.start != hr_start:
                closed.append((self.hr_window, self.hr_sender))
                self.hr_window = None
            if self.hr_window is None:
                self.hr_window = self._new_window(hr_start, resolution=1)
        return closed

    def _submit(self, closed: List[Tuple[Window, Sender]], now: datetime) -> None:
        for window, sender in closed:
            keep = None
            if self.selector is not None:
                if window.storage_resolution == 60:
                    self.selector.update(window, self.gpus)
                keep = self.selector.keep()
            sender.submit(window.start, window.datums(window.start, keep), now)
            _corroborate(self.witness, window, now)

    def finish(self, now: datetime) -> None:
        """Close the open windows (on shutdown) and make a last attempt to send."""
        self._stop.set()
        if self.usage is not None:
            self.usage.close(now, self.identity)
        self.close_windows(now)

    def close_windows(self, now: datetime) -> None:
        with self._lock:
            closed = [(w, s) for w, s in ((self.window, self.sender), (self.hr_window, self.hr_sender)) if w]
            self.window = self.hr_window = None
        self._submit(closed, now)

    # ---- XIDs ----

    def record_xid(self, gpu_index: int, code: int) -> None:
        self.xid_count += 1
        self.last_xid[gpu_index] = code
        # NVML's event carries the GPU and the XID code; the PID, when there is one, is only in the
        # kernel log (dmesg "NVRM: Xid ... pid=...").
        log.error("XID %d on GPU %d (see the kernel log for the process)", code, gpu_index)
        if not 0 <= gpu_index < self.gpus:
            return
        with self._lock:
            if self.window is not None:
                self.window.count(schema.GPU_XID_ERRORS, self.scopes.for_metric(schema.GPU_XID_ERRORS, gpu_index))
                if code in schema.CRITICAL_XIDS:
                    self.window.count(schema.GPU_HEALTH_EVENTS, self.scopes.summary())
                    self.window.critical_xid_gpus.add(gpu_index)
            else:  # between windows: counted in the next one, never lost
                self._pending_xids.setdefault(gpu_index, []).append(code)

    # ---- the service loop ----

    def run(self, sample_interval_s: float = 1.0, clock: WallClock = utcnow, monotonic: Ticks = time.monotonic) -> None:
        """Sample on a fixed cadence (no drift: the next round is scheduled from the monotonic clock);
        the senders run on their own thread meanwhile, their buffer ages on the same monotonic clock."""
        extra = [s for s in (self.usage.log_sender if self.usage else None, self.witness) if s is not None]
        senders = {id(s): s for s in (self.sender, self.hr_sender, *extra)}.values()
        for sender in senders:
            sender.start_background(clock, monotonic=monotonic)
        next_round = monotonic()
        while not self._stop.is_set():
            try:
                self.step(clock())
            except Exception:  # a bug in one round must not end the service; systemd would restart it anyway
                log.exception("sampling round failed")
            next_round += sample_interval_s
            delay = next_round - monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_round = monotonic()  # fell behind: skip, do not burst
        self.finish(clock())
        for sender in senders:
            sender.stop_background(clock())

    def stop(self) -> None:
        self._stop.set()


def _listen_xids(publisher: Publisher) -> None:
    """The XID thread: NVML's events counted into the current window until the publisher stops."""
    while not publisher._stop.is_set():
        event = publisher.backend.wait_xid(1000)
        if event is not None:
            publisher.record_xid(event.gpu_index, event.code)


def simulate(publisher: Publisher, start: datetime, seconds: int, every_s: float = 1.0) -> List[datetime]:
    """Drive a publisher with a simulated clock (tests, rehearsal, benchmark): no sleeping."""
    times = []
    t = 0.0
    while t < seconds:
        now = start + timedelta(seconds=t)
        publisher.step(now)
        times.append(now)
        t += every_s
    return times
