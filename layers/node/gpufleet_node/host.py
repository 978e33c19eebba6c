"""The host under the GPUs: memory, swap and the fullest local filesystem, read without root.

Memory from /proc/meminfo as free(1) counts it: used = MemTotal - MemAvailable (the kernel's own estimate
of what could be had without swapping, page cache included; proc(5)). Swap from SwapTotal and SwapFree,
none when SwapTotal is 0 (the EKS AMIs and the DLAMI run without swap). Disks with statvfs(3), as df(1)
computes "Use%": (blocks - bfree) / (blocks - bfree + bavail), so the root-reserved blocks count as full
for the jobs that cannot use them. One reading a sample tick costs a 1.5 KB read, a read of
/proc/self/mountinfo and a stat and statvfs per filesystem: microseconds, a millisecond on a node with
a thousand mounts.

A filesystem must never stop GPU sampling. stat(2) and statfs(2) on a hard-mounted NFS (EFS, FSx for
ONTAP/OpenZFS) or Lustre (FSx for Lustre) whose server stopped answering block in D state for as long
as the mount retries, forever by default (nfs(5): "hard"); a FUSE daemon that hangs does the same. So:
a path whose mount (the longest mount point above it in /proc/self/mountinfo, proc(5)) is of a network,
cluster or FUSE type is never read, with one warning naming it; and the disk reads run on a daemon
worker thread, the sampling thread waiting at most DISK_DEADLINE_S. While a read is still hung no new
one starts (one stuck thread at most), the disk is reported unknown and that is said once.

`HostDetail` decides, window by window, which of the node's OWN host series are sent in `detail:
adaptive` (the group's are always sent); thresholds and why in schema.py (ADAPTIVE_HOST_GROUP_METRICS).
Paths are injectable: tests use files in a temporary directory. Python >= 3.9.
"""

import logging
import os
import posixpath
import queue
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, NamedTuple, Optional, Set, Tuple

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

DISK_DEADLINE_S = 0.5  # the sampling thread's longest wait for the disk reads (local ones take microseconds)
MOUNTINFO = "/proc/self/mountinfo"
# Filesystem types whose stat/statfs may wait on a server or a daemon: NFS (EFS and FSx for ONTAP and
# OpenZFS mount as nfs4), SMB, Lustre (FSx for Lustre), Ceph, GlusterFS, GPFS, BeeGFS, AFS, 9p, the
# shared-disk cluster filesystems (their lock manager waits on the cluster), and every FUSE mount
# ("fuse", "fuse.<daemon>": sshfs, s3fs, mountpoint-s3, ...). Local disks are ext4, xfs, btrfs, ...
NETWORK_FS_TYPES = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "lustre",
        "ceph",
        "glusterfs",
        "gpfs",
        "beegfs",
        "afs",
        "9p",
        "ocfs2",
        "gfs2",
        "fuse",
    }
)


def is_network_fs(fstype: str) -> bool:
    return fstype in NETWORK_FS_TYPES or fstype.startswith("fuse.")


