"""Answers the API server closes after sending: `Connection: close` (a server shutting down, a proxy) and
HTTP/1.0, with or without a Content-Length, over TLS and plain. getresponse() closes the connection's
socket for such an answer and the response reads on through its own socket file; a body bigger than the
first read (about 8 KB) used to be read off the closed socket instead: "Bad file descriptor", every time.
The drip and size bounds hold for these answers as for kept-alive ones."""

from __future__ import annotations

import gc
import gzip
import json
import time
import warnings
from collections.abc import Iterator
from contextlib import suppress
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpufleet.kubernetes import client as kube_http
from gpufleet.kubernetes.client import ApiServer, Connection, HttpProblem, Pace
from rehearsal.loopback import serve
from tests.tls import self_signed_certificate

KB = 1024
SIZES = [1 * KB, 9 * KB, 64 * KB, 2 * KB * KB]  # under the first read, just over it, a few reads, pages' size
FRAMINGS = {  # how the answer says it ends: its status line and the headers that frame its body
    "close": ("HTTP/1.1", "Connection: close\r\n", True),
    "close-to-eof": ("HTTP/1.1", "Connection: close\r\n", False),
    "http10": ("HTTP/1.0", "", True),
    "http10-to-eof": ("HTTP/1.0", "", False),
}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1 (tests/tls.py)."""
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


def document(size: int) -> bytes:
    """A JSON object of exactly `size` bytes."""
    shell = b'{"kind":"PodList","pad":""}'
    return shell[:-2] + b"x" * (size - len(shell)) + shell[-2:]


class Closing(BaseHTTPRequestHandler):
    """A Kubernetes API stand-in that answers `GET /FRAMING/SIZE` with a SIZE-byte JSON object framed as
    FRAMING, then closes the connection; `?gzip=1`: the body gzipped; `?drip_s=S`: the head at once,
    then the body a byte at a time, S apart."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.close_connection = True
        parts = urlsplit(self.path)
        framing, size = parts.path.strip("/").split("/")
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        version, connection, sized = FRAMINGS[framing]
        body = document(int(size))
        body = gzip.compress(body) if query.get("gzip") else body
        head = f"{version} 200 OK\r\nContent-Type: application/json\r\n{connection}"
        head += f"Content-Length: {len(body)}\r\n" if sized else ""
        head += "Content-Encoding: gzip\r\n" if query.get("gzip") else ""
        with suppress(OSError):  # the client hung up: on a bound it enforced
            self.wfile.write(f"{head}\r\n".encode())
            if "drip_s" not in query:
                self.wfile.write(body)
                return
            for byte in body[:5000]:
                self.wfile.write(bytes([byte]))
                time.sleep(float(query["drip_s"]))


@pytest.fixture(scope="module")
def servers(certificate: tuple[str, str]) -> Iterator[dict[bool, ApiServer]]:
    """The stand-in over TLS (True: its own CA trusted, as EKS's) and plain HTTP (False)."""
    with serve(Closing, tls=certificate) as tls, serve(Closing) as plain:
        yield {True: ApiServer(tls, "t", ca_pem=Path(certificate[0]).read_text()), False: ApiServer(plain, "t")}


TLS = pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])


@pytest.mark.parametrize("size", SIZES, ids=lambda n: f"{n // KB}KB")
@pytest.mark.parametrize("framing", FRAMINGS)
@TLS
def test_a_closing_answer_is_read_whole(servers: dict[bool, ApiServer], tls: bool, framing: str, size: int) -> None:
    got = Connection(servers[tls], 2.0, 10.0).get_json(f"/{framing}/{size}")
    assert (got["kind"], len(json.dumps(got, separators=(",", ":")))) == ("PodList", size)


