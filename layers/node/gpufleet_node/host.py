"""The host under the GPUs: memory, swap and the fullest local filesystem, read without root.

Memory from /proc/meminfo as free(1) counts it: used = MemTotal - MemAvailable (the kernel's own estimate
of what could be had without swapping, page cache included; proc(5)). Swap from SwapTotal and SwapFree,
none when SwapTotal is 0 (the EKS AMIs and the DLAMI run without swap). Disks with statvfs(3), as df(1)
computes "Use%": (blocks - bfree) / (blocks - bfree + bavail), so the root-reserved blocks count as full
for the jobs that cannot use them. One reading a sample tick costs a 1.5 KB read and a statvfs per
filesystem: microseconds.

`HostDetail` decides, window by window, which of the node's OWN host series are sent in `detail:
adaptive` (the group's are always sent); thresholds and why in schema.py (ADAPTIVE_HOST_GROUP_METRICS).
Paths are injectable: tests use files in a temporary directory. Python >= 3.9.
"""

import logging
import os
import threading
from typing import Callable, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Set, Tuple

from gpufleet_node import schema
from gpufleet_node.aggregate import Scopes, Window, add_host_sample
from gpufleet_node.efa import EfaDeltas

log = logging.getLogger("gpufleet.publisher")


class DiskUse(NamedTuple):
    path: str
    used_percent: float


class HostSample(NamedTuple):
    memory_used_percent: Optional[float]
    swap_used_percent: Optional[float]  # None: the node has no swap
    disk_used_percent: Optional[float]  # the fullest filesystem; None: none could be read
    disks: Tuple[DiskUse, ...] = ()


def parse_meminfo(text: str) -> Dict[str, int]:
    """'MemTotal:  1000 kB' lines -> {"MemTotal": 1000} (kB); lines that do not parse are skipped."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        fields = rest.split()
        if sep and fields and fields[0].isdigit():
            out[name.strip()] = int(fields[0])
    return out


def memory_percents(info: Dict[str, int]) -> Tuple[Optional[float], Optional[float]]:
    """(memory used %, swap used % or None). A kernel older than 3.14 has no MemAvailable: then free +
    buffers + page cache, what free(1) did before it."""
    total = info.get("MemTotal", 0)
    memory = None
    if total > 0:
        available = info.get("MemAvailable")
        if available is None:
            available = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
        memory = _clamp(100.0 * (total - available) / total)
    swap_total = info.get("SwapTotal", 0)
    swap = _clamp(100.0 * (swap_total - info.get("SwapFree", swap_total)) / swap_total) if swap_total > 0 else None
    return memory, swap


def disk_percent(blocks: int, bfree: int, bavail: int) -> Optional[float]:
    """df's Use%: used over what non-root users could have; None for an empty (pseudo) filesystem."""
    used = blocks - bfree
    if blocks <= 0 or used + bavail <= 0:
        return None
    return _clamp(100.0 * used / (used + bavail))


def _clamp(value: float) -> float:
    return min(100.0, max(0.0, value))


StatVfs = Callable[[str], "os.statvfs_result"]
Stat = Callable[[str], "os.stat_result"]


