"""The kubelet's PodResources API, read from a real gRPC server on a unix socket. Python >= 3.9."""

import os
import socket
import sys
import tempfile
import threading
import time

import grpc
import pytest
from podresources_server import FakeKubelet, gpu_container
from proc_trees import run_unprivileged

from gpufleet_node import podresources
from gpufleet_node.podresources import Allocations, PodResourcesReader, device_key

GPU_A = "GPU-fef8089b-4820-abfc-e83e-94318197576e"
GPU_B = "GPU-0c3e2a1f-7d8b-4e2c-9a6f-5b4d3c2e1f00"
GPU_C = "GPU-a1b2c3d4-e5f6-0718-293a-4b5c6d7e8f90"
MIG = "MIG-30d00c09-8a98-59b8-8c1a-1d64b4ec3ad2"
LEGACY_MIG = "MIG-GPU-5c89852c-d268-c3f3-1b07-005d5ae1dc3f/3/0"


def pod(namespace, name, *containers):
    return {"name": name, "namespace": namespace, "containers": list(containers)}


def test_gpus_mig_devices_and_time_sliced_replicas_map_to_their_pod_container():
    pods = [
        pod("team-a", "trainer-0", gpu_container("main", GPU_A, GPU_B), {"name": "sidecar", "cpu_ids": [7]}),
        pod("team-b", "infer-1", gpu_container("server", GPU_C + "::3", GPU_C + "::4")),  # two replicas, one pod
        pod("team-c", "notebook", gpu_container("lab", MIG, resource="nvidia.com/mig-1g.10gb")),
        pod("team-c", "old-mig", gpu_container("lab", LEGACY_MIG, resource="nvidia.com/mig-3g.40gb")),
    ]
    with FakeKubelet(pods) as kubelet:
        allocations = PodResourcesReader(kubelet.socket_path).refresh()
    assert allocations.unknown is None
    assert {d: w.key for d, w in allocations.by_device.items()} == {
        GPU_A: "pod:team-a/trainer-0/main",
        GPU_B: "pod:team-a/trainer-0/main",
        GPU_C: "pod:team-b/infer-1/server",
        MIG: "pod:team-c/notebook/lab",
        LEGACY_MIG: "pod:team-c/old-mig/lab",
    }
    found = allocations.by_device[GPU_A]
    assert (found.kind, found.namespace, found.pod, found.container) == ("pod", "team-a", "trainer-0", "main")
    assert allocations.shared == {} and allocations.notes == {}


def test_a_gpu_time_sliced_between_pods_has_no_single_owner():
    pods = [
        pod("team-a", "a", gpu_container("main", GPU_A + "::0", resource="nvidia.com/gpu.shared")),
        pod("team-b", "b", gpu_container("main", GPU_A + "::1", resource="nvidia.com/gpu.shared")),
    ]
    with FakeKubelet(pods) as kubelet:
        allocations = PodResourcesReader(kubelet.socket_path).refresh()
    assert allocations.by_device == {}
    assert [w.key for w in allocations.shared[GPU_A]] == ["pod:team-a/a/main", "pod:team-b/b/main"]
    assert allocations.notes == {"shared": "1 GPU(s) shared by several pods (time-slicing): no single owner"}


def test_only_nvidia_gpu_and_mig_resources_count():
    pods = [
        pod(
            "team-a",
            "mixed",
            gpu_container("efa", "efa-0", resource="vpc.amazonaws.com/efa"),
            gpu_container("fpga", "fpga-3", resource="example.com/fpga"),
            gpu_container("vfio", "0000:3b:00.0", resource="nvidia.com/GH100_H100_SXM5_80GB"),
        )
    ]
    with FakeKubelet(pods) as kubelet:
        allocations = PodResourcesReader(kubelet.socket_path).refresh()
    assert (allocations.unknown, allocations.by_device) == (None, {})


def test_device_ids_that_are_not_uuids_are_kept_and_noted():
    with FakeKubelet([pod("team-a", "p", gpu_container("main", "0", "1"))]) as kubelet:
        allocations = PodResourcesReader(kubelet.socket_path).refresh()
    assert sorted(allocations.by_device) == ["0", "1"]
    assert allocations.notes == {"device ids": "not GPU or MIG UUIDs (device plugin id strategy?): 0, 1"}


def test_device_keys_drop_only_the_replica_suffix():
    assert device_key(GPU_A + "::12") == GPU_A
    assert device_key(MIG + "::0") == MIG
    assert device_key(LEGACY_MIG) == LEGACY_MIG
    assert device_key(" %s " % GPU_A) == GPU_A


def test_no_socket_no_kubelet():
    allocations = PodResourcesReader("/nonexistent/pod-resources/kubelet.sock").refresh()
    assert allocations.unknown == "no kubelet PodResources socket at /nonexistent/pod-resources/kubelet.sock"
    assert allocations.by_device == {}