@pytest.mark.parametrize("framing", FRAMINGS)
@TLS
def test_each_get_after_a_closing_answer_opens_afresh_and_leaks_no_socket(
    servers: dict[bool, ApiServer], tls: bool, framing: str
) -> None:
    """Pages two and three of a listing (and a gzipped one) on the same Connection: each on a new
    socket, each socket closed once its body is read (no ResourceWarning when the connection goes)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        connection = Connection(servers[tls], 2.0, 10.0)
        pages = [connection.get_json(f"/{framing}/{64 * KB}", {"gzip": g})["kind"] for g in ("", "", "1")]
        assert pages == ["PodList"] * 3
        del connection
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


class Clock:
    """A clock the test moves: `step` later at every look."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.looks = -step, step, 0

    def __call__(self) -> float:
        self.now, self.looks = self.now + self.step, self.looks + 1
        return self.now


@pytest.mark.parametrize("framing", FRAMINGS)
@TLS
def test_a_closing_answer_that_drips_ends_at_the_budget(
    servers: dict[bool, ApiServer], monkeypatch: pytest.MonkeyPatch, tls: bool, framing: str
) -> None:
    """The head at once, then a byte at a time; the clock says each look took 1.5 s. Every read of the
    body is given min(timeout, time left) and the listing ends at its 10 s budget (before the fix: read
    off the closed socket, "Bad file descriptor")."""
    waits: list[float] = []
    real = Pace.wait_s

    def wait_s(self: Pace) -> float:
        waits.append(real(self))
        return waits[-1]

    monkeypatch.setattr(Pace, "wait_s", wait_s)
    clock = Clock(1.5)
    connection = Connection(servers[tls], 2.0, 10.0, clock)
    with pytest.raises(HttpProblem, match="the listing took over its 10 s") as err:
        connection.get_json(f"/{framing}/{2 * KB * KB}", {"drip_s": "0.001"})
    assert err.value.kind == "timeout"
    assert waits[-1] == pytest.approx(1.0)  # the last wait cut to the time left
    assert max(waits) == 2.0
    assert clock.looks <= 10 / 1.5 + 2


@pytest.mark.parametrize(("framing", "tls"), [("close", True), ("http10-to-eof", False)], ids=["close-tls", "http10"])
def test_a_closing_answer_that_drips_ends_at_the_budget_on_the_wall_clock(
    servers: dict[bool, ApiServer], framing: str, tls: bool
) -> None:
    """The same on the real clock: a byte every 20 ms, each one resetting a plain socket timeout, and a
    0.6 s budget still ends the read within it."""
    connection = Connection(servers[tls], 0.3, 0.6)
    started = time.monotonic()
    with pytest.raises(HttpProblem, match=r"the listing took over its 0\.6 s") as err:
        connection.get_json(f"/{framing}/{2 * KB * KB}", {"drip_s": "0.02"})
    took = time.monotonic() - started
    assert err.value.kind == "timeout"
    assert took < 0.6 + 0.3


@pytest.mark.parametrize("framing", FRAMINGS)
@TLS
def test_a_closing_answer_over_max_body_is_too_large(
    servers: dict[bool, ApiServer], monkeypatch: pytest.MonkeyPatch, tls: bool, framing: str
) -> None:
    """2 MB against a 64 KB cap: cut at the cap, whether the body is sized or runs to the close; a gzip
    bomb (a few KB inflating to 2 MB) is cut as it inflates."""
    monkeypatch.setattr(kube_http, "MAX_BODY", 64 * KB)
    monkeypatch.setattr(kube_http, "CHUNK", 16 * KB)  # four reads up to the cap, then the one over it
    connection = Connection(servers[tls], 2.0, 10.0)
    with pytest.raises(HttpProblem, match="the answer is over") as err:
        connection.get_json(f"/{framing}/{2 * KB * KB}")
    assert (err.value.kind, connection.reads) == ("too_large", 5)
    with pytest.raises(HttpProblem, match="the answer inflates past") as err:
        Connection(servers[tls], 2.0, 10.0).get_json(f"/{framing}/{2 * KB * KB}", {"gzip": 1})
    assert err.value.kind == "too_large"