def _unescape(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes (\\040 ...)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def parse_mountinfo(text: str) -> List[Tuple[str, str]]:
    """(mount point, filesystem type) per line of /proc/self/mountinfo, in mount order (proc(5): field 5
    is the mount point; the type is the first field after the "-" separator)."""
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 7 or "-" not in fields[6:]:
            continue
        dash = fields.index("-", 6)
        if dash + 1 < len(fields):
            out.append((_unescape(fields[4]), fields[dash + 1]))
    return out


def mount_type(path: str, mounts: List[Tuple[str, str]]) -> Optional[str]:
    """The type of the filesystem `path` is on: its longest mount point prefix, the later mount at the
    same point winning (it hides the earlier). Pure string work: nothing on the path is touched."""
    path = posixpath.normpath(path)
    best: Optional[Tuple[str, str]] = None
    for point, fstype in mounts:
        above = path == point or path.startswith(point.rstrip("/") + "/")
        if above and (best is None or len(point) >= len(best[0])):
            best = (point, fstype)
    return best[1] if best else None


class _Job:
    def __init__(self, call: Callable[[], Any]) -> None:
        self.call = call
        self.result: Any = None
        self.done = threading.Event()


class Worker:
    """One daemon thread that runs one call at a time; `run` waits for it at most a deadline. A call
    still running (hung in the kernel: a thread cannot be killed) refuses the next, so at most one
    thread is ever stuck."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: "queue.Queue[_Job]" = queue.Queue()
        self._thread: Optional[threading.Thread] = None
        self._job: Optional[_Job] = None

    def busy(self) -> bool:
        return self._job is not None and not self._job.done.is_set()

    def run(self, call: Callable[[], Any], deadline_s: float) -> Tuple[bool, Any]:
        """(True, the call's result) if it ended within `deadline_s`; (False, None) if not, or if the
        previous call has not ended yet (then nothing new starts)."""
        if self.busy():
            return False, None
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()
        job = self._job = _Job(call)
        self._jobs.put(job)
        return (True, job.result) if job.done.wait(deadline_s) else (False, None)

    def wait(self, timeout_s: float) -> bool:
        """True once no call is running (tests: the hung call was let go)."""
        job = self._job
        return job is None or job.done.wait(timeout_s)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.result = job.call()
            except Exception:  # a bug must not kill the worker: this round's disks are unknown
                log.exception("reading the host's filesystems failed")
            finally:
                job.done.set()


class HostReader:
    """Reads the host once per sample tick. `filesystems`: mount points to watch (missing ones are
    skipped; one device counted once; network ones never read). `meminfo`, `statvfs`, `stat`,
    `mountinfo` and `deadline_s` are injectable for tests."""

    def __init__(
        self,
        filesystems: Iterable[str] = schema.DEFAULT_HOST_FILESYSTEMS,
        meminfo: str = "/proc/meminfo",
        statvfs: StatVfs = os.statvfs,
        stat: Stat = os.stat,
        root: str = "",
        mountinfo: str = MOUNTINFO,
        deadline_s: float = DISK_DEADLINE_S,
    ) -> None:
        self.filesystems = tuple(filesystems)
        self.meminfo = meminfo
        self.statvfs = statvfs
        self.stat = stat
        self.root = root  # a prefix for the filesystem paths (tests)
        self.mountinfo = mountinfo
        self.deadline_s = deadline_s
        self.worker = Worker("host-disks")
        self._reading: Optional[str] = None  # the path the worker is on (named when it hangs)
        self._hung = False
        self._failed: Set[str] = set()  # said once each

    def read(self) -> HostSample:
        memory, swap = self._memory()
        disks = tuple(self._disks_in_time())
        fullest = max((d.used_percent for d in disks), default=None)
        return HostSample(memory, swap, fullest, disks)

    def _memory(self) -> Tuple[Optional[float], Optional[float]]:
        try:
            with open(self.meminfo, encoding="ascii", errors="replace") as f:
                return memory_percents(parse_meminfo(f.read(16384)))
        except OSError as exc:
            self._once(self.meminfo, exc)
            return None, None

    def _disks_in_time(self) -> List[DiskUse]:
        """The disks from the worker, or none (unknown) when it did not answer within the deadline."""
        done, disks = self.worker.run(self._disks, self.deadline_s)
        if done:
            if self._hung:
                log.warning("the host's filesystems answer again: the disk metric is back")
                self._hung = False
            return disks or []
        if not self._hung:
            self._hung = True
            log.warning(
                "reading %s took over %.1f s (a hung network filesystem?): the disk metric is unknown "
                "until it returns; GPU sampling goes on",
                self._reading or "the host's filesystems",
                self.deadline_s,
            )
        return []

    def _disks(self) -> List[DiskUse]:
        """Runs on the worker thread."""
        mounts = self._mounts()
        seen: Set[int] = set()
        out = []
        for path in self.filesystems:
            fstype = mount_type(path, mounts)
            if fstype is not None and is_network_fs(fstype):
                self._say_once(path, "%s is on %s, a network or FUSE filesystem: not read (it could hang)", fstype)
                continue
            full = self._reading = self.root + path
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
            finally:
                self._reading = None
            percent = disk_percent(st.f_blocks, st.f_bfree, st.f_bavail)
            if percent is not None:
                out.append(DiskUse(path, percent))
        return out

    def _mounts(self) -> List[Tuple[str, str]]:
        """The mount table; none (every path read, the deadline still guarding) where it cannot be read."""
        try:
            with open(self.mountinfo, encoding="utf-8", errors="replace") as f:
                return parse_mountinfo(f.read())
        except OSError as exc:
            self._once(self.mountinfo, exc)
            return []

    def _once(self, what: str, exc: OSError) -> None:
        self._say_once(what, "cannot read %s (%s): its host metric is left out", exc)

    def _say_once(self, what: str, message: str, detail: Any) -> None:
        if what not in self._failed:
            self._failed.add(what)
            log.warning(message, what, detail)


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
