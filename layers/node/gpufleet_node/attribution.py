"""Whose work a GPU process is, read off /proc: the cgroup a process runs in names the Kubernetes pod, the
Slurm job, the systemd unit or the user session it belongs to; /proc/PID/status gives its uid when the
cgroup names nobody.

Why cgroups: container runtimes, Slurm's cgroup plugins and systemd all put a process in a cgroup whose
path carries its owner's id, and /proc/PID/cgroup is readable without an API server, a scheduler client or
extra privileges. Pod and container names come from the kubelet's log layout under /var/log
(pods/<namespace>_<pod>_<uid>/<container>/ and containers/<pod>_<namespace>_<container>-<id>.log), again
without an API call. Pod, namespace and container names are DNS labels or subdomains (no `_`), so those
names split without ambiguity.

Nothing here raises or blocks for long: a process that exits mid-read, a /proc mounted with hidepid, a pod
the logs do not name yet each give what could be known, and unknown() says why the rest is missing.
Results are cached per (pid, start time) so a reused pid is read afresh; the cache is bounded.
Python >= 3.9.
"""

import os
import pwd
import re
import threading
import time
from collections import OrderedDict
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from gpufleet_node.workload import POD, SLURM, UNIT, UNKNOWN, UNKNOWN_WORKLOAD, USER, Workload

Note = Tuple[str, str]  # (topic, reason), e.g. ("pods", "pod 1f0c... not found under /var/log/pods")

# Where each owner's cgroups really are, and so the only places their names are believed. A user may own
# a delegated subtree (user@.service, Delegate=yes) and name cgroups in it freely: a `kubepods/pod<uid>` or
# `slurm/uid_0/job_1` made there names nobody. So every pattern is anchored at its real root, and the
# outermost owner on a path wins (delegation only goes downward: who made the outer cgroup chose the inner).
#
# Kubernetes (kubelet, pkg/kubelet/cm): the pod cgroup is CgroupName{"kubepods", [<qos>,] "pod" + uid}
# (node_container_manager_linux.go defaultNodeAllocatableCgroupName "kubepods"; qos_container_manager_linux.go:
# "burstable" and "besteffort" under it, Guaranteed pods directly; pod_container_manager_linux.go
# podCgroupNamePrefix "pod"). cgroupfs driver: /kubepods[/<qos>]/pod<uid>/<container id> (ToCgroupfs).
# systemd driver (EKS AL2023): cgroup_manager_linux.go ToSystemd joins the parts with `-`, escapes `-` in
# each as `_` (escapeSystemdCgroupName) and expands the slice: /kubepods.slice[/kubepods-<qos>.slice]/
# kubepods[-<qos>]-pod<uid with _>.slice/<runtime>-<container id>.scope (SystemdPathPrefixOfRuntime:
# cri-containerd, crio; docker with cri-dockerd). Static pods: a 32-hex uid (a hash of their manifest).
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_KUBE_ROOTS = ("kubepods", "kubepods.slice")
_QOS = ("burstable", "besteffort")
_FS_POD = re.compile(r"^pod(%s)$" % _UID)
_SD_QOS = re.compile(r"^kubepods-(burstable|besteffort)\.slice$")
_SD_POD = re.compile(r"^(kubepods(?:-burstable|-besteffort)?)-pod(%s)\.slice$" % _UID)
# A container's: the bare id (cgroupfs) or `<runtime>-<id>.scope` (cri-containerd-, crio-, docker-).
_CONTAINER = re.compile(r"^(?:[a-z][a-z0-9-]*-)?([0-9a-f]{64})(?:\.scope)?$")
# Slurm cgroup/v2 (slurm.schedmd.com/cgroup_v2.html, "slurmd startup", "Hierarchy overview"): slurmd makes
# the scope `slurmstepd.scope` (`<node>_slurmstepd.scope` with --enable-multiple-slurmd) under system.slice:
# /system.slice/slurmstepd.scope/job_<id>/step_<s>/user/task_<n>, its waiting area .../system. Slurm >= 26.05
# names job cgroups by SLUID unless CgroupJobIdPaths=yes.
_SYSTEM_SLICE = "system.slice"
_STEPD_SCOPE = re.compile(r"^(?:.+_)?slurmstepd(?:_.+)?\.scope$")
_SLURM_JOB = re.compile(r"^job_([0-9]+)$")
_SLUID = re.compile(r"^s[0-9A-Za-z]{13}$")
# Slurm cgroup/v1 (slurm.schedmd.com/cgroups.html, cgroup.conf): per controller /slurm/uid_<uid>/job_<id>/
# step_<s>/task_<n>, `slurm_<node>` with several slurmd per host.
_SLURM_V1_ROOT = re.compile(r"^slurm(?:_[^/]+)?$")
_SLURM_UID = re.compile(r"^uid_([0-9]+)$")
# systemd's per-user slice (systemd.special(7): user-UID.slice under user.slice). Below it everything is the
# user's own (their user@.service is delegated to them): the uid wins over any pod or job named deeper.
_USER_SLICE = re.compile(r"^user-([0-9]+)\.slice$")
_RANK = {POD: 4, SLURM: 3, UNIT: 2, USER: 1, UNKNOWN: 0}
MAX_ENTRIES = 16384  # processes cached: 10,000 live GPU processes (issue 29) with room to spare
ENTRY_BYTES = (
    650  # measured (tracemalloc, CPython 3.11) for a pod's entry with a note: see tests/node/test_attribution_cache.py
)
KEEP_S = 120.0  # an entry not asked for this long belongs to a process that is gone


