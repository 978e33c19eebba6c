"""Fakes for the publisher tests (Python >= 3.9): CloudWatch, EC2 and an IMDSv2 server on loopback."""

import json
import threading
import time
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpufleet_node.nvml import SimulatedBackend


class CountingBackend(SimulatedBackend):
    """Simulated GPUs that count the samples taken."""

    def __init__(self, gpus):
        super().__init__(gpus)
        self.samples = 0

    def sample(self, index):
        self.samples += 1
        return super().sample(index)


def window(at: datetime, n: int = 3) -> Tuple[datetime, List[Dict[str, Any]]]:
    """One closed window at `at`: `n` GPUUtilization datums stamped with its time."""
    return at, [{"MetricName": "GPUUtilization", "Timestamp": at, "Value": float(i)} for i in range(n)]


class FakeCloudWatch:
    """Records PutMetricData calls; fails the next `fail_next` calls like an unreachable endpoint; refuses
    calls that `refuse` picks like CloudWatch refuses bad content (a 400 ClientError, as botocore raises);
    `delay_s` makes every call hang that long first (a slow network). `validate` puts botocore's own
    client-side validation in front, with the real CloudWatch model, as a boto3 client has it: a datum it
    refuses raises the real ParamValidationError before anything is sent."""

    def __init__(
        self,
        fail_next: int = 0,
        refuse: Optional[Callable[[List[Dict[str, Any]]], Optional[str]]] = None,
        validate: bool = False,
    ) -> None:
        self.calls: List[Dict[str, Any]] = []
        self.fail_next = fail_next
        self.refuse = refuse
        self.delay_s = 0.0
        self.attempts = 0
        self.invalid_calls = 0
        if validate:
            import botocore.session

            self.meta = SimpleNamespace(service_model=botocore.session.get_session().get_service_model("cloudwatch"))

    def _validate(self, params: Dict[str, Any]) -> None:
        if hasattr(self, "meta"):
            from botocore.validate import validate_parameters

            try:
                validate_parameters(params, self.meta.service_model.operation_model("PutMetricData").input_shape)
            except Exception:
                self.invalid_calls += 1
                raise

    def put_metric_data(self, Namespace: str, MetricData: List[Dict[str, Any]]) -> Dict[str, Any]:
        self._validate({"Namespace": Namespace, "MetricData": MetricData})  # a client checks before it connects
        self.attempts += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise ConnectionError("Could not connect to the endpoint URL")
        code = self.refuse(MetricData) if self.refuse else None
        if code:
            raise client_error(code, 403 if code == "AccessDenied" else 400)
        self.calls.append({"Namespace": Namespace, "MetricData": MetricData})
        return {}

    def datums(self, name: Optional[str] = None) -> List[Dict[str, Any]]:
        out = [d for call in self.calls for d in call["MetricData"]]
        return [d for d in out if name is None or d["MetricName"] == name]


def client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": "refused by the fake"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutMetricData",
    )


class FakeClocks:
    """The two clocks a node has: the wall clock (what timestamps say) and the monotonic clock (time that
    passed). `advance` moves both, as time passing does; `jump` moves the wall clock alone, as an NTP step
    does, or a VM resumed from suspend (CLOCK_MONOTONIC stands still while it is suspended)."""

    def __init__(self, start: datetime) -> None:
        self.now = start
        self.mono = 5000.0  # any origin: only differences count

    def wall(self) -> datetime:
        return self.now

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)
        self.mono += seconds

    def jump(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


class FakeEc2:
    def __init__(self, tags: Dict[str, str], fail_next: int = 0) -> None:
        self.tags = tags
        self.calls = 0
        self.fail_next = fail_next

    def describe_tags(self, Filters: List[Dict[str, Any]]) -> Dict[str, Any]:
        self.calls += 1
        if self.fail_next > 0:
            self.fail_next -= 1
            raise ConnectionError("Could not connect to the endpoint URL: ec2")
        wanted = next(f["Values"] for f in Filters if f["Name"] == "key")
        return {"Tags": [{"Key": k, "Value": v} for k, v in self.tags.items() if k in wanted]}


class FakeImds:
    """IMDSv2 only: every metadata GET without a valid token gets 401, as with HttpTokens=required."""

    TOKEN = "fake-imds-token"

    def __init__(
        self,
        metadata: Dict[str, str],
        instance_tags: Optional[Dict[str, str]] = None,
        errors: Optional[Dict[str, int]] = None,
    ) -> None:
        self.metadata = metadata
        self.instance_tags = instance_tags  # None: instance metadata tags not enabled
        self.errors = errors or {}  # path -> HTTP status answered instead (e.g. 500)
        self.requests: List[str] = []
        self.unauthorized = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self._server.server_address[1]

    def __enter__(self) -> "FakeImds":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> Any:
        imds = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(self, status: int, body: str) -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:
                imds.requests.append("PUT " + self.path)
                if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self._send(200, imds.TOKEN)
                return self._send(400, "bad token request")

            def do_GET(self) -> None:
                imds.requests.append("GET " + self.path)
                if self.headers.get("X-aws-ec2-metadata-token") != imds.TOKEN:
                    imds.unauthorized += 1
                    return self._send(401, "")
                if self.path in imds.errors:
                    return self._send(imds.errors[self.path], "internal error")
                prefix = "/latest/meta-data/tags/instance"
                if self.path.startswith(prefix):
                    if imds.instance_tags is None:
                        return self._send(404, "")
                    key = self.path[len(prefix) :].lstrip("/")
                    if not key:
                        return self._send(200, "\n".join(imds.instance_tags))
                    if key in imds.instance_tags:
                        return self._send(200, imds.instance_tags[key])
                    return self._send(404, "")
                key = self.path[len("/latest/meta-data/") :]
                if key in imds.metadata:
                    return self._send(200, imds.metadata[key])
                return self._send(404, "")

        return Handler


def dump(datums: List[Dict[str, Any]]) -> str:
    return json.dumps(datums, default=str)


class FakeLogs:
    """CloudWatch Logs for the usage records: PutLogEvents into streams that must be created first (as the
    real service answers ResourceNotFoundException); `group_exists` False: the stack is not deployed."""

    def __init__(self, group: str, group_exists: bool = True) -> None:
        self.group = group
        self.group_exists = group_exists
        self.streams: Dict[str, List[Dict[str, Any]]] = {}
        self.calls = 0

    def create_log_stream(self, logGroupName: str, logStreamName: str) -> Dict[str, Any]:
        if not self.group_exists or logGroupName != self.group:
            raise client_error("ResourceNotFoundException", 400)
        if logStreamName in self.streams:
            raise client_error("ResourceAlreadyExistsException", 400)
        self.streams[logStreamName] = []
        return {}

    def put_log_events(self, logGroupName: str, logStreamName: str, logEvents: List[Dict[str, Any]]) -> Dict[str, Any]:
        self.calls += 1
        if not self.group_exists or logStreamName not in self.streams:
            raise client_error("ResourceNotFoundException", 400)
        stamps = [e["timestamp"] for e in logEvents]
        if stamps != sorted(stamps):
            raise client_error("InvalidParameterException", 400)
        self.streams[logStreamName].extend(logEvents)
        return {}

    def records(self) -> List[Dict[str, Any]]:
        return [json.loads(e["message"]) for events in self.streams.values() for e in events]
