"""The Prometheus endpoint's bounds (issue 29): a connection cap that turns the excess away at once, idle and
trickling connections cut off, one render per interval, the bind address honoured, and the publisher's own
file work unharmed while a neighbour floods the port. Real sockets on loopback; short injected timeouts;
no assertion on elapsed time (waits poll the server's own counters). Runs under Python 3.9 and 3.13."""

import contextlib
import os
import resource
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterator, List

import pytest
from prometheus_client import CollectorRegistry

from gpufleet_node.nvml import GpuSample
from gpufleet_node.prometheus import Endpoint, GpuCollector, GpuView, serve
from gpufleet_node.scrape_server import Limits, Renderer, connection_cap

HOST = "ip-10-0-1-23.ec2.internal"
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n"


def views() -> List[GpuView]:
    return [GpuView(0, "GPU-0", "NVIDIA H100 80GB HBM3", GpuSample(utilization=87.0))]


class Counting:
    """A collector's views that count how often the endpoint rendered."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> List[GpuView]:
        self.calls += 1
        return views()


def eventually(check: Callable[[], bool]) -> bool:
    """Polls `check` for a while (up to ~10 s on a loaded machine); the answer, not the time, is asserted."""
    for _ in range(1000):
        if check():
            return True
        time.sleep(0.01)
    return check()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    return s


def read_all(s: socket.socket) -> bytes:
    chunks = []
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response else 0


@pytest.fixture
def start() -> Iterator[Callable[..., Endpoint]]:
    started: List[Endpoint] = []

    def run(limits: Limits, **kw: object) -> Endpoint:
        endpoint = serve(GpuCollector(HOST, kw.pop("views", views)), 0, "127.0.0.1", limits, **kw)  # type: ignore[arg-type]
        started.append(endpoint)
        return endpoint

    yield run
    for endpoint in started:
        endpoint.stop()


# ---- the cap ----


def test_at_the_cap_a_new_connection_takes_the_place_of_the_oldest_idle_one(start):
    endpoint = start(Limits(max_connections=2, max_per_client=10, read_timeout_s=60))
    idle = [connect(endpoint.port, "127.0.0.%d" % (2 + i)) for i in range(2)]
    assert eventually(lambda: endpoint.server.open_connections == 2)
    scraper = connect(endpoint.port)
    scraper.sendall(REQUEST)
    assert status(read_all(scraper)) == 200  # served, although two were open before it
    assert status(read_all(idle[0])) == 503  # the oldest idle one was told and closed
    assert endpoint.stats.evicted == 1 and endpoint.stats.refused == 0
    for s in [*idle, scraper]:
        s.close()


def test_at_the_cap_with_none_idle_the_new_connection_is_refused_at_once(start, caplog):
    # One response, then the rate holds the next requests: they are in, waiting, and not idle.
    endpoint = start(Limits(max_connections=3, max_per_client=10, responses_per_s=0.001, read_timeout_s=60))
    first = connect(endpoint.port)
    first.sendall(REQUEST)
    assert status(read_all(first)) == 200
    waiting = [connect(endpoint.port, "127.0.0.%d" % (2 + i)) for i in range(3)]
    for s in waiting:
        s.sendall(REQUEST)
    assert eventually(lambda: endpoint.server.waiting == 3)
    extra = connect(endpoint.port, "127.0.0.9")
    assert status(read_all(extra)) == 503  # not queued: answered and closed
    assert endpoint.stats.refused == 1 and endpoint.server.open_connections == 3
    assert any("at the connection cap (3); refused" in r.getMessage() for r in caplog.records)
    for s in [first, *waiting, extra]:
        s.close()


def test_one_client_gets_at_most_its_share(start, caplog):
    endpoint = start(Limits(max_connections=10, max_per_client=2, read_timeout_s=60))
    mine = [connect(endpoint.port) for _ in range(2)]
    assert eventually(lambda: endpoint.server.open_connections == 2)
    third = connect(endpoint.port)
    assert status(read_all(third)) == 503
    other = connect(endpoint.port, "127.0.0.2")
    other.sendall(REQUEST)
    assert status(read_all(other)) == 200  # another address still gets in
    assert endpoint.stats.refused == 1
    # The log names the limit that refused it (before: "at the connection cap (10)", with 2 open).
    said = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(said) == 1 and "at the per-address limit (2)" in said[0] and "cap" not in said[0]
    for s in [*mine, third, other]:
        s.close()


def test_the_cap_keeps_three_quarters_of_the_fd_limit_for_the_publisher():
    assert connection_cap(64, 1024) == 64
    assert connection_cap(64, 128) == 32
    assert connection_cap(64, 2) == 1
    assert connection_cap(64, resource.RLIM_INFINITY) == 64


# ---- deadlines ----


def test_an_idle_connection_is_closed_at_its_read_deadline(start):
    endpoint = start(Limits(read_timeout_s=0.2))
    idle = connect(endpoint.port)
    assert read_all(idle) == b""  # closed by the server, never answered
    assert eventually(lambda: endpoint.stats.timed_out == 1)
    assert eventually(lambda: endpoint.server.open_connections == 0)  # counted down after the timeout
    idle.close()


def test_a_client_trickling_its_request_is_cut_off_although_it_keeps_sending(start):
    endpoint = start(Limits(read_timeout_s=0.2))
    slow = connect(endpoint.port)
    sent = 0
    try:
        for byte in REQUEST[:-4] + b"X" * 10000:  # never finishes the head
            slow.sendall(bytes([byte]))
            sent += 1
            if endpoint.stats.timed_out:
                break
            time.sleep(0.01)
    except OSError:
        pass
    assert eventually(lambda: endpoint.stats.timed_out == 1)
    assert sent < 10000 and endpoint.stats.served == 0
    slow.close()


def test_an_oversized_request_head_is_dropped(start):
    endpoint = start(Limits())
    big = connect(endpoint.port)
    with contextlib.suppress(OSError):  # the server may close while we still send
        big.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20000)
    assert read_all(big) == b""
    assert endpoint.stats.bad_requests == 1
    big.close()


# ---- one render per interval ----


def test_render_is_cached_per_interval_by_the_injected_clock():
    now = [100.0]
    counting = Counting()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GpuCollector(HOST, counting))
    renderer = Renderer(registry, 15.0, clock=lambda: now[0])
    text = renderer.body("", "")
    assert counting.calls == 1 and text[0].startswith("text/plain") and b"gpufleet_gpu_utilization_percent" in text[2]
    assert renderer.body("", "gzip")[1] is True  # another encoding of the same collect
    assert renderer.body("application/openmetrics-text; version=1.0.0", "")[2].rstrip().endswith(b"# EOF")
    now[0] = 114.9
    assert renderer.body("", "") == text and counting.calls == 1
    now[0] = 115.0
    renderer.body("", "")
    assert counting.calls == 2
    now[0] = 50.0  # the clock went back: render, do not serve stale forever
    renderer.body("", "")
    assert counting.calls == 3


def test_the_endpoint_serves_one_render_to_many_scrapes(start):
    counting = Counting()
    endpoint = start(Limits(render_every_s=30, responses_per_s=1000), views=counting, clock=lambda: 7.0)
    for _ in range(5):
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % endpoint.port, timeout=10) as resp:
            assert b"gpufleet_gpu_utilization_percent" in resp.read()
    assert counting.calls == 1 and endpoint.stats.served == 5 and endpoint.stats.renders == 1


def test_requests_over_the_response_rate_wait_their_turn_and_are_answered(start):
    endpoint = start(Limits(responses_per_s=1000, render_every_s=30))
    socks = [connect(endpoint.port, "127.0.0.%d" % (2 + i)) for i in range(8)]
    for s in socks:
        s.sendall(REQUEST)
    assert [status(read_all(s)) for s in socks] == [200] * 8
    for s in socks:
        s.close()


# ---- the bind address ----


def test_the_bind_address_is_honoured(start):
    endpoint = start(Limits())
    assert endpoint.address == "127.0.0.1"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", endpoint.port), timeout=10)  # another local address: not bound
    s = connect(endpoint.port)
    s.sendall(REQUEST)
    assert status(read_all(s)) == 200
    s.close()


def test_an_ipv6_bind_address_works():
    try:
        endpoint = serve(GpuCollector(HOST, views), 0, "::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    try:
        with urllib.request.urlopen("http://[::1]:%d/metrics" % endpoint.port, timeout=10) as resp:
            assert resp.status == 200
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", endpoint.port), timeout=10)  # IPv4 loopback: not bound
    finally:
        endpoint.stop()


# ---- the publisher's own work while a neighbour floods the port ----

FLOODER = textwrap.dedent(
    """
    import resource, socket, sys, time
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    port, n = int(sys.argv[1]), int(sys.argv[2])
    socks, tried, progress = [], 0, time.monotonic()
    # Each from its own address; one not connected in 50 ms is opened again (a full backlog drops SYNs,
    # retried by the kernel only after 1 s), until half a second passes with none connecting.
    while len(socks) < n and time.monotonic() - progress < 0.5:
        s = socket.socket()
        s.bind(("127.0.%d.%d" % (1 + tried // 250, 2 + tried % 250), 0))
        tried += 1
        s.settimeout(0.05)
        try:
            s.connect(("127.0.0.1", port))
        except OSError:
            s.close()
            continue
        socks.append(s)
        progress = time.monotonic()
    print("ready", flush=True)
    sys.stdin.read()
    """
)


def _publisher_work(stop: threading.Event, counts: List[int]) -> None:
    """The fd-needing part of a publisher iteration: /proc reads and a socket (an AWS call needs one)."""
    while not stop.is_set():
        try:
            with open("/proc/self/stat", "rb") as f:
                f.read()
            a, b = socket.socketpair()
            a.close()
            b.close()
            counts[0] += 1
        except OSError:
            counts[1] += 1
        time.sleep(0.002)


def test_the_publisher_keeps_its_fds_and_scrapes_go_on_while_a_neighbour_floods_the_port():
    """The issue's finding, scaled down: connections past the fd limit from many addresses. With one thread
    per connection (start_http_server) they took every fd and the publisher's own opens failed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = len(os.listdir("/proc/self/fd")) + 120
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    flooder = None
    try:
        endpoint = serve(GpuCollector(HOST, views), 0, "127.0.0.1", Limits(read_timeout_s=60))
        assert endpoint.server.cap == limit // 4
        flooder = subprocess.Popen(
            [sys.executable, "-c", FLOODER, str(endpoint.port), str(limit + 1)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert flooder.stdout is not None and flooder.stdout.readline() == b"ready\n"
        assert eventually(lambda: endpoint.stats.evicted + endpoint.stats.refused > 0)  # the cap is hit
        stop, counts = threading.Event(), [0, 0]
        worker = threading.Thread(target=_publisher_work, args=(stop, counts))
        worker.start()
        try:
            assert eventually(lambda: counts[0] >= 50)
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % endpoint.port, timeout=10) as resp:
                assert resp.status == 200  # a scraper still gets in: it takes an idle one's place
        finally:
            stop.set()
            worker.join(10)
        assert counts[1] == 0, "the publisher's own opens failed %d times" % counts[1]
        assert endpoint.server.open_connections <= endpoint.server.cap
        endpoint.stop()
    finally:
        if flooder is not None:
            flooder.communicate(b"", timeout=30)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_unit_sets_the_fd_limit_the_cap_is_sized_against():
    """LimitNOFILE is explicit (the finding: the unit had none) and the cap leaves the publisher most of it."""
    unit = (Path(__file__).resolve().parents[2] / "ami" / "gpufleet-publisher.service").read_text()
    limits = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("LimitNOFILE=")]
    assert len(limits) == 1 and limits[0].isdigit(), limits
    fds = int(limits[0])
    cap = connection_cap(Limits().max_connections, fds)
    assert cap <= fds // 4 and fds - cap - 2 >= 512  # + the listener and one being turned away
