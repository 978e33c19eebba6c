"""ami/install.sh into a scratch root, then the stock node's headline attribution as the publisher's user.

The scratch root gets what install.sh installs and, below it, the kubelet's directories as the kubelet
makes them (0750 root, pkg/kubelet/util/util_unix.go CreateListener) with a real gRPC PodResources server
(podresources_server.FakeKubelet) bound there under the kubelet's umask 022. The installed
gpufleet-podresources-access.service's own command (its ExecStart, with the paths moved under the scratch
root and the user swapped for a uid that exists nowhere) sets the access; then a child process under that
uid, with no groups, runs the installed publisher's attribution (publisher_as_user.py: it drops to that
uid itself, after loading its modules, since the interpreter may be readable by root only). systemd itself
does not run here: that the .path unit starts the service at each kubelet start rests on systemd's
path.c (cited in the unit); what the service does then is run for real. Needs root (setuid) for the part
under the other uid, as CI runs; skipped otherwise.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from podresources_server import FakeKubelet, gpu_container

from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.podresources import DEFAULT_SOCKET

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PUBLISHER_UID = 64999  # stands in for 'gpufleet': a uid with no account, no groups, no home
UNITS = "etc/systemd/system"
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another uid needs root (CI runs as root)")


@pytest.fixture(scope="module")
def root():
    # Not pytest's tmp_path: its parents are 0700, which no other uid may cross; unix socket paths are short.
    root = Path(tempfile.mkdtemp(prefix="gf-", dir="/tmp"))
    root.chmod(0o755)
    subprocess.run(["bash", str(REPO / "ami/install.sh"), "--root", str(root), "--no-deps"], check=True)
    socket_dir = root / DEFAULT_SOCKET.lstrip("/")
    socket_dir.parent.parent.mkdir(mode=0o750, parents=True)  # /var/lib/kubelet, as the kubelet makes it
    socket_dir.parent.mkdir(mode=0o750)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def unit(root: Path, name: str) -> dict:
    """key -> values of a unit file (keys may repeat)."""
    keys: dict = {}
    for line in (root / UNITS / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            keys.setdefault(key, []).append(value)
    return keys


def kubelet(root: Path) -> FakeKubelet:
    """The kubelet's start: unlink the old socket, bind a new one under umask 022 (systemd's default)."""
    uuids = [SimulatedBackend(2).describe(i).uuid for i in range(2)]
    server = FakeKubelet([{"name": "trainer-0", "namespace": "team-a", "containers": [gpu_container("main", *uuids)]}])
    server.socket_path = str(root / DEFAULT_SOCKET.lstrip("/"))
    if os.path.lexists(server.socket_path):
        os.unlink(server.socket_path)
    old = os.umask(0o022)
    try:
        server.__enter__()
    finally:
        os.umask(old)
    return server


def run_access_service(root: Path) -> str:
    """The installed access service's ExecStart, as systemd would run it, moved under the scratch root."""
    service = unit(root, "gpufleet-podresources-access.service")
    [command] = service["ExecStart"]
    argv = [a.replace(DEFAULT_SOCKET, str(root) + DEFAULT_SOCKET) for a in shlex.split(command)]
    argv[argv.index("--user") + 1] = str(PUBLISHER_UID)
    argv[argv.index("--wait-s") + 1] = "0"
    argv[0] = sys.executable  # the unit's /usr/bin/python3, with this run's grpc-free needs it is the same
    [pythonpath] = [e.split("=", 1)[1] for e in service["Environment"] if e.startswith("PYTHONPATH=")]
    env = dict(os.environ, PYTHONPATH=str(root) + pythonpath)
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return proc.stdout


PUBLISHER_WAIT_S = 60  # the child runs in about a second; only a stuck start is waited this long
PUBLISHER_TRIES = 3


