"""Which GPUs (and which of the node's own host series) send in `detail: adaptive`, window by window. Pure.

CloudWatch bills a custom metric for every hour in which it receives data, so a GPU's own series cost
money only in the hours they are sent. The controller's routine decisions read instance and group
aggregates; a GPU's own series matter while its memory is high (the OOM guard names the GPU and its top
process), after a health event, or when someone switched detail on to look at the node. The thresholds
and the reasoning behind them are in schema.py (DETAIL_MEMORY_ON_PERCENT and below).
Python >= 3.9.
"""

from datetime import datetime, timedelta
from typing import Dict, FrozenSet, Set

from gpufleet_node import schema
from gpufleet_node.aggregate import Keep, Scopes, Window, adaptive_keep
from gpufleet_node.host import HostDetail

# Health events besides XIDs (whose counter counts every code; the critical ones are flagged per window).
_HEALTH_COUNTERS = tuple(m for m in schema.HEALTH_EVENT_METRICS if m is not schema.GPU_XID_ERRORS)


class DetailSelector:
    """Remembers, per GPU, whether its memory is above the threshold (with hysteresis) and until when a
    health event keeps it in detail; `update` folds in each closed window."""

    def __init__(
        self,
        scopes: Scopes,
        on_percent: float = schema.DETAIL_MEMORY_ON_PERCENT,
        off_percent: float = schema.DETAIL_MEMORY_OFF_PERCENT,
        health_hold_s: int = schema.DETAIL_HEALTH_HOLD_S,
        always: bool = False,
    ) -> None:
        if not 0 <= off_percent < on_percent <= 100:
            raise ValueError("detail needs 0 <= off_percent < on_percent <= 100 (hysteresis)")
        self.scopes = scopes
        self.on_percent = on_percent
        self.off_percent = off_percent
        self.health_hold = timedelta(seconds=health_hold_s)
        self.always = always
        self._memory: Set[int] = set()
        self._health_until: Dict[int, datetime] = {}
        self.current: FrozenSet[int] = frozenset()
        self.host = HostDetail()  # the node's own host series: on only under pressure (host.py)

    def update(self, window: Window, gpus: int) -> FrozenSet[int]:
        """The GPUs in detail for this (closed, 60 s) window. It counts already: the window in which a
        GPU crosses the threshold or has an event sends that GPU's series."""
        for index in range(gpus):
            dims = self.scopes.gpu(index)
            peak = window.maximum(schema.GPU_MEMORY_USED_PERCENT, dims)
            if peak is not None and peak >= self.on_percent:
                self._memory.add(index)
            elif peak is not None and peak < self.off_percent:
                self._memory.discard(index)
            if index in window.critical_xid_gpus or any(window.total(m, dims) > 0 for m in _HEALTH_COUNTERS):
                self._health_until[index] = window.start + self.health_hold
        for index, until in list(self._health_until.items()):
            if window.start >= until:
                del self._health_until[index]
        if self.always:
            self.current = frozenset(range(gpus))
        else:
            self.current = frozenset(self._memory | set(self._health_until))
        self.host.always = self.always
        self.host.update({m.name: window.maximum(m, self.scopes.instance) for m in schema.HOST_METRICS})
        return self.current

    def keep(self) -> Keep:
        """The datum filter for the GPUs currently in detail (also used for the 10 s windows), and for
        the node's own host series that are on."""
        return adaptive_keep(self.current, self.host.current)
