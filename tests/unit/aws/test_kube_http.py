"""An API answer nested past what Python's JSON reader can recurse through is an unreadable cluster (one
line, kind malformed), never a RecursionError out of the scaler: the fuzzer's `b"[" * 100000`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from pydantic import SecretStr

from gpufleet.aws import kubernetes as kube
from gpufleet.aws.kube_http import ApiServer, Connection, HttpProblem, _json
from gpufleet.events.kubernetes import ClusterUnreadable
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

    def request(self, method: str, url: str, headers: dict[str, str]) -> None:
        pass

    def getresponse(self) -> OneAnswer:
        return self

    def read(self, limit: int) -> bytes:
        return self.body[:limit]

    def getheader(self, name: str) -> str | None:
        return None

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