def parse_cgroup(text: str) -> Workload:
    """The owner named by the content of /proc/PID/cgroup, ids only: pod uid and container id, Slurm job
    (and uid on cgroup v1, in `user`), unit, or the uid of a user slice (in `user`). The most specific
    line wins (cgroup v1 lists one per hierarchy; the unified `0::` line first among equals); systemd
    delegates no v1 controller hierarchy to users, so one line cannot be forged against another."""
    best = UNKNOWN_WORKLOAD
    lines = sorted(text.splitlines(), key=lambda line: not line.startswith("0::"))
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            found = classify_path(parts[2])
            if _RANK[found.kind] > _RANK[best.kind]:
                best = found
    return best


def classify_path(path: str) -> Workload:
    """The owner of one cgroup path, walking down from the top: the first (outermost) owner found wins.
    A path read from inside a cgroup namespace starts with `..` (climbing from the reader's root to a
    common ancestor): what follows is a child of an ancestor of the publisher's own cgroup, which only
    root writes, so a kubelet or Slurm chain may start there at any of its levels."""
    segments = [s for s in path.strip().split("/") if s not in ("", ".")]
    climb = 0
    while climb < len(segments) and segments[climb] == "..":
        climb += 1
    rest = segments[climb:]
    if ".." in rest:  # the kernel writes `..` only as a prefix
        return UNKNOWN_WORKLOAD
    for i, segment in enumerate(rest):
        user = _USER_SLICE.match(segment)
        if user:
            return Workload(USER, user=user.group(1))
        if i == 0:
            rooted = _rooted(_completed(rest) if climb else rest)
            if rooted is not None:
                return rooted
        if segment.endswith(".service") and len(segment) > len(".service"):
            return Workload(UNIT, unit=segment)
        if segment.endswith(".scope") and i == 1 and rest[0] == _SYSTEM_SLICE:
            return Workload(UNIT, unit=segment)  # e.g. a container run by docker with the systemd driver
    return UNKNOWN_WORKLOAD


def _completed(rest: List[str]) -> List[str]:
    """A relative path with the root levels its chain starts below put back in front."""
    first = rest[0]
    if first in _QOS or _FS_POD.match(first):
        return ["kubepods", *rest]
    pod = _SD_POD.match(first)
    if pod and pod.group(1) != "kubepods":
        return ["kubepods.slice", pod.group(1) + ".slice", *rest]
    if pod or _SD_QOS.match(first):
        return ["kubepods.slice", *rest]
    if _STEPD_SCOPE.match(first):
        return [_SYSTEM_SLICE, *rest]
    if _SLURM_UID.match(first):
        return ["slurm", *rest]
    return rest


