"""The node's Prometheus endpoint under a hostile neighbour: 1,025 idle connections, then an 8-client scrape
storm, against prometheus_client's start_http_server (before) and gpufleet's bounded server (after).

`python -m bench.prometheus_endpoint` (`--quick`: a 128-fd limit and short phases; numbers not to quote).
Each server runs in a child process whose fd limit is set to 1,024 (resource.setrlimit, soft and hard: the
unit's LimitNOFILE), serving the real collector over the 8-GPU node of bench/prometheus_cost.py. Beside it
a stand-in publisher loop, every 10 ms: reads /proc/self/stat and /proc/self/status (attribution's reads),
opens /proc/loadavg, and opens a TCP connection to a local stand-in for AWS (the parent's; a real AWS call
needs a socket the same way). Its iterations and failures are the publisher's fate.

The parent plays Prometheus (one scrape every 0.25 s from 127.0.0.1, 2 s timeout) and the neighbour: the
idle connections come from 1,025 different loopback addresses (so a per-client cap alone cannot stop them);
the storm is 8 clients, each its own address, each scraping in a loop with gzip as Prometheus asks.
Phases, in order: quiet; the idle flood held; the neighbour gone (connections closed); the storm.
"Server CPU" is the child's CPU less the stand-in thread's own, per second of the phase (100 % = a core).
"""

from __future__ import annotations

import json
import logging
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: node\r\nAccept-Encoding: gzip\r\nUser-Agent: bench\r\n\r\n"
FULL_FDS, QUICK_FDS = 1024, 128
STORM_CLIENTS = 8


# ---- the child: one server and the stand-in publisher ----


class StandIn:
    """The publisher's own fd-needing work, every 10 ms; counts what failed and why."""

    def __init__(self, aws_port: int) -> None:
        self.aws_port = aws_port
        self.iterations = self.failures = 0
        self.errors: dict[str, int] = {}
        self.cpu_s = 0.0
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        while True:
            try:
                for path in ("/proc/self/stat", "/proc/self/status", "/proc/loadavg"):
                    with open(path, "rb") as f:
                        f.read()
                with socket.create_connection(("127.0.0.1", self.aws_port), timeout=2) as s:
                    s.sendall(b"PutMetricData")
            except OSError as exc:
                name = os.strerror(exc.errno) if exc.errno else type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
                self.failures += 1
            self.iterations += 1
            self.cpu_s = time.thread_time()
            time.sleep(0.01)


def _fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1  # none left to list them with


def child(kind: str, fd_limit: int, aws_port: int) -> None:
    """Serves on 127.0.0.1 within `fd_limit` fds; prints the port, then stats on each `stats` line."""
    from prometheus_client import CollectorRegistry, start_http_server

    from bench.prometheus_cost import HOST, node_views
    from gpufleet_node.prometheus import GpuCollector, serve

    resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))
    logging.basicConfig(level=logging.ERROR)  # the bounded server's warnings would interleave with the table
    views = node_views(True)
    collector = GpuCollector(HOST, lambda: views, "i-0123456789abcdef0")
    stats: Any = None
    if kind == "before":
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        server, _ = start_http_server(0, "127.0.0.1", registry)
        port = server.server_address[1]
    else:
        endpoint = serve(collector, 0, "127.0.0.1")
        port, stats = endpoint.port, endpoint.stats
    stand_in = StandIn(aws_port)
    print(json.dumps({"port": port}), flush=True)
    for line in sys.stdin:
        if line.strip() != "stats":
            break
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out = {
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "standin_cpu_s": stand_in.cpu_s,
            "iterations": stand_in.iterations,
            "failures": stand_in.failures,
            "errors": dict(stand_in.errors),
            "threads": threading.active_count(),
            "fds": _fds(),
            "server": stats.as_dict() if stats is not None else None,
        }
        print(json.dumps(out), flush=True)


# ---- the parent: Prometheus, the neighbour, the stand-in for AWS ----


