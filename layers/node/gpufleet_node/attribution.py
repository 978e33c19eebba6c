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

# A pod's cgroup: `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd). Static
# pods have a 32-hex uid (a hash of their manifest) instead of a UUID.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD = re.compile(r"(?:^|-)pod(%s)(?:\.slice)?$" % _UID)
# A container's: the bare id (cgroupfs) or `<runtime>-<id>.scope` (cri-containerd-, crio-, docker-).
_CONTAINER = re.compile(r"^(?:[a-z][a-z0-9-]*-)?([0-9a-f]{64})(?:\.scope)?$")
# Slurm cgroup/v2: <slice>/[<node>_]slurmstepd.scope/job_<id> or /<SLUID>/step_<s>/user/task_<n>
_STEPD_SCOPE = re.compile(r"^(?:.+_)?slurmstepd(?:_.+)?\.scope$")
_SLURM_JOB = re.compile(r"^job_([0-9]+)$")
_SLUID = re.compile(r"^s[0-9A-Za-z]{13}$")  # Slurm >= 26.05 names job cgroups by SLUID unless CgroupJobIdPaths
_SLURM_UID = re.compile(r"^uid_([0-9]+)$")  # cgroup/v1: /slurm[_<node>]/uid_<uid>/job_<id>/step_<s>/task_<n>
_USER_SLICE = re.compile(r"^user-([0-9]+)\.slice$")
_RANK = {POD: 4, SLURM: 3, UNIT: 2, USER: 1, UNKNOWN: 0}


def parse_cgroup(text: str) -> Workload:
    """The owner named by the content of /proc/PID/cgroup, ids only: pod uid and container id, Slurm job
    (and uid on cgroup v1, in `user`), unit, or the uid of a user slice (in `user`). The most specific
    line wins (cgroup v1 lists one per hierarchy; the unified `0::` line first among equals)."""
    best = UNKNOWN_WORKLOAD
    lines = sorted(text.splitlines(), key=lambda line: not line.startswith("0::"))
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            found = _classify_path(parts[2])
            if _RANK[found.kind] > _RANK[best.kind]:
                best = found
    return best


def _classify_path(path: str) -> Workload:
    segments = [s for s in path.strip().split("/") if s not in ("", ".", "..")]
    for find in (_pod_in, _slurm_in, _user_in, _unit_in):
        found = find(segments)
        if found is not None:
            return found
    return UNKNOWN_WORKLOAD


def _pod_in(segments: List[str]) -> Optional[Workload]:
    for i, segment in enumerate(segments):
        pod = _POD.search(segment)
        if pod and any("kubepods" in s for s in segments[:i]):  # also nested: /kubelet.slice/..., /docker/<id>/
            nxt = _CONTAINER.match(segments[i + 1]) if i + 1 < len(segments) else None
            uid = pod.group(1).replace("_", "-")
            return Workload(POD, pod_uid=uid, container_id=nxt.group(1) if nxt else None)
    return None


def _slurm_in(segments: List[str]) -> Optional[Workload]:
    for i, segment in enumerate(segments):
        if _STEPD_SCOPE.match(segment):
            job = segments[i + 1] if i + 1 < len(segments) else ""
            number = _SLURM_JOB.match(job)
            if number or _SLUID.match(job):
                return Workload(SLURM, job_id=number.group(1) if number else job)
            return Workload(UNIT, unit=segment)  # slurmstepd's own waiting area (`system`), no job
        if segment.startswith("slurm"):
            uid = None
            for later in segments[i + 1 :]:
                user = _SLURM_UID.match(later)
                uid = user.group(1) if user else uid
                v1_job = _SLURM_JOB.match(later)
                if v1_job:
                    return Workload(SLURM, job_id=v1_job.group(1), user=uid)
    return None


def _user_in(segments: List[str]) -> Optional[Workload]:
    for segment in segments:
        user = _USER_SLICE.match(segment)
        if user:
            return Workload(USER, user=user.group(1))
    return None


def _unit_in(segments: List[str]) -> Optional[Workload]:
    for i, segment in enumerate(segments):
        if segment.endswith(".service") and len(segment) > len(".service"):
            return Workload(UNIT, unit=segment)
        if segment.endswith(".scope") and i > 0 and segments[i - 1] == "system.slice":
            return Workload(UNIT, unit=segment)  # e.g. a container run by docker with the systemd driver
    return None


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
    __slots__ = ("at", "complete", "notes", "start", "workload")

    def __init__(self, start: int, workload: Workload, notes: List[Note], at: float) -> None:
        self.start = start
        self.workload = workload
        self.notes = notes
        self.complete = not notes
        self.at = at


class _ProcessGone(Exception):
    """The process could not be read (exited, hidden, denied); the message is the reason."""


class Attributor:
    """workload_of(pid) for the GPU processes NVML lists, cached per (pid, start time); unknown() for what
    could not be known within the last window_s. Incomplete answers (a pod not yet named) are retried
    after retry_s. Safe to call from several threads."""

    def __init__(
        self,
        proc_root: str = "/proc",
        log_root: str = "/var/log",
        user_name: Optional[Callable[[int], Optional[str]]] = None,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 4096,
        retry_s: float = 30.0,
        window_s: float = 300.0,
    ) -> None:
        self._proc_root = proc_root
        self._user_name = user_name or _passwd_name
        self._clock = clock
        self._max_entries = max_entries
        self._retry_s = retry_s
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
            self._cache[pid] = entry
            self._cache.move_to_end(pid)
            while len(self._cache) > self._max_entries:
                self._cache.popitem(last=False)
        for topic, reason in entry.notes:
            self._notes.add(topic, reason)
        return entry.workload

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
