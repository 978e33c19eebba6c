"""`gpufleet-node busy -- COMMAND`: a queue worker's job keeps its node. Python >= 3.9.

While COMMAND runs, this instance carries a busy mark, and the mark is dropped when it ends - on success,
on failure, and when the helper is stopped with SIGTERM (forwarded to COMMAND, which decides how to stop).
The exit code is COMMAND's (128+N when a signal N ended it, as shells report it).

Why a mark: AWS recommends instance scale-in protection for queue workers ("Scaling based on Amazon SQS",
"Use instance scale-in protection", EC2 Auto Scaling user guide), but SetInstanceProtection cannot be
scoped to the caller's own instance (IAM has no condition key for the instance or the value), so a node
allowed to protect itself could unprotect any other node of a managed group. The mark is one DynamoDB
item in schema.BUSY_TABLE keyed by this instance's own aws:userid ("ROLEID:i-..."); the node policy lets
a node write only that key (`dynamodb:LeadingKeys`). The scaler reads the marks with a consistent read on
every tick and again right before every removal, never removes a marked node, and turns each mark into
scale-in protection (so Auto Scaling's own scale-in passes it over too), which it clears when the mark goes.

Several jobs on one node (two workers, or nested calls) share the mark: each holder is a file in the
state directory (default /run/gpufleet-busy), taken and dropped under an flock. The first holder writes
the mark, the last one to leave deletes it. A holder whose helper and COMMAND are both gone (the helper
killed with SIGKILL, the node rebooted) is pruned by the next one to leave, so a lost holder does not keep
the node past the next job; while its COMMAND still runs it still counts. Until a later job leaves, the
mark stays: the scaler tells on-call of a mark older than a day (its `since`) and still obeys it.

If the mark cannot be written (no permission, IMDS or the API unreachable, credentials that are not the
instance profile's), COMMAND runs anyway with one warning on stderr - the job matters more than the node's
tenure - unless `--strict` says to refuse (exit 75, EX_TEMPFAIL, COMMAND not run).
"""

import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Dict, List, Optional

from gpufleet_node import schema

EXIT_TEMPFAIL = 75  # sysexits.h EX_TEMPFAIL: --strict and the protection could not be set
EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # as shells: the command could not be run
DEFAULT_STATE_DIR = "/run/gpufleet-busy"
ENV_STATE_DIR = "GPUFLEET_BUSY_DIR"
FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class ProtectionFailed(RuntimeError):
    pass


class BusyMark:
    """This instance's busy mark: PutItem / DeleteItem of the item keyed by its own aws:userid in
    schema.BUSY_TABLE (the only key the node policy lets it write)."""

    def __init__(
        self, client: Any, userid: str, instance_id: str, asg_name: str, table: str = schema.BUSY_TABLE
    ) -> None:
        self.client = client
        self.userid = userid
        self.instance_id = instance_id
        self.asg_name = asg_name
        self.table = table

    def set(self, busy: bool) -> None:
        key = {schema.BUSY_KEY: {"S": self.userid}}
        try:
            if busy:
                since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")  # told when a mark outlives a day
                item = dict(key, instance={"S": self.instance_id}, asg={"S": self.asg_name}, since={"S": since})
                self.client.put_item(TableName=self.table, Item=item)
            else:
                self.client.delete_item(TableName=self.table, Key=key)
        except Exception as exc:  # botocore's ClientError, EndpointConnectionError, NoCredentialsError ...
            raise ProtectionFailed(
                "%s of the busy mark %s in %s failed: %s"
                % ("PutItem" if busy else "DeleteItem", self.userid, self.table, exc)
            ) from None