def _address(i: int) -> str:
    """The i-th loopback source address past 127.0.0.1 (Linux routes all of 127/8 to lo)."""
    return f"127.{1 + i // 60000}.{(i // 250) % 240}.{2 + i % 250}"


def scrape(port: int, source: str = "127.0.0.1", timeout: float = 2.0) -> bool:
    """One scrape; True when it came back 200 and whole (to EOF)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0)) as s:
            s.sendall(SCRAPE)
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
    except OSError:
        return False
    head = b"".join(chunks)[:64]
    return head.startswith(b"HTTP/1.") and b" 200 " in head.split(b"\r\n", 1)[0]


class Loop:
    """A client scraping in a loop until stopped: `every_s` apart (0: back to back)."""

    def __init__(self, port: int, source: str, every_s: float, timeout_s: float) -> None:
        self.port, self.source, self.every_s, self.timeout_s = port, source, every_s, timeout_s
        self.ok = self.failed = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopped.is_set():
            if scrape(self.port, self.source, self.timeout_s):
                self.ok += 1
            else:
                self.failed += 1
            if self.every_s:
                self.stopped.wait(self.every_s)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)


def _aws_stand_in() -> tuple[socket.socket, int]:
    """A listener that takes the stand-in publisher's connections and closes them."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(256)

    def run() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=run, daemon=True).start()
    return listener, listener.getsockname()[1]


def _flood(port: int, n: int, settle_s: float) -> list[socket.socket]:
    """`n` idle connections, each from its own address, four at a time. One that has not connected within
    50 ms is dropped and opened again (a full backlog drops SYNs, which the kernel retries only after 1 s,
    3 s, ...), so a server that keeps accepting is never outrun. Once half a second passes with none
    connecting (a server that stopped accepting), the rest are sent without waiting. All within `settle_s`."""
    socks: list[socket.socket] = []
    started = time.monotonic()
    progress = started
    tried = 0
    while len(socks) < n and time.monotonic() - progress < 0.5 and time.monotonic() - started < settle_s:
        batch = [_connect(port, _address(tried + k)) for k in range(min(4, n - len(socks)))]
        tried += len(batch)
        done = _settle(set(batch), 0.05)
        for s in batch:
            if s in done and not s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                socks.append(s)
                progress = time.monotonic()
            else:
                s.close()
    socks.extend(_connect(port, _address(tried + k)) for k in range(n - len(socks)))
    return socks


def _connect(port: int, source: str) -> socket.socket:
    s = socket.socket()
    s.bind((source, 0))
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", port))
    return s


def _settle(pending: set[socket.socket], within_s: float) -> set[socket.socket]:
    """The sockets of `pending` that connected (or failed) within `within_s`."""
    poller = select.poll()  # select() cannot watch fds past 1,024
    by_fd = {s.fileno(): s for s in pending}
    for fd in by_fd:
        poller.register(fd, select.POLLOUT)
    done: set[socket.socket] = set()
    deadline = time.monotonic() + max(0.0, within_s)
    while len(done) < len(by_fd) and time.monotonic() < deadline:
        for fd, _ in poller.poll(max(0.0, deadline - time.monotonic()) * 1000):
            done.add(by_fd[fd])
            poller.unregister(fd)
    return done