def _rooted(segments: List[str]) -> Optional[Workload]:
    """A pod or Slurm job whose chain starts at segments[0], the top; None when no such root is there.
    A real root with a malformed chain below names nobody (UNKNOWN, then the process's own uid)."""
    top = segments[0]
    if top in _KUBE_ROOTS:
        return _pod_chain(segments)
    nested = _under_cgroup_root(segments)
    if nested is not None:
        return _pod_chain(nested)
    if top.startswith("kubepods"):
        return UNKNOWN_WORKLOAD
    if top == _SYSTEM_SLICE and len(segments) > 1 and _STEPD_SCOPE.match(segments[1]):
        job = segments[2] if len(segments) > 2 else ""
        number = _SLURM_JOB.match(job)
        if number or _SLUID.match(job):
            return Workload(SLURM, job_id=number.group(1) if number else job)
        return Workload(UNIT, unit=segments[1])  # slurmstepd's own waiting area (`system`), no job
    if _SLURM_V1_ROOT.match(top):
        uid = _SLURM_UID.match(segments[1]) if len(segments) > 1 else None
        v1_job = _SLURM_JOB.match(segments[2]) if len(segments) > 2 else None
        if uid and v1_job:
            return Workload(SLURM, job_id=v1_job.group(1), user=uid.group(1))
        return UNKNOWN_WORKLOAD
    return None


def _under_cgroup_root(segments: List[str]) -> Optional[List[str]]:
    """The pod chain of a kubelet run with `--cgroup-root=/kubelet` (cgroupfs: /kubelet/kubepods/...; the
    systemd driver prefixes each level with the root's name: /kubelet.slice/kubelet-kubepods.slice/
    kubelet-kubepods-<qos>.slice/kubelet-kubepods-<qos>-pod<uid>.slice/...), as if at the top; else None.
    Still a root-owned top level: a user's delegated subtree cannot make it."""
    if len(segments) > 1 and segments[0] == "kubelet" and segments[1] == "kubepods":
        return segments[1:]
    if len(segments) > 1 and segments[0] == "kubelet.slice" and segments[1] == "kubelet-kubepods.slice":
        return [seg[len("kubelet-") :] if seg.startswith("kubelet-kubepods") else seg for seg in segments[1:]]
    return None


def _pod_chain(segments: List[str]) -> Workload:
    """/kubepods[/<qos>]/pod<uid>[/<id>] or its systemd form, the pod slice named after its parent."""
    at = 1
    if segments[0] == "kubepods":
        at += 1 if len(segments) > 1 and segments[1] in _QOS else 0
        found = _FS_POD.match(segments[at]) if at < len(segments) else None
        uid = found.group(1) if found else None
    else:
        parent = "kubepods"
        qos = _SD_QOS.match(segments[1]) if len(segments) > 1 else None
        if qos:
            parent, at = "kubepods-" + qos.group(1), 2
        pod = _SD_POD.match(segments[at]) if at < len(segments) else None
        uid = pod.group(2) if pod and pod.group(1) == parent else None
    if uid is None:
        return UNKNOWN_WORKLOAD
    nxt = _CONTAINER.match(segments[at + 1]) if at + 1 < len(segments) else None
    return Workload(POD, pod_uid=uid.replace("_", "-"), container_id=nxt.group(1) if nxt else None)


def start_time(stat: str) -> int:
    """Field 22 of /proc/PID/stat (clock ticks after boot); the comm in field 2 may hold spaces and `)`."""
    rest = stat[stat.rindex(")") + 1 :].split()
    return int(rest[19])


