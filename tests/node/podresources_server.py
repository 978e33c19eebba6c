"""A real gRPC server for the tests (Python >= 3.9): the kubelet's v1.PodResourcesLister/List on a unix
socket, serving the pods a test configures. Its messages carry more of api.proto than the publisher
reads (cpu_ids, memory, topology, dynamic_resources), with kubelet's field numbers, so the tests also
show that the reader skips what it does not know.

Modes: "ok" answers; "hang" answers only after the test ends (past any client deadline); "error" aborts
with `error_code`; "unimplemented" registers no List at all (an old kubelet); "garbage" answers bytes
that are no ListPodResourcesResponse."""

import shutil
import tempfile
import threading
from concurrent import futures
from typing import Any, Dict, List, Optional

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT64, _UINT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_INT64, _F.TYPE_UINT64, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# kubernetes staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto, field numbers as published.
_API = {
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _MANY, "PodResources")],
    "PodResources": [
        ("name", 1, _STRING, _ONE, None),
        ("namespace", 2, _STRING, _ONE, None),
        ("containers", 3, _MESSAGE, _MANY, "ContainerResources"),
        ("cpu_ids", 4, _INT64, _MANY, None),
        ("memory", 5, _MESSAGE, _MANY, "ContainerMemory"),
    ],
    "ContainerResources": [
        ("name", 1, _STRING, _ONE, None),
        ("devices", 2, _MESSAGE, _MANY, "ContainerDevices"),
        ("cpu_ids", 3, _INT64, _MANY, None),
        ("memory", 4, _MESSAGE, _MANY, "ContainerMemory"),
        ("dynamic_resources", 5, _MESSAGE, _MANY, "DynamicResource"),
    ],
    "ContainerMemory": [
        ("memory_type", 1, _STRING, _ONE, None),
        ("size", 2, _UINT64, _ONE, None),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "ContainerDevices": [
        ("resource_name", 1, _STRING, _ONE, None),
        ("device_ids", 2, _STRING, _MANY, None),
        ("topology", 3, _MESSAGE, _ONE, "TopologyInfo"),
    ],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _MANY, "NUMANode")],
    "NUMANode": [("ID", 1, _INT64, _ONE, None)],
    "DynamicResource": [
        ("claim_name", 2, _STRING, _ONE, None),
        ("claim_namespace", 3, _STRING, _ONE, None),
        ("claim_resources", 4, _MESSAGE, _MANY, "ClaimResource"),
    ],
    "ClaimResource": [
        ("cdi_devices", 1, _MESSAGE, _MANY, "CDIDevice"),
        ("driver_name", 2, _STRING, _ONE, None),
        ("pool_name", 3, _STRING, _ONE, None),
        ("device_name", 4, _STRING, _ONE, None),
    ],
    "CDIDevice": [("name", 1, _STRING, _ONE, None)],
}


def _classes() -> Dict[str, Any]:
    proto = descriptor_pb2.FileDescriptorProto(name="k8s.io/kubelet/podresources/v1/api.proto", package="v1")
    proto.syntax = "proto3"
    for name, fields in _API.items():
        message = proto.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            field = message.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = ".v1." + type_name
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(proto.SerializeToString())
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName("v1." + n)) for n in _API}


MESSAGES = _classes()


def gpu_container(name: str, *device_ids: str, resource: str = "nvidia.com/gpu") -> Dict[str, Any]:
    """A container as the kubelet reports it: its devices, plus CPUs, memory and topology around them."""
    return {
        "name": name,
        "devices": [{"resource_name": resource, "device_ids": list(device_ids), "topology": {"nodes": [{"ID": 0}]}}],
        "cpu_ids": [2, 3],
        "memory": [{"memory_type": "memory", "size": "1073741824", "topology": {"nodes": [{"ID": 0}]}}],
    }


class FakeKubelet:
    """`with FakeKubelet(pods) as kubelet:` serves List on kubelet.socket_path until the block ends."""

    def __init__(self, pods: Optional[List[Dict[str, Any]]] = None, mode: str = "ok") -> None:
        self.pods = pods or []
        self.mode = mode
        self.error_code = grpc.StatusCode.INTERNAL
        self.calls = 0
        self._release = threading.Event()
        self._dir = tempfile.mkdtemp(prefix="kubelet-", dir="/tmp")  # short: unix socket paths max 107 bytes
        self.socket_path = self._dir + "/kubelet.sock"
        self._server: Any = None

    def _list(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.mode == "hang":
            self._release.wait(30)
        if self.mode == "error":
            context.abort(self.error_code, "podresources: internal error listing pods")
        return json_format.ParseDict({"pod_resources": self.pods}, MESSAGES["ListPodResourcesResponse"]())

    def _serialize(self, response: Any) -> bytes:
        return b"\x0a\xff\xff\xff" if self.mode == "garbage" else bytes(response.SerializeToString())

    def __enter__(self) -> "FakeKubelet":
        methods = {}
        if self.mode != "unimplemented":
            methods["List"] = grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=MESSAGES["ListPodResourcesRequest"].FromString,
                response_serializer=self._serialize,
            )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", methods),))
        self._server.add_insecure_port("unix:" + self.socket_path)
        self._server.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._release.set()
        self._server.stop(grace=None).wait(5)
        shutil.rmtree(self._dir, ignore_errors=True)
