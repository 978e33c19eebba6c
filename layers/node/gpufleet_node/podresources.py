"""GPUs the kubelet has allocated to pods on this node, from its PodResources gRPC API (v1, List).

Why ask the kubelet: it handed each GPU (by the id the NVIDIA device plugin gave it, a GPU or MIG UUID) to
a container, so a GPU a pod holds but leaves idle is still known to be the pod's; no process list shows
that. The API is a local unix socket: no API server credentials, but only root (or the socket's group)
may open it.

grpcio and protobuf are optional: without them, without a kubelet, or when it does not answer within
timeout_s, Allocations.unknown says why and the publisher runs on. No generated code ships: the message
classes are built on first use from a descriptor written below, with only the fields read and the field
numbers of kubelet's pkg/apis/podresources/v1/api.proto; protobuf skips the fields left out (cpu_ids,
memory, topology, dynamic_resources).

Time-slicing (the device plugin's `GPU-<uuid>::<replica>` ids) can hand one GPU to several pods: such a
GPU is listed in `shared`, not in `by_device`, since no single pod owns it. Device ids that are not
UUIDs (the plugin's index id strategy) are kept as they are, and said so in `notes`.
Python >= 3.9.
"""

import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

from gpufleet_node.workload import POD, Workload

log = logging.getLogger("gpufleet.publisher")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"


def is_gpu_resource(name: str) -> bool:
    return name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX)


def device_key(device_id: str) -> str:
    """`GPU-<uuid>::3` (a time-slicing replica) -> `GPU-<uuid>`; MIG ids (`MIG-...`) and others as they are."""
    return device_id.strip().split("::", 1)[0]


class Allocations:
    """The result of one List. by_device: device id -> the one pod container holding it; shared: device
    id -> the containers sharing it (time-slicing); unknown: why nothing could be read (None when read);
    notes: what was read but cannot be used as is; at: when (time.time())."""

    __slots__ = ("at", "by_device", "notes", "shared", "unknown")

    def __init__(
        self,
        by_device: Optional[Dict[str, Workload]] = None,
        unknown: Optional[str] = None,
        shared: Optional[Dict[str, List[Workload]]] = None,
        notes: Optional[Dict[str, str]] = None,
        at: Optional[float] = None,
    ) -> None:
        self.by_device: Dict[str, Workload] = by_device or {}
        self.unknown = unknown
        self.shared: Dict[str, List[Workload]] = shared or {}
        self.notes: Dict[str, str] = notes or {}
        self.at = time.time() if at is None else at

    def __repr__(self) -> str:
        return "Allocations(%d devices, %d shared, unknown=%r)" % (len(self.by_device), len(self.shared), self.unknown)


def allocations_from(response: Any) -> Allocations:
    """Allocations from a ListPodResourcesResponse (only the GPU and MIG resources of the NVIDIA plugin).
    Linear in the device ids listed: each device's holders are a dict by workload key (a container listed
    with several replicas of one GPU counts once), not a list searched per id (5,000 time-sliced pods x 8
    ids took 36.7 s that way; issue 29)."""
    holders: Dict[str, Dict[str, Workload]] = {}
    for pod in response.pod_resources:
        for container in pod.containers:
            workload = Workload(
                POD, namespace=pod.namespace or None, pod=pod.name or None, container=container.name or None
            )
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    holders.setdefault(device_key(device_id), {}).setdefault(workload.key, workload)
    by_device = {d: next(iter(held.values())) for d, held in holders.items() if len(held) == 1}
    shared = {d: list(held.values()) for d, held in holders.items() if len(held) > 1}
    notes: Dict[str, str] = {}
    if shared:
        notes["shared"] = "%d GPU(s) shared by several pods (time-slicing): no single owner" % len(shared)
    odd = sorted(d for d in holders if not d.startswith(("GPU-", "MIG-")))
    if odd:
        notes["device ids"] = "not GPU or MIG UUIDs (device plugin id strategy?): %s" % ", ".join(odd[:4])
    return Allocations(by_device, None, shared, notes)


class _Wire:
    __slots__ = ("grpc", "request", "response")

    def __init__(self, grpc: Any, request: Any, response: Any) -> None:
        self.grpc = grpc
        self.request = request
        self.response = response


_MESSAGES: Optional[Tuple[Any, Any]] = None  # (ListPodResourcesRequest, ListPodResourcesResponse), built once