def real_uid(status: str) -> Optional[int]:
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def container_log_name(name: str) -> Optional[Tuple[str, str, str, str]]:
    """(pod, namespace, container, container id) from a /var/log/containers entry name, or None."""
    if not name.endswith(".log"):
        return None
    parts = name[: -len(".log")].split("_")
    if len(parts) != 3:
        return None
    pod, namespace, rest = parts
    container, dash, container_id = rest.rpartition("-")
    if not (pod and namespace and container and dash and container_id):
        return None
    return pod, namespace, container, container_id


def _passwd_name(uid: int) -> Optional[str]:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


class Notes:
    """What could not be known lately: per topic, the latest reason (and how many others) seen within
    window_s. Kept short: a few dozen reasons per topic at most."""

    def __init__(self, clock: Callable[[], float], window_s: float) -> None:
        self._clock = clock
        self._window_s = window_s
        self._seen: Dict[str, "OrderedDict[str, float]"] = {}
        self._lock = threading.Lock()

    def add(self, topic: str, reason: str) -> None:
        with self._lock:
            reasons = self._seen.setdefault(topic, OrderedDict())
            reasons.pop(reason, None)
            reasons[reason] = self._clock()
            while len(reasons) > 32:
                reasons.popitem(last=False)

    def current(self) -> Dict[str, str]:
        cutoff = self._clock() - self._window_s
        out: Dict[str, str] = {}
        with self._lock:
            for topic, reasons in self._seen.items():
                for stale in [r for r, at in reasons.items() if at < cutoff]:
                    del reasons[stale]
                if reasons:
                    latest = next(reversed(reasons))
                    more = len(reasons) - 1
                    out[topic] = latest + (" (and %d more)" % more if more else "")
        return out


