"""The publisher loop: sample every GPU each second, close a window each minute, send it.

`Publisher.step(now)` does one sampling round and, at a window boundary, closes and flushes the
window; `run()` calls it on the wall clock until stopped. Tests and the rehearsal drive `step` with a
simulated clock. XID events are counted by a background thread into the current window.
Python >= 3.9.
"""

import logging
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Dict, List, Optional

from gpufleet_node import schema
from gpufleet_node.aggregate import GpuCounters, Scopes, Window, add_sample
from gpufleet_node.identity import Identity
from gpufleet_node.sender import Sender

log = logging.getLogger("gpufleet.publisher")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def window_start(now: datetime, length_s: int) -> datetime:
    epoch = int(now.timestamp())
    return datetime.fromtimestamp(epoch - epoch % length_s, timezone.utc)


class Publisher:
    def __init__(
        self,
        backend: Any,
        identity: Identity,
        sender: Sender,
        window_s: int = 60,
        high_resolution: bool = False,
        high_resolution_sender: Optional[Sender] = None,
        detail: str = "full",
    ) -> None:
        if detail not in ("full", "essential"):
            raise ValueError("detail must be 'full' or 'essential'")
        self.only = schema.ESSENTIAL_METRICS if detail == "essential" else None
        self.backend = backend
        self.identity = identity
        self.sender = sender
        self.window_s = window_s
        self.high_resolution = high_resolution
        self.hr_sender = high_resolution_sender or sender
        self.scopes = Scopes(identity.instance_id, identity.group_dimensions())
        self.counters = GpuCounters()
        self.gpus = 0
        self.window: Optional[Window] = None
        self.hr_window: Optional[Window] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._xid_thread: Optional[threading.Thread] = None
        self.xid_count = 0
        self._pending_xids: Dict[int, int] = {}

    def start(self, xid_thread: bool = True) -> int:
        """Initialise NVML (raises NvmlUnavailable) and the XID listener."""
        self.gpus = self.backend.init()
        log.info(
            "publishing %d GPU(s) of %s (%s) as %s, driver %s",
            self.gpus,
            self.identity.instance_id,
            self.identity.instance_type or "?",
            self.identity.group_dimensions() or "no group",
            self.backend.driver_version(),
        )
        if xid_thread and self.backend.open_events():
            self._xid_thread = threading.Thread(target=self._listen_xids, name="nvml-xid", daemon=True)
            self._xid_thread.start()
        return self.gpus

    def _new_window(self, start: datetime, resolution: int = 60) -> Window:
        w = Window(start, storage_resolution=resolution, only=self.only if resolution == 60 else None)
        if resolution == 60:
            for i in range(self.gpus):  # explicit zeros, so an XID alarm has data to evaluate
                pending = self._pending_xids.pop(i, 0)
                w.count(schema.GPU_XID_ERRORS, self.scopes.for_metric(schema.GPU_XID_ERRORS, i), float(pending))
            w.count(schema.NVML_UP, [self.scopes.instance], 1.0)
        return w

    # ---- one round ----

    def step(self, now: datetime) -> None:
        """Sample every GPU once at `now`; close and send windows whose time is up."""
        start = window_start(now, self.window_s)
        with self._lock:
            if self.window is not None and self.window.start != start:
                self._close(self.window, self.sender, now)
                self.window = None
            if self.window is None:
                self.window = self._new_window(start)
            if self.high_resolution:
                hr_start = window_start(now, 10)
                if self.hr_window is not None and self.hr_window.start != hr_start:
                    self._close(self.hr_window, self.hr_sender, now)
                    self.hr_window = None
                if self.hr_window is None:
                    self.hr_window = self._new_window(hr_start, resolution=1)
        for index in range(self.gpus):
            sample = self.backend.sample(index)
            with self._lock:
                add_sample(self.window, self.scopes, index, sample, self.counters)
                if self.hr_window is not None:
                    self._observe_high_resolution(self.hr_window, index, sample)

    def _observe_high_resolution(self, window: Window, index: int, sample: Any) -> None:
        if sample.lost:
            return
        used_percent = None
        if sample.memory_total_mib and sample.memory_used_mib is not None:
            used_percent = 100.0 * sample.memory_used_mib / sample.memory_total_mib
        values = {schema.GPU_UTILIZATION: sample.utilization, schema.GPU_MEMORY_USED_PERCENT: used_percent}
        for metric in schema.HIGH_RESOLUTION_METRICS:
            window.observe(metric, self.scopes.for_metric(metric, index), values[metric])

    def _close(self, window: Window, sender: Sender, now: datetime) -> None:
        sender.enqueue(window.start, window.datums(window.start))
        sender.flush(now)

    def finish(self, now: datetime) -> None:
        """Close the open windows (on shutdown) and make a last attempt to send."""
        self._stop.set()
        self.close_windows(now)

    def close_windows(self, now: datetime) -> None:
        with self._lock:
            for window, sender in ((self.window, self.sender), (self.hr_window, self.hr_sender)):
                if window is not None:
                    self._close(window, sender, now)
            self.window = self.hr_window = None

    # ---- XIDs ----

    def record_xid(self, gpu_index: int, code: int) -> None:
        self.xid_count += 1
        # NVML's event carries the GPU and the XID code; the PID, when there is one, is only in the
        # kernel log (dmesg "NVRM: Xid ... pid=...").
        log.error("XID %d on GPU %d (see the kernel log for the process)", code, gpu_index)
        if not 0 <= gpu_index < self.gpus:
            return
        with self._lock:
            if self.window is not None:
                dims = self.scopes.for_metric(schema.GPU_XID_ERRORS, gpu_index)
                self.window.count(schema.GPU_XID_ERRORS, dims, 1.0)
            else:  # between windows: counted in the next one, never lost
                self._pending_xids[gpu_index] = self._pending_xids.get(gpu_index, 0) + 1

    def _listen_xids(self) -> None:
        while not self._stop.is_set():
            event = self.backend.wait_xid(1000)
            if event is not None:
                self.record_xid(event.gpu_index, event.code)

    # ---- the service loop ----

    def run(self, sample_interval_s: float = 1.0, clock: Callable[[], datetime] = utcnow) -> None:
        """Sample on a fixed cadence (no drift: the next round is scheduled from the monotonic clock)."""
        next_round = time.monotonic()
        while not self._stop.is_set():
            try:
                self.step(clock())
            except Exception:  # a bug in one round must not end the service; systemd would restart it anyway
                log.exception("sampling round failed")
            next_round += sample_interval_s
            delay = next_round - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_round = time.monotonic()  # fell behind: skip, do not burst
        self.finish(clock())

    def stop(self) -> None:
        self._stop.set()


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
