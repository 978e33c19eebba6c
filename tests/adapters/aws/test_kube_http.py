"""The GET under the pod listing. An API answer nested past what Python's JSON reader can recurse through
is an unreadable cluster (one line, kind malformed), never a RecursionError out of the scaler: the fuzzer's
`b"[" * 100000`. The deadline holds while reading: every wait on a socket gets min(timeout, time left) and
the body is read in CHUNK pieces with the deadline looked at between (the clock injected, never timed)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pydantic import SecretStr

from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.kubernetes import client as kube_http
from gpufleet.kubernetes import cluster as kube
from gpufleet.kubernetes.client import CHUNK, ApiServer, BudgetSpent, Connection, HttpProblem, Pace, _json, _PacedReader
from gpufleet.settings import KubeEndpoint

PODLIST = (Path(__file__).parents[2] / "fixtures" / "kubernetes" / "pods-pending-gpu.json").read_text()
DEEP = [
    b"[" * 100_000,  # unterminated: the fuzzer's find
    b"[" * 100_000 + b"]" * 100_000,  # well formed, just deep
    b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
]


class OneAnswer:
    """The http.client connection under kube_http.Connection, answering every GET with one body."""

    timeout = kube.TIMEOUT_S

    def __init__(self, body: bytes, status: int = 200) -> None:
        self.body, self.status, self.reason = body, status, "OK" if status == 200 else "Error"
        self.encoding: str | None = None

    def request(self, method: str, url: str, headers: dict[str, str]) -> None:
        pass

    def getresponse(self) -> OneAnswer:
        return self

    def read(self, limit: int) -> bytes:
        chunk, self.body = self.body[:limit], self.body[limit:]
        return chunk

    def getheader(self, name: str) -> str | None:
        return self.encoding if name == "Content-Encoding" else None

    def close(self) -> None:
        pass


@pytest.fixture
def answer() -> Iterator[list[OneAnswer]]:
    served: list[OneAnswer] = [OneAnswer(b"")]

    def connect(server: ApiServer, timeout_s: float, budget_s: float) -> Connection:
        connection = Connection(server, timeout_s, budget_s)
        connection._conn = served[0]  # type: ignore[assignment]  # the real GET path, a fake socket
        return connection

    with mock.patch.object(kube, "Connection", connect):
        yield served


def read(served: list[OneAnswer], body: bytes, status: int = 200) -> Any:
    served[0] = OneAnswer(body, status)
    endpoint = KubeEndpoint(url="http://kube.example", token=SecretStr("t"))
    return kube.PodReader(mock.Mock(), mock.Mock(), {"ml": endpoint}).read("ml")


@pytest.mark.parametrize("body", DEEP, ids=["unterminated", "arrays", "objects"])
def test_json_nested_too_deeply_is_a_malformed_answer(body: bytes) -> None:
    with pytest.raises(HttpProblem) as err:
        _json(body)
    assert (err.value.kind, err.value.reason) == ("malformed", "the answer nests too deeply to read")


@pytest.mark.parametrize("body", DEEP, ids=["unterminated", "arrays", "objects"])
@pytest.mark.parametrize("status", [200, 500])
def test_a_deeply_nested_answer_is_one_unreadable_line(answer: list[OneAnswer], body: bytes, status: int) -> None:
    with pytest.raises(ClusterUnreadable) as err:
        read(answer, body, status)
    assert (err.value.cluster, err.value.kind) == ("ml", "malformed")
    assert str(err.value) == "cannot read the pods of EKS cluster ml: the answer nests too deeply to read"


@pytest.mark.parametrize("depth", range(800, 1001, 4))
def test_a_pod_field_nested_near_the_limit_is_read_or_unreadable(answer: list[OneAnswer], depth: int) -> None:
    """Just shallow enough for json.loads, a pod's name then nests past what str() can recurse through
    a few frames deeper: still one line, whichever of the two gives out."""
    body = PODLIST.replace('"train-llm-0"', "[" * depth + "]" * depth, 1).encode()
    try:
        pods = read(answer, body)
    except ClusterUnreadable as err:
        assert (err.kind, "\n" in str(err)) == ("malformed", False)  # noqa: PT017 (the rejection's contract)
        return
    assert len(pods.waiting) == 2


class Clock:
    """A clock the test moves: `start`, then `step` later at every look."""

    def __init__(self, step: float, start: float = 0.0) -> None:
        self.now, self.step, self.looks = start - step, step, 0

    def __call__(self) -> float:
        self.now, self.looks = self.now + self.step, self.looks + 1
        return self.now


@pytest.mark.parametrize(
    ("spent", "wait", "clipped"),
    [(0.0, 2.0, False), (7.0, 2.0, False), (8.0, 2.0, False), (8.5, 1.5, True), (9.99, 0.01, True)],
)
def test_each_wait_is_the_timeout_or_the_time_left(spent: float, wait: float, clipped: bool) -> None:
    looks = iter([100.0, 100.0 + spent])
    pace = Pace(2.0, 10.0, lambda: next(looks))
    assert pace.wait_s() == pytest.approx(wait)
    assert pace.clipped is clipped


@pytest.mark.parametrize("spent", [10.0, 10.5, 1e9])
def test_no_wait_once_the_budget_is_spent(spent: float) -> None:
    looks = iter([0.0, spent])
    with pytest.raises(BudgetSpent):
        Pace(2.0, 10.0, lambda: next(looks)).wait_s()


class Drip:
    """A socket (and its file) that gives one byte per read and remembers each timeout it was set to."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def settimeout(self, value: float) -> None:
        self.timeouts.append(value)

    def readinto(self, buffer: Any) -> int:
        buffer[0:1] = b"x"
        return 1