class PodNames:
    """Namespace, pod and container names for a pod uid and container id, from the kubelet's log layout.
    Rescanned on a miss, at most every rescan_s."""

    def __init__(self, log_root: str, clock: Callable[[], float], rescan_s: float = 10.0) -> None:
        self._pods_dir = os.path.join(log_root, "pods")
        self._containers_dir = os.path.join(log_root, "containers")
        self._clock = clock
        self._rescan_s = rescan_s
        self._scanned_at: Optional[float] = None
        self._pods: Dict[str, Tuple[str, str]] = {}  # uid -> (namespace, pod)
        self._containers: Dict[str, Tuple[str, str, str]] = {}  # container id -> (namespace, pod, container)
        self._problem: Optional[str] = None

    def resolve(self, ident: Workload) -> Tuple[Workload, List[Note]]:
        """The pod workload with what names could be found, and notes on the rest."""
        named, notes = self._lookup(ident)
        due = self._scanned_at is None or self._clock() - self._scanned_at >= self._rescan_s
        if notes and due:
            self._scan()
            named, notes = self._lookup(ident)
        return named, notes

    def _lookup(self, ident: Workload) -> Tuple[Workload, List[Note]]:
        cid = ident.container_id
        found = self._containers.get(cid) if cid else None
        if found is None and cid:
            found = next((v for k, v in self._containers.items() if len(k) >= 12 and cid.startswith(k)), None)
        if found is not None:  # (the symlink name is cut at 255 bytes: a long one holds an id prefix)
            return ident.replace(namespace=found[0], pod=found[1], container=found[2]), []
        pod = self._pods.get(ident.pod_uid or "")
        if pod is None:
            return ident, [("pods", self._problem or "pod %s not found under %s" % (ident.pod_uid, self._pods_dir))]
        named = ident.replace(namespace=pod[0], pod=pod[1])
        containers = self._list("%s_%s_%s" % (pod[0], pod[1], ident.pod_uid), [])
        if len(containers) == 1:  # one container: it is this one (the sandbox's pause process logs nothing)
            return named.replace(container=containers[0]), []
        short = (cid or "?")[:12]
        note = "container %s of %s/%s not found under %s" % (short, pod[0], pod[1], self._containers_dir)
        return named, [("containers", note)]

    def _scan(self) -> None:
        self._scanned_at = self._clock()
        problems: List[str] = []  # why /var/log/pods could not be read (a missing containers/ only costs names)
        pods: Dict[str, Tuple[str, str]] = {}
        for name in self._list("", problems):
            parts = name.split("_")
            if len(parts) == 3 and all(parts):  # (the pre-1.14 layout, /var/log/pods/<uid>, names nothing)
                pods[parts[2]] = (parts[0], parts[1])
        containers: Dict[str, Tuple[str, str, str]] = {}
        for name in self._listdir(self._containers_dir, []):
            parsed = container_log_name(name)
            if parsed:
                containers[parsed[3]] = (parsed[1], parsed[0], parsed[2])
        self._pods, self._containers = pods, containers
        self._problem = problems[0] if problems else None

    def _list(self, pod_dir: str, problems: List[str]) -> List[str]:
        return self._listdir(os.path.join(self._pods_dir, pod_dir) if pod_dir else self._pods_dir, problems)

    @staticmethod
    def _listdir(path: str, problems: List[str]) -> List[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            problems.append("no %s: pod names unknown" % path)
        except PermissionError:
            problems.append("permission denied listing %s" % path)
        except OSError as exc:
            problems.append("cannot list %s: %s" % (path, exc.strerror or exc.__class__.__name__))
        return []


class _Entry:
    __slots__ = ("at", "complete", "notes", "start", "used", "workload")

    def __init__(self, start: int, workload: Workload, notes: List[Note], at: float) -> None:
        self.start = start
        self.workload = workload
        self.notes = notes
        self.complete = not notes
        self.at = at  # when it was read
        self.used = at  # when it was last asked for


class _ProcessGone(Exception):
    """The process could not be read (exited, hidden, denied); the message is the reason."""


class Attributor:
    """workload_of(pid) for the GPU processes NVML lists, cached per (pid, start time); unknown() for what
    could not be known within the last window_s. Incomplete answers (a pod not yet named) are retried
    after retry_s. Safe to call from several threads.

    The cache holds max_entries processes (MAX_ENTRIES: 10,000 live GPU processes with room to spare, about
    ENTRY_BYTES each, ~10 MiB full). When full, the least recently asked-for entry makes room only if it has
    not been asked for in keep_s (its process is gone: nobody calls prune()); otherwise the newcomer is
    answered but not kept. So more live processes than fit never thrash the cache: the ones kept keep
    hitting and only the overflow is read again each sample (and said, under `processes`)."""

    def __init__(
        self,
        proc_root: str = "/proc",
        log_root: str = "/var/log",
        user_name: Optional[Callable[[int], Optional[str]]] = None,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = MAX_ENTRIES,
        retry_s: float = 30.0,
        window_s: float = 300.0,
        keep_s: float = KEEP_S,
    ) -> None:
        self._proc_root = proc_root
        self._user_name = user_name or _passwd_name
        self._clock = clock
        self._max_entries = max_entries
        self._retry_s = retry_s
        self._keep_s = keep_s
        self._names = PodNames(log_root, clock)
        self._notes = Notes(clock, window_s)
        self._cache: "OrderedDict[int, _Entry]" = OrderedDict()
        self._users: Dict[int, str] = {}
        self._lock = threading.Lock()

    def workload_of(self, pid: int) -> Workload:
        """Never raises: UNKNOWN_WORKLOAD, with the reason noted, when the process cannot be read."""
        try:
            with self._lock:
                return self._workload_of(pid)
        except _ProcessGone as gone:
            self._notes.add("processes", str(gone))
        except Exception as exc:  # a bug here must not stop the sampling loop
            self._notes.add("processes", "cannot attribute pid %s: %s" % (pid, exc.__class__.__name__))
        return UNKNOWN_WORKLOAD

    def unknown(self) -> Dict[str, str]:
        """What could not be known lately, by topic (processes, pods, containers, users): short reasons."""
        return self._notes.current()

    def prune(self, live_pids: Iterable[int]) -> None:
        """Forget processes that are gone (the cache is bounded anyway)."""
        live = set(live_pids)
        with self._lock:
            for pid in [p for p in self._cache if p not in live]:
                del self._cache[pid]

    def _workload_of(self, pid: int) -> Workload:
        start = self._start(pid)
        entry = self._cache.get(pid)
        now = self._clock()
        if entry is not None and entry.start == start and (entry.complete or now - entry.at < self._retry_s):
            self._cache.move_to_end(pid)
        else:
            entry = self._read_entry(pid, start, now)
            self._keep(pid, entry, now)
        entry.used = now
        for topic, reason in entry.notes:
            self._notes.add(topic, reason)
        return entry.workload

    def _keep(self, pid: int, entry: _Entry, now: float) -> None:
        """Cache it, making room from an idle entry; when all are in use, answer without keeping."""
        if pid in self._cache or len(self._cache) < self._max_entries:
            self._cache[pid] = entry
            self._cache.move_to_end(pid)
            return
        oldest_pid, oldest = next(iter(self._cache.items()))
        if now - oldest.used >= self._keep_s:
            del self._cache[oldest_pid]
            self._cache[pid] = entry
            return
        self._notes.add(
            "processes",
            "more live GPU processes than the cache holds (%d): the rest are read again "
            "each sample" % self._max_entries,
        )

    def _read_entry(self, pid: int, start: int, now: float) -> _Entry:
        cgroup = self._read(pid, "cgroup")
        try:
            uid = real_uid(self._read(pid, "status"))
        except _ProcessGone:
            uid = None
        if self._start(pid) != start:
            raise _ProcessGone("pid %d was reused while it was read" % pid)
        workload, notes = self._resolve(parse_cgroup(cgroup), uid, pid)
        return _Entry(start, workload, notes, now)

    def _resolve(self, ident: Workload, uid: Optional[int], pid: int) -> Tuple[Workload, List[Note]]:
        notes: List[Note] = []
        if ident.kind == POD:
            return self._names.resolve(ident)
        if ident.kind == SLURM:  # cgroup/v1 names the uid; on v2 the task runs as the job's user
            owner = int(ident.user) if ident.user else uid
            return ident.replace(user=self._user(owner, notes)), notes
        if ident.kind == USER:
            return ident.replace(user=self._user(int(ident.user or 0), notes)), notes
        if ident.kind == UNIT:  # a unit run by a user is charged to the user; root's to the unit
            return ident.replace(user=self._user(uid, notes) if uid else None), notes
        if uid is not None:
            return Workload(USER, user=self._user(uid, notes)), notes
        return UNKNOWN_WORKLOAD, [("processes", "pid %d: no owner in its cgroup and no Uid in its status" % pid)]

    def _user(self, uid: Optional[int], notes: List[Note]) -> Optional[str]:
        if uid is None:
            return None
        name = self._users.get(uid)
        if name is None:
            try:
                found = self._user_name(uid)
            except Exception:  # an injected or NSS lookup that fails: the number still says who
                found = None
            if len(self._users) >= self._max_entries:
                self._users.clear()
            # a failed lookup is remembered too (as the number): a slow directory (LDAP, SSSD) answering
            # "no such user" must not be asked again for every new process on the sampling thread
            name = self._users[uid] = found if found is not None else str(uid)
            if found is None:
                notes.append(("users", "uid %d has no name" % uid))
        return name

    def _start(self, pid: int) -> int:
        try:
            return start_time(self._read(pid, "stat"))
        except (ValueError, IndexError):
            raise _ProcessGone("cannot parse %s" % os.path.join(self._proc_root, str(pid), "stat")) from None

    def _read(self, pid: int, name: str) -> str:
        path = os.path.join(self._proc_root, str(pid), name)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return f.read()
        except (FileNotFoundError, ProcessLookupError):
            raise _ProcessGone("process %d exited before it was read" % pid) from None
        except PermissionError:
            raise _ProcessGone("permission denied reading %s" % path) from None
        except OSError as exc:
            raise _ProcessGone("cannot read %s: %s" % (path, exc.strerror or exc.__class__.__name__)) from None