def _messages() -> Tuple[Any, Any]:
    """The two message classes List needs, from a descriptor of the fields read (real field numbers)."""
    global _MESSAGES
    if _MESSAGES is None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        field = descriptor_pb2.FieldDescriptorProto
        text, message = field.TYPE_STRING, field.TYPE_MESSAGE
        one, many = field.LABEL_OPTIONAL, field.LABEL_REPEATED
        proto = descriptor_pb2.FileDescriptorProto(name="gpufleet/podresources_v1.proto", package="v1", syntax="proto3")
        layout: Dict[str, List[Tuple[str, int, int, int, str]]] = {
            "ListPodResourcesRequest": [],
            "ListPodResourcesResponse": [("pod_resources", 1, message, many, ".v1.PodResources")],
            "PodResources": [
                ("name", 1, text, one, ""),
                ("namespace", 2, text, one, ""),
                ("containers", 3, message, many, ".v1.ContainerResources"),
            ],
            "ContainerResources": [("name", 1, text, one, ""), ("devices", 2, message, many, ".v1.ContainerDevices")],
            "ContainerDevices": [("resource_name", 1, text, one, ""), ("device_ids", 2, text, many, "")],
        }
        for name, fields in layout.items():
            added = proto.message_type.add(name=name)
            for fname, number, ftype, label, type_name in fields:
                added.field.add(name=fname, number=number, type=ftype, label=label)
                if type_name:
                    added.field[-1].type_name = type_name
        pool = descriptor_pool.DescriptorPool()  # private: no clash with another `v1` package in the default pool
        pool.AddSerializedFile(proto.SerializeToString())
        request = message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesRequest"))
        response = message_factory.GetMessageClass(pool.FindMessageTypeByName("v1.ListPodResourcesResponse"))
        _MESSAGES = (request, response)
    return _MESSAGES


def load_wire() -> Tuple[Optional[_Wire], Optional[str]]:
    """grpc and the message classes, or why not (the libraries are optional)."""
    try:
        import grpc
    except ImportError:
        return None, "grpcio is not installed: pod allocations unknown"
    try:
        request, response = _messages()
    except ImportError:
        return None, "protobuf is not installed: pod allocations unknown"
    return _Wire(grpc, request, response), None


def _socket_problem(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return "no kubelet PodResources socket at %s" % path
    if not os.access(path, os.R_OK | os.W_OK):
        return "permission denied on %s (root or the socket's group needed)" % path
    return None


def _rpc_reason(err: Any, timeout_s: float) -> str:
    code = err.code() if callable(getattr(err, "code", None)) else None
    details = err.details() if callable(getattr(err, "details", None)) else None
    name = getattr(code, "name", None) or "ERROR"
    if name == "DEADLINE_EXCEEDED":
        return "kubelet PodResources did not answer within %g s" % timeout_s
    if name == "UNIMPLEMENTED":
        return "kubelet serves no PodResources v1 List"
    return "kubelet PodResources List failed: %s%s" % (name, ": %s" % str(details)[:120] if details else "")


class PodResourcesReader:
    """refresh() lists now; current() returns the last result at once; start() refreshes every refresh_s
    in a daemon thread. A call never takes more than about timeout_s and never raises."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 1.0, refresh_s: float = 30.0) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.refresh_s = refresh_s
        self._current = Allocations(unknown="not read yet")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def refresh(self) -> Allocations:
        try:
            result = self._list()
        except Exception as exc:  # whatever grpc or a bad answer throws, the sampling loop goes on
            result = Allocations(unknown="PodResources List failed: %s" % exc.__class__.__name__)
        if result.unknown:
            log.debug("pod allocations unknown: %s", result.unknown)
        with self._lock:
            self._current = result
        return result

    def current(self) -> Allocations:
        with self._lock:
            return self._current

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufleet-podresources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_s)

    def _list(self) -> Allocations:
        wire, missing = load_wire()
        if wire is None:
            return Allocations(unknown=missing)
        problem = _socket_problem(self.socket_path)
        if problem:
            return Allocations(unknown=problem)
        target = ("unix://" if self.socket_path.startswith("/") else "unix:") + self.socket_path
        channel = wire.grpc.insecure_channel(target)
        try:
            call = channel.unary_unary(
                LIST_METHOD,
                request_serializer=wire.request.SerializeToString,
                response_deserializer=wire.response.FromString,
            )
            response = call(wire.request(), timeout=self.timeout_s)
        except wire.grpc.RpcError as err:
            return Allocations(unknown=_rpc_reason(err, self.timeout_s))
        finally:
            channel.close()
        return allocations_from(response)