def test_every_recv_waits_at_most_the_time_the_budget_has_left() -> None:
    """A byte every 1.5 s against a 10 s budget: six recvs, the last cut to the second left, then none."""
    sock, buffer = Drip(), bytearray(8192)
    reader = _PacedReader(sock, sock, Pace(2.0, 10.0, Clock(1.5)))
    with pytest.raises(BudgetSpent):
        list(map(reader.readinto, [buffer] * 100))
    assert sock.timeouts == [2.0, 2.0, 2.0, 2.0, 2.0, pytest.approx(1.0)]


def served(body: bytes, clock: Clock, budget_s: float = 10.0, encoding: str | None = None) -> Connection:
    connection = Connection(ApiServer("http://kube.example", "t"), 2.0, budget_s, clock)
    answer = OneAnswer(body)
    answer.encoding = encoding
    connection._conn = answer  # type: ignore[assignment]
    return connection


def test_the_body_is_read_in_chunks_with_the_deadline_between() -> None:
    body = json.dumps({"kind": "PodList", "items": [], "pad": "x" * (2 * CHUNK + 10)}).encode()
    connection = served(body, Clock(0.0))
    assert connection.get_json("/api/v1/pods", {})["kind"] == "PodList"
    assert connection.reads == 3  # two whole chunks and the short one that ends it
    slow = served(body, Clock(4.0))  # made at 0 (deadline 10), the GET at 4, chunk one at 8, then 12
    with pytest.raises(HttpProblem, match="the listing took over its 10 s") as err:
        slow.get_json("/api/v1/pods", {})
    assert (err.value.kind, slow.reads) == ("timeout", 1)


def test_an_answer_over_max_body_is_too_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_http, "MAX_BODY", 1000)
    with pytest.raises(HttpProblem, match="the answer is over") as err:
        served(b"x" * 1001, Clock(0.0)).get_json("/", {})
    assert err.value.kind == "too_large"
    bomb = gzip.compress(b" " * 5000)  # 5000 bytes inflated from a few dozen on the wire
    with pytest.raises(HttpProblem, match="inflates past") as err:
        served(bomb, Clock(0.0), encoding="gzip").get_json("/", {})
    assert err.value.kind == "too_large"