def test_a_stale_socket_with_nobody_listening_is_unavailable():
    where = tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")
    path = os.path.join(where, "kubelet.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.close()  # the file stays; connecting is refused, like after a kubelet crash
    try:
        allocations = PodResourcesReader(path, timeout_s=2.0).refresh()
        assert allocations.unknown is not None
        assert allocations.unknown.startswith("kubelet PodResources List failed: UNAVAILABLE")
    finally:
        os.unlink(path)
        os.rmdir(where)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() with gRPC's threads about: the child only stats
def test_a_socket_only_root_may_open_says_permission_denied():
    with FakeKubelet([]) as kubelet:
        os.chmod(os.path.dirname(kubelet.socket_path), 0o755)
        os.chmod(kubelet.socket_path, 0o600)
        unknown = run_unprivileged(lambda: PodResourcesReader(kubelet.socket_path).refresh().unknown)
    assert unknown == "permission denied on %s (root or the socket's group needed)" % kubelet.socket_path


SAFETY_S = 30  # only a failing test waits this long; nothing is asserted about how long anything took


def record_timeouts(monkeypatch):
    """The deadline each List call is given, as grpc receives it (the reader's channel, wrapped)."""
    seen = []
    real = grpc.insecure_channel

    class Recording:
        def __init__(self, channel):
            self._channel = channel

        def unary_unary(self, *args, **kwargs):
            call = self._channel.unary_unary(*args, **kwargs)

            def recorded(request, timeout=None, **rest):
                seen.append(timeout)
                return call(request, timeout=timeout, **rest)

            return recorded

        def close(self):
            self._channel.close()

    monkeypatch.setattr(grpc, "insecure_channel", lambda target, *a, **kw: Recording(real(target, *a, **kw)))
    return seen


def test_a_hanging_kubelet_costs_only_the_timeout(monkeypatch):
    """The deadline travels with the call, so gRPC ends it: the kubelet below answers only when the
    test ends (or after 30 s, with an empty list), and the reader says it did not answer in time."""
    timeouts = record_timeouts(monkeypatch)
    with FakeKubelet([], mode="hang") as kubelet:
        allocations = PodResourcesReader(kubelet.socket_path, timeout_s=0.3).refresh()
        assert kubelet.calls == 1
    assert timeouts == [0.3]
    assert allocations.unknown == "kubelet PodResources did not answer within 0.3 s"


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (grpc.StatusCode.INTERNAL, "INTERNAL: podresources: internal error listing pods"),
        (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED: podresources: internal error listing pods"),
    ],
)
def test_an_error_status_is_a_reason(code, expected):
    with FakeKubelet([], mode="error") as kubelet:
        kubelet.error_code = code
        allocations = PodResourcesReader(kubelet.socket_path).refresh()
    assert allocations.unknown == "kubelet PodResources List failed: " + expected


def test_an_old_kubelet_without_v1_list():
    with FakeKubelet([], mode="unimplemented") as kubelet:
        allocations = PodResourcesReader(kubelet.socket_path).refresh()
    assert allocations.unknown == "kubelet serves no PodResources v1 List"


def test_an_unreadable_answer_is_a_reason_not_an_exception():
    with FakeKubelet([], mode="garbage") as kubelet:
        allocations = PodResourcesReader(kubelet.socket_path).refresh()
    assert allocations.unknown is not None
    assert allocations.unknown.startswith("kubelet PodResources List failed: ")


def test_without_grpcio_allocations_are_unknown(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)  # `import grpc` now raises ImportError, as when not installed
    allocations = PodResourcesReader("/nonexistent.sock").refresh()
    assert allocations.unknown == "grpcio is not installed: pod allocations unknown"


def test_without_protobuf_allocations_are_unknown(monkeypatch):
    monkeypatch.setattr(podresources, "_MESSAGES", None)
    monkeypatch.setitem(sys.modules, "google.protobuf", None)
    allocations = PodResourcesReader("/nonexistent.sock").refresh()
    assert allocations.unknown == "protobuf is not installed: pod allocations unknown"


def test_current_never_waits_for_a_refresh_in_flight():
    """current() answers while a refresh is still inside a List the kubelet holds: had it waited for the
    refresh, the refresh would have ended first (the kubelet lets go only once current() has answered)."""
    with FakeKubelet([], mode="hang") as kubelet:
        reader = PodResourcesReader(kubelet.socket_path, timeout_s=SAFETY_S)
        assert reader.current().unknown == "not read yet"
        worker = threading.Thread(target=reader.refresh)
        worker.start()
        deadline = time.monotonic() + SAFETY_S  # a bound on waiting, never an assertion on time
        while kubelet.calls == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert kubelet.calls == 1
        assert reader.current().unknown == "not read yet"
        assert worker.is_alive()  # the refresh is still in flight: current() did not wait for it
        kubelet._release.set()  # the kubelet answers now: the refresh lands
        worker.join(SAFETY_S)
        assert not worker.is_alive()
    assert reader.current().unknown is None and reader.current().by_device == {}


def test_the_background_thread_keeps_refreshing_until_stopped():
    with FakeKubelet([pod("team-a", "p", gpu_container("main", GPU_A))]) as kubelet:
        reader = PodResourcesReader(kubelet.socket_path, refresh_s=0.05)
        reader.start()
        reader.start()  # idempotent
        deadline = time.monotonic() + 5
        while kubelet.calls < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        reader.stop()
        calls = kubelet.calls
        time.sleep(0.15)
        assert kubelet.calls == calls  # stopped
    assert calls >= 3
    assert reader.current().by_device[GPU_A].key == "pod:team-a/p/main"


def test_allocations_default_to_empty():
    empty = Allocations(unknown="x")
    assert (empty.by_device, empty.shared, empty.notes, empty.unknown) == ({}, {}, {}, "x")