def _started(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid it names
    one process, so a reused pid is not taken for a holder that is gone. None when it cannot be read."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int, started: Optional[str]) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as exc:
        if exc.errno != errno.EPERM:  # EPERM: it exists, as another user's
            return False
    return started is None or _started(pid) in (None, started)


class Holders:
    """Who holds this node busy: one JSON file per job in `state_dir`, changed only under `state_dir/lock`."""

    def __init__(self, state_dir: str, name: Optional[str] = None) -> None:
        self.state_dir = state_dir
        self.name = name or str(os.getpid())  # this job's file: one helper process, one job
        self._mine: Optional[str] = None

    def _locked(self) -> int:
        os.makedirs(self.state_dir, mode=0o777, exist_ok=True)
        fd = os.open(os.path.join(self.state_dir, "lock"), os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def _live(self) -> List[str]:
        """The live holders' files; dead ones are removed (both their helper and their command are gone)."""
        live = []
        for name in sorted(os.listdir(self.state_dir)):
            if not name.endswith(".holder"):
                continue
            path = os.path.join(self.state_dir, name)
            try:
                with open(path) as f:
                    doc = json.load(f)
                pids = [(int(p["pid"]), p.get("started")) for p in doc["processes"]]
            except (OSError, ValueError, KeyError, TypeError):
                pids = []  # half-written or foreign: treated as gone
            if path == self._mine or any(_alive(pid, started) for pid, started in pids):
                live.append(path)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(path)
        return live

    def acquire(self, on_first: Callable[[], None]) -> None:
        """Join the holders; `on_first` runs (under the lock) when nobody held the node. If it raises,
        this job does not join."""
        fd = self._locked()
        try:
            if not self._live():
                on_first()
            self._mine = os.path.join(self.state_dir, "%s.holder" % self.name)
            self._write([os.getpid()])
        finally:
            os.close(fd)

    def add_process(self, pid: int) -> None:
        """The command's pid: it keeps the hold alive if this helper is killed without cleaning up."""
        fd = self._locked()
        try:
            self._write([os.getpid(), pid])
        finally:
            os.close(fd)

    def _write(self, pids: List[int]) -> None:
        assert self._mine is not None
        doc = {"processes": [{"pid": p, "started": _started(p)} for p in pids]}
        tmp = self._mine + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.chmod(tmp, 0o666)
        os.replace(tmp, self._mine)

    def release(self, on_last: Callable[[], None]) -> None:
        """Leave; `on_last` runs (under the lock) when no live holder remains."""
        fd = self._locked()
        try:
            if self._mine is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._mine)
                self._mine = None
            if not self._live():
                on_last()
        finally:
            os.close(fd)


def _warn(text: str) -> None:
    print("gpufleet-node busy: %s" % text, file=sys.stderr, flush=True)


def run_busy(
    command: List[str],
    protection: Any,
    holders: Holders,
    strict: bool = False,
    popen: Callable[..., Any] = subprocess.Popen,
    protect: bool = True,
) -> int:
    """Protect, run `command`, unprotect when the last holder leaves; COMMAND's exit code. `protect`
    False: only run it, signals forwarded (there is no instance to protect). Long because the signal
    handlers, the child and the holders' file must be set up and torn down in one order, in one place."""
    pending: List[int] = []  # signals that came before the command started
    child: Dict[str, Any] = {}

    def forward(signum: int, _frame: Any) -> None:
        proc = child.get("proc")
        if proc is None:
            pending.append(signum)
        else:
            with contextlib.suppress(OSError):
                proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    # Ctrl-C reaches COMMAND from the terminal (same process group); the helper waits for it to end.
    previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        protected = _protect(protection, holders, strict) if protect else False
        if protected is None:
            return EXIT_TEMPFAIL
        try:
            if pending:
                return 128 + pending[0]
            try:
                proc = popen(command, preexec_fn=_default_sigint)
            except OSError as exc:
                _warn("cannot run %s: %s" % (command[0], exc))
                return EXIT_NOT_FOUND
            child["proc"] = proc
            for signum in pending:  # arrived between the check and the start
                proc.send_signal(signum)
            try:
                if protected:
                    holders.add_process(proc.pid)
            except OSError as exc:
                _warn("could not record the command's pid (%s)" % exc)
            code = int(proc.wait())
            return 128 - code if code < 0 else code
        finally:
            _unprotect(protection, holders, protected)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # the helper ignores it; COMMAND must not inherit that


def _protect(protection: Any, holders: Holders, strict: bool) -> Optional[bool]:
    """True: joined the holders (protected by us or another job); False: running unprotected; None: refused."""
    try:
        holders.acquire(lambda: protection.set(True))
        return True
    except (ProtectionFailed, OSError) as exc:
        if strict:
            _warn("%s; not running the command (--strict)" % exc)
            return None
        _warn("%s; running the command without a busy mark (its node may be scaled in)" % exc)
        return False


def _unprotect(protection: Any, holders: Holders, joined: bool) -> None:
    if not joined:
        return
    try:
        holders.release(lambda: protection.set(False))
    except (ProtectionFailed, OSError) as exc:
        _warn("%s; the node stays marked busy (kept from scale-in) until the mark is deleted" % exc)


def state_dir(explicit: Optional[str]) -> str:
    return explicit or os.environ.get(ENV_STATE_DIR) or DEFAULT_STATE_DIR