class Child:
    def __init__(self, kind: str, fd_limit: int, aws_port: int) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "layers" / "node"), str(ROOT)])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.prometheus_endpoint", "--child", kind, str(fd_limit), str(aws_port)],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.port = int(self._line()["port"])

    def _line(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the benchmark's server child died")
        out: dict[str, Any] = json.loads(line)
        return out

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return self._line()

    def close(self) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()  # the "before" server's 1,000 threads need not end nicely
            self.proc.wait(5)


def _phase(child: Child, name: str, hold_s: float, storm: bool = False) -> dict[str, Any]:
    """One phase: Prometheus scraping every 0.25 s (plus the storm's clients) for `hold_s`."""
    before = child.stats()
    started = time.perf_counter()
    timeout_s = min(2.0, 2 * hold_s)
    prom = Loop(child.port, "127.0.0.1", 0.25, timeout_s)
    clients = [Loop(child.port, _address(5000 + i), 0, timeout_s) for i in range(STORM_CLIENTS)] if storm else []
    time.sleep(hold_s)
    for c in [prom, *clients]:
        c.stopped.set()
    after = child.stats()
    wall = time.perf_counter() - started
    for c in [prom, *clients]:
        c.stop()
    server_cpu = (after["cpu_s"] - after["standin_cpu_s"]) - (before["cpu_s"] - before["standin_cpu_s"])
    errors = {k: v - before["errors"].get(k, 0) for k, v in after["errors"].items() if v > before["errors"].get(k, 0)}
    return {
        "phase": name,
        "prom": (prom.ok, prom.ok + prom.failed),
        "storm": (sum(c.ok for c in clients), sum(c.ok + c.failed for c in clients)),
        "iterations": after["iterations"] - before["iterations"],
        "failures": after["failures"] - before["failures"],
        "errors": errors,
        "cpu_pct": 100 * server_cpu / wall,
        "threads": after["threads"],
        "fds": after["fds"],
        "server": after["server"],
    }


def run_side(kind: str, fd_limit: int, hold_s: float, settle_s: float, aws_port: int) -> list[dict[str, Any]]:
    child = Child(kind, fd_limit, aws_port)
    phases = []
    try:
        phases.append(_phase(child, "quiet", hold_s))
        flood = _flood(child.port, fd_limit + 1, settle_s)
        try:
            phases.append(_phase(child, f"{fd_limit + 1:,} idle connections held", hold_s))
        finally:
            for s in flood:
                s.close()
        time.sleep(hold_s / 4)
        phases.append(_phase(child, "neighbour gone", hold_s))
        phases.append(_phase(child, f"{STORM_CLIENTS}-client scrape storm", hold_s, storm=True))
    finally:
        child.close()
    return phases


def _row(kind: str, p: dict[str, Any]) -> str:
    server = p["server"]
    refused = (
        f"{server['served']:,} served, {server['refused']:,} refused, {server['evicted']:,} evicted, "
        f"{server['timed_out']:,} timed out, {server['renders']:,} renders"
        if server
        else "-"
    )
    why = ", ".join(f"{k} {v}" for k, v in sorted(p["errors"].items()))
    storm = f"{p['storm'][0]:,} / {p['storm'][1]:,}" if p["storm"][1] else "-"
    return (
        f"| {kind} | {p['phase']} | {p['prom'][0]} / {p['prom'][1]} | {storm} | {refused} | "
        f"{p['iterations']:,} ({p['failures']:,} failed{': ' + why if why else ''}) | {p['cpu_pct']:.1f} % | "
        f"{p['threads']:,} | {p['fds'] if p['fds'] >= 0 else 'all'} |"
    )


HEAD = (
    "| server | phase | Prometheus scrapes ok / tried | storm scrapes ok / tried | server's own count | "
    "stand-in publisher iterations (failures) | server CPU, % of a core | threads | fds open |",
    "|---|---|---:|---:|---|---|---:|---:|---:|",
)


def bench_prometheus_endpoint(quick: bool = False) -> list[str]:
    """Markdown rows: each phase against each server."""
    # held past the bounded server's 5 s read timeout, so its timeouts show
    fd_limit, hold_s, settle_s = (QUICK_FDS, 0.15, 0.15) if quick else (FULL_FDS, 6.0, 10.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * fd_limit:  # the parent holds the neighbour's connections
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8 * fd_limit), hard))
    listener, aws_port = _aws_stand_in()
    rows = list(HEAD)
    try:
        for kind, label in (("before", "start_http_server (before)"), ("after", "bounded (after)")):
            rows.extend(_row(label, p) for p in run_side(kind, fd_limit, hold_s, settle_s, aws_port))
    finally:
        listener.close()
    return rows


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        print("\n".join(bench_prometheus_endpoint(quick="--quick" in sys.argv[1:])))