def record_as_publisher(root: Path) -> dict:
    """The usage record the installed publisher's attribution writes, run as PUBLISHER_UID with no groups.

    The child is started beside the fake kubelet's gRPC threads; once in a CI run, under load, it never
    got as far as its own program (stuck after the fork, before the exec, on a lock one of those threads
    held). A start that does not finish in PUBLISHER_WAIT_S is killed and made again."""
    env = dict(os.environ, PYTHONPATH="%s:%s" % (root / "opt/gpufleet/lib", HERE))
    args = [sys.executable, str(HERE / "publisher_as_user.py"), str(PUBLISHER_UID), str(root) + DEFAULT_SOCKET]
    for _ in range(PUBLISHER_TRIES):
        try:
            proc = subprocess.run(
                args, env=env, cwd="/", capture_output=True, text=True, check=False, timeout=PUBLISHER_WAIT_S
            )
        except subprocess.TimeoutExpired:
            continue
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout)
    raise AssertionError("the publisher child never finished (%d starts)" % PUBLISHER_TRIES)


def holders(record: dict) -> dict:
    """GPU index -> (pod or None, held s, busy s, idle s)."""
    pods = {ref: doc.get("pod") for ref, doc in record["w"].items()}
    return {r[0]: (pods.get(r[1]), r[2], r[3], r[4]) for r in record["u"]}


def test_install_places_the_access_units_and_the_publisher_stays_unprivileged(root):
    publisher = unit(root, "gpufleet-publisher.service")
    assert publisher["User"] == ["gpufleet"] and publisher["Group"] == ["gpufleet"]
    assert "gpufleet-podresources-access.path" in publisher["Wants"]
    path = unit(root, "gpufleet-podresources-access.path")
    assert path["PathChanged"] == [DEFAULT_SOCKET] and path["Unit"] == ["gpufleet-podresources-access.service"]
    service = unit(root, "gpufleet-podresources-access.service")
    assert "User" not in service and service["Type"] == ["oneshot"]  # root, once per socket
    argv = shlex.split(service["ExecStart"][0])
    assert argv[:3] == ["/usr/bin/python3", "-m", "gpufleet_node.socket_access"]
    assert argv[argv.index("--socket") + 1] == DEFAULT_SOCKET and argv[argv.index("--user") + 1] == "gpufleet"
    assert (root / "opt/gpufleet/lib/gpufleet_node/socket_access.py").is_file()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not available here")
def test_the_access_units_pass_systemd_analyze_verify(root):
    names = ("gpufleet-podresources-access.path", "gpufleet-podresources-access.service")
    proc = subprocess.run(
        ["systemd-analyze", "verify", *(str(root / UNITS / n) for n in names)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr


@as_root
def test_a_pod_that_requested_two_gpus_and_uses_one_as_the_publishers_user(root):
    server = kubelet(root)
    try:
        # Before the access service, as on the old stock node: behind the kubelet's 0750 directories the
        # socket cannot even be seen, and the idle GPU reads as nobody's.
        before = record_as_publisher(root)
        assert before["gone"]["allocations"].startswith("no kubelet PodResources socket at ")
        assert holders(before)[1][0] is None
        assert "may connect" in run_access_service(root)
        after = record_as_publisher(root)
        assert "allocations" not in after.get("gone", {})
        assert holders(after) == {0: ("trainer-0", 300.0, 270.0, 0.0), 1: ("trainer-0", 300.0, 0.0, 300.0)}
    finally:
        server.__exit__(None, None, None)


@as_root
def test_a_kubelet_restart_loses_the_access_and_the_service_gives_it_back(root):
    first = kubelet(root)
    run_access_service(root)
    first.__exit__(None, None, None)
    server = kubelet(root)  # a new socket: no ACL entry on it
    try:
        assert record_as_publisher(root)["gone"]["allocations"].startswith("permission denied on ")
        run_access_service(root)  # what the .path unit starts when the socket is renamed into place
        assert holders(record_as_publisher(root))[1][0] == "trainer-0"
    finally:
        server.__exit__(None, None, None)
