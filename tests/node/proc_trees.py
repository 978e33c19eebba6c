"""Fake /proc and /var/log trees for the attribution tests (Python >= 3.9), in the real formats: the
kernel's /proc/PID/stat, status and cgroup files, and the kubelet's pod log directories and
/var/log/containers symlinks. Plus the cgroup paths real nodes put processes in, by kind."""

import os
import pickle
import select
import signal
from pathlib import Path
from typing import Any, Callable, Dict, Optional

POD_UID = "5f6c0d2e-8a1b-4c3d-9e7f-0123456789ab"
OTHER_POD_UID = "0a1b2c3d-4e5f-4061-8273-94a5b6c7d8e9"
STATIC_POD_UID = "2b7e151628aed2a6abf7158809cf4f3c"  # static pods: a hash of the manifest, no dashes
CID = "3f1a" + "c0ffee" * 10
OTHER_CID = "9b2e" + "decade" * 10
V1_CONTROLLERS = (
    "12:hugetlb",
    "11:memory",
    "10:devices",
    "9:pids",
    "8:perf_event",
    "7:net_cls,net_prio",
    "6:cpuset",
    "5:blkio",
    "4:cpu,cpuacct",
    "3:freezer",
    "2:misc",
    "1:name=systemd",
)


def systemd_pod(uid: str, cid: str, qos: str = "burstable", runtime: str = "cri-containerd") -> str:
    """kubelet with the systemd cgroup driver (EKS AL2023): `-` in the uid becomes `_`."""
    pod = uid.replace("-", "_")
    if qos == "guaranteed":
        return "/kubepods.slice/kubepods-pod%s.slice/%s-%s.scope" % (pod, runtime, cid)
    return "/kubepods.slice/kubepods-%s.slice/kubepods-%s-pod%s.slice/%s-%s.scope" % (qos, qos, pod, runtime, cid)


def cgroupfs_pod(uid: str, cid: str, qos: str = "burstable") -> str:
    if qos == "guaranteed":
        return "/kubepods/pod%s/%s" % (uid, cid)
    return "/kubepods/%s/pod%s/%s" % (qos, uid, cid)


def v2(path: str) -> str:
    return "0::%s\n" % path


def v1(path: str, systemd_path: Optional[str] = None, unified: str = "/") -> str:
    """A cgroup v1 (hybrid) file: one line per hierarchy, the unified one last."""
    lines = []
    for controller in V1_CONTROLLERS:
        lines.append("%s:%s" % (controller, systemd_path if systemd_path and "systemd" in controller else path))
    lines.append("0::%s" % unified)
    return "\n".join(lines) + "\n"


def stat_line(pid: int, comm: str, start: int) -> str:
    """/proc/PID/stat as the kernel writes it: 52 fields, the comm in parentheses (may hold spaces, `)`)."""
    fields = [str(pid), "(%s)" % comm, "S", "1", str(pid), str(pid), "0", "-1", "4194560", "51234", "0", "12", "0"]
    fields += ["8123", "942", "0", "0", "20", "0", "37", "0", str(start), "35184372088832", "1048576"]
    fields += ["18446744073709551615", "94355023712256", "94355026377456", "140733193388032", "0", "0", "0"]
    fields += ["0", "16781314", "0", "0", "0", "17", "11", "0", "0", "0", "0", "0", "94355028474560"]
    fields += ["94355028524080", "94355043323904", "140733193392543", "140733193392617", "140733193392617"]
    fields += ["140733193396190", "0"]
    return " ".join(fields) + "\n"


def status_text(pid: int, comm: str, uid: int) -> str:
    return (
        "Name:\t%s\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t%d\nNgid:\t0\nPid:\t%d\nPPid:\t1\nTracerPid:\t0\n"
        "Uid:\t%d\t%d\t%d\t%d\nGid:\t%d\t%d\t%d\t%d\nFDSize:\t256\nGroups:\t\nVmRSS:\t  812340 kB\nThreads:\t37\n"
    ) % (comm[:15], pid, pid, uid, uid, uid, uid, uid, uid, uid, uid)


class ProcTree:
    """A fake /proc (proc_root) and /var/log (log_root) under one directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.proc_root = str(root / "proc")
        self.log_root = str(root / "log")
        os.makedirs(self.proc_root, exist_ok=True)

    def process(self, pid: int, cgroup: str, uid: int = 0, start: int = 4242, comm: str = "python3 train.py") -> None:
        where = Path(self.proc_root) / str(pid)
        where.mkdir(parents=True, exist_ok=True)
        (where / "stat").write_text(stat_line(pid, comm, start))
        (where / "status").write_text(status_text(pid, comm, uid))
        (where / "cgroup").write_text(cgroup)

    def exit(self, pid: int, keep_stat: bool = False) -> None:
        """The process is gone (or half gone: only stat left, as when it exits between two reads)."""
        where = Path(self.proc_root) / str(pid)
        for name in ("cgroup", "status") + (() if keep_stat else ("stat",)):
            (where / name).unlink()
        if not keep_stat:
            where.rmdir()

    def pod_logs(self, namespace: str, pod: str, uid: str, containers: Dict[str, Optional[str]]) -> None:
        """What the kubelet writes: pods/<ns>_<pod>_<uid>/<container>/0.log and, for a container whose id
        is given, the symlink containers/<pod>_<ns>_<container>-<id>.log pointing at it."""
        pods = Path(self.log_root) / "pods" / ("%s_%s_%s" % (namespace, pod, uid))
        links = Path(self.log_root) / "containers"
        links.mkdir(parents=True, exist_ok=True)
        for container, cid in containers.items():
            (pods / container).mkdir(parents=True, exist_ok=True)
            log = pods / container / "0.log"
            log.write_text("2026-01-01T00:00:00.000000000Z stdout F step 1\n")
            if cid:
                os.symlink(str(log), str(links / ("%s_%s_%s-%s.log" % (pod, namespace, container, cid))))


CHILD_WAIT_S = 20.0  # a child that has not answered by then is stuck (see run_unprivileged); only then waited
CHILD_TRIES = 3


def run_unprivileged(fn: Callable[[], Any]) -> Any:
    """fn() as an ordinary user (nobody) even when the tests run as root, who could read anything.

    It forks, and the tests that use it fork beside gRPC's threads (a fake kubelet serving): a child can
    inherit a lock one of those threads held and never run (seen once in a CI run, stuck for good on a
    futex). Such a child is killed and the fork tried again; a child that answers is never waited on."""
    if os.geteuid() != 0:
        return fn()
    for _ in range(CHILD_TRIES):
        answer = _in_child(fn)
        if answer is not None:
            return pickle.loads(answer)
    raise TimeoutError("the unprivileged child never answered (%d forks)" % CHILD_TRIES)


def _in_child(fn: Callable[[], Any]) -> "bytes | None":
    """The child's pickled answer, or None when it did not answer in CHILD_WAIT_S (it is killed)."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        try:
            os.setgid(65534)
            os.setuid(65534)
            payload = pickle.dumps(fn())
        except BaseException as exc:
            payload = pickle.dumps(repr(exc))
        while payload:
            payload = payload[os.write(write_end, payload) :]
        os._exit(0)
    os.close(write_end)
    chunks = []
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], CHILD_WAIT_S)
            if not ready:
                os.kill(child, signal.SIGKILL)
                return None
            chunk = os.read(read_end, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(read_end)
        os.waitpid(child, 0)