class HostReader:
    """Reads the host once per sample tick. `filesystems`: mount points to watch (missing ones are
    skipped; one device counted once). `meminfo`, `statvfs` and `stat` are injectable for tests."""

    def __init__(
        self,
        filesystems: Iterable[str] = schema.DEFAULT_HOST_FILESYSTEMS,
        meminfo: str = "/proc/meminfo",
        statvfs: StatVfs = os.statvfs,
        stat: Stat = os.stat,
        root: str = "",
    ) -> None:
        self.filesystems = tuple(filesystems)
        self.meminfo = meminfo
        self.statvfs = statvfs
        self.stat = stat
        self.root = root  # a prefix for the filesystem paths (tests)
        self._failed: Set[str] = set()  # said once each

    def read(self) -> HostSample:
        memory, swap = self._memory()
        disks = tuple(self._disks())
        fullest = max((d.used_percent for d in disks), default=None)
        return HostSample(memory, swap, fullest, disks)

    def _memory(self) -> Tuple[Optional[float], Optional[float]]:
        try:
            with open(self.meminfo, encoding="ascii", errors="replace") as f:
                return memory_percents(parse_meminfo(f.read(16384)))
        except OSError as exc:
            self._once(self.meminfo, exc)
            return None, None

    def _disks(self) -> List[DiskUse]:
        seen: Set[int] = set()
        out = []
        for path in self.filesystems:
            full = self.root + path
            try:
                device = self.stat(full).st_dev
                if device in seen:
                    continue
                seen.add(device)
                st = self.statvfs(full)
            except FileNotFoundError:
                continue  # not on this kind of node (no instance store, no containerd)
            except OSError as exc:
                self._once(full, exc)
                continue
            percent = disk_percent(st.f_blocks, st.f_bfree, st.f_bavail)
            if percent is not None:
                out.append(DiskUse(path, percent))
        return out

    def _once(self, what: str, exc: OSError) -> None:
        if what not in self._failed:
            self._failed.add(what)
            log.warning("cannot read %s (%s): its host metric is left out", what, exc)


class HostDetail:
    """Which of the node's own host series are on, with hysteresis per metric (schema.HOST_DETAIL_THRESHOLDS).
    `update` folds in each closed window's maxima; `always` (full/essential detail, or detail switched on
    for the instance) keeps them all on."""

    def __init__(
        self,
        thresholds: Optional[Dict[str, Tuple[float, float]]] = None,
        always: bool = False,
    ) -> None:
        self.thresholds = dict(schema.HOST_DETAIL_THRESHOLDS if thresholds is None else thresholds)
        for name, (on, off) in self.thresholds.items():
            if not 0 <= off < on <= 100:
                raise ValueError("%s: host detail needs 0 <= off < on <= 100 (hysteresis)" % name)
        self.always = always
        self._on: Set[str] = set()

    def update(self, maxima: Dict[str, Optional[float]]) -> FrozenSet[str]:
        """`maxima`: metric name -> the window's maximum (None: not sampled in the window: unchanged)."""
        for name, (on, off) in self.thresholds.items():
            peak = maxima.get(name)
            if peak is None:
                continue
            if peak >= on:
                self._on.add(name)
            elif peak < off:
                self._on.discard(name)
        return self.current

    @property
    def current(self) -> FrozenSet[str]:
        return frozenset(self.thresholds) if self.always else frozenset(self._on)


_EFA_SENT = (("rx_bytes", schema.HOST_EFA_RX_BYTES), ("tx_bytes", schema.HOST_EFA_TX_BYTES))


class HostFeed:
    """The publisher's host side: a reading each sample tick into the open window (the same PutMetricData
    as the GPUs), the last reading for the Prometheus endpoint, and at each window's close the bytes the
    node's EFA devices moved (sent in `detail: full` only). Without a reader or EFA it does nothing."""

    def __init__(self, reader: Optional[HostReader] = None, efa: Optional[EfaDeltas] = None) -> None:
        self.reader = reader
        self.efa = efa
        self.latest: Optional[HostSample] = None

    def sample(self, window: Optional[Window], scopes: Scopes, lock: "threading.Lock") -> None:
        if self.reader is None or window is None:
            return
        self.latest = self.reader.read()  # outside the lock: a slow filesystem never holds the XID thread
        with lock:
            add_host_sample(window, scopes, self.latest)

    def close(self, window: Window, scopes: Scopes, detail: str) -> None:
        """EFA: the window's bytes per direction, summed over devices (read once per window)."""
        if self.efa is None or detail != schema.DETAIL_FULL:
            return
        delta = self.efa.delta()
        for name, metric in _EFA_SENT:
            if name in delta:
                window.count(metric, [scopes.instance], float(delta[name]))
