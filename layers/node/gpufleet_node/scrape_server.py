"""The Prometheus endpoint's HTTP server: one thread, a connection cap, deadlines, a response rate, and one
render per interval served from cache. Python >= 3.9, standard library only (plus prometheus_client's encoders).

Why not prometheus_client's start_http_server: it starts a thread per connection and never times one out.
A pod that reached the port opened 1,025 idle connections: they took every fd of the process (1,024), the
accept loop spun on EMFILE at 88 % of a core, and the publisher's own /proc reads and AWS calls failed, even
after the pod left. Eight clients scraping in a loop cost a whole core, five times the unit's CPUQuota,
which throttles the publisher's own thread too. So here:

- One thread serves every connection (selectors). The publisher never waits on it: it reads the
  publisher's latest samples, the publisher never calls into it.
- At most `max_connections` connections at once, `max_per_client` from one address. At the cap, a new
  connection takes the place of the oldest one that has not sent its request yet (answered 503 and closed);
  with none such, the new one is answered 503 and closed at once. Nothing is queued: a neighbour holding
  idle connections cannot keep a scraper that sends its request out. The cap is also held to a quarter of
  the fd limit, so scrapers can never take the fds the publisher needs (the unit sets LimitNOFILE).
- A request must arrive whole within `read_timeout_s` of the connect: a client that sends nothing, or
  trickles a byte at a time (slowloris), is cut off. A response must be sent within `write_timeout_s`.
- At most `responses_per_s` responses a second. A request over that waits its turn (waiting costs nothing)
  until its write deadline. Refusals (and evictions) are at most `refusals_per_s`; past that the server stops accepting
  for the rest of the second and the kernel's listen backlog (`BACKLOG`) holds or drops the rest.
- Out of fds anyway (EMFILE): accepting pauses for `PAUSE_S` instead of spinning.
- The registry is collected at most once per `render_every_s`, and each format encoded from that one
  collect by prometheus_client's own encoders (never hand-written), gzipped once, served from cache.

One connection, one request: every response says `Connection: close`.
"""

import collections
import contextlib
import errno
import gzip
import logging
import resource
import selectors
import socket
import threading
import time
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Tuple

from prometheus_client.exposition import choose_encoder, gzip_accepted

log = logging.getLogger("gpufleet.publisher")

BACKLOG = 64  # the kernel's queue of connections not yet accepted; past it, connects are dropped
ACCEPTS_PER_ROUND = 16  # well under the cap: the newest connections are never the oldest idle ones
PAUSE_S = 0.5  # accepting pauses this long after EMFILE/ENFILE: no busy loop on a full fd table
MAX_REQUEST_BYTES = 8192  # a scrape's request line and headers are a few hundred bytes
MAX_FORMATS = 4  # cached encodings per render (text, OpenMetrics, each gzipped or not)
LOG_EVERY = 100  # refusals and timeouts are logged on the 1st, 101st, ...
OUT_OF_FDS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Limits:
    """The bounds, all in one place. Defaults: a node has one or two scrapers every 15-30 s."""

    __slots__ = (
        "max_connections",
        "max_per_client",
        "read_timeout_s",
        "refusals_per_s",
        "render_every_s",
        "responses_per_s",
        "write_timeout_s",
    )

    def __init__(
        self,
        max_connections: int = 64,
        max_per_client: int = 4,
        read_timeout_s: float = 5.0,
        write_timeout_s: float = 10.0,
        responses_per_s: float = 20.0,
        refusals_per_s: int = 200,
        render_every_s: float = 1.0,
    ) -> None:
        self.max_connections = max_connections
        self.max_per_client = max_per_client
        self.read_timeout_s = read_timeout_s
        self.write_timeout_s = write_timeout_s
        self.responses_per_s = responses_per_s
        self.refusals_per_s = refusals_per_s
        self.render_every_s = render_every_s


def connection_cap(wanted: int, fd_limit: Optional[int] = None) -> int:
    """`wanted`, held to a quarter of the process's fd limit: three quarters stay the publisher's."""
    if fd_limit is None:
        fd_limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if fd_limit == resource.RLIM_INFINITY or fd_limit <= 0:
        return wanted
    return max(1, min(wanted, fd_limit // 4))


class Stats:
    """Counters, written by the server thread only (read them from anywhere)."""

    __slots__ = ("accepted", "bad_requests", "evicted", "out_of_fds", "refused", "renders", "served", "timed_out")

    def __init__(self) -> None:
        self.accepted = self.served = self.refused = self.evicted = self.timed_out = 0
        self.bad_requests = self.renders = self.out_of_fds = 0

    def as_dict(self) -> Dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class _Frozen:
    """One collect's metrics, given to prometheus_client's encoders as if it were the registry."""

    def __init__(self, metrics: List[Any]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Any]:
        return iter(self._metrics)


class Renderer:
    """The scrape body: the registry collected at most once per `every_s` (by `clock`), each format encoded
    from that one collect with prometheus_client's encoders and kept until the next collect."""

    def __init__(self, registry: Any, every_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.every_s = every_s
        self.clock = clock
        self.collects = 0
        self._at: Optional[float] = None
        self._frozen = _Frozen([])
        self._bodies: Dict[Tuple[str, bool], Tuple[str, bytes]] = {}

    def body(self, accept: str, accept_encoding: str) -> Tuple[str, bool, bytes]:
        """(content type, gzipped, bytes) for a request's Accept and Accept-Encoding headers."""
        now = self.clock()
        if self._at is None or not 0 <= now - self._at < self.every_s:  # a clock that went back renders too
            self._frozen = _Frozen(list(self.registry.collect()))
            self._bodies = {}
            self._at = now
            self.collects += 1
        encoder, content_type = choose_encoder(accept)
        gzipped = gzip_accepted(accept_encoding)
        key = (content_type, gzipped)
        cached = self._bodies.get(key)
        if cached is None:
            raw = encoder(self._frozen)
            cached = (content_type, gzip.compress(raw) if gzipped else raw)
            if len(self._bodies) < MAX_FORMATS:  # odd Accept versions cannot grow the cache
                self._bodies[key] = cached
        return cached[0], gzipped, cached[1]


class _Conn:
    """One client connection. `reading`: its request is not in yet (it may be evicted for a newer one)."""

    __slots__ = ("buf", "deadline", "out", "peer", "reading", "request", "sock")

    def __init__(self, sock: socket.socket, peer: str, deadline: float) -> None:
        self.sock = sock
        self.peer = peer
        self.deadline = deadline
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.reading = True
        self.request: Optional[Tuple[str, str, Dict[str, str]]] = None

    def feed(self, chunk: bytes) -> bool:
        """Takes bytes of the request; True when the head grew past MAX_REQUEST_BYTES unfinished."""
        self.buf += chunk
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return len(self.buf) > MAX_REQUEST_BYTES
        self.request = parse_request(bytes(self.buf[:end]))
        self.buf = bytearray()
        self.reading = False
        return False


REFUSED = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 500: "Internal Server Error"}
PATHS = ("/metrics", "/")


def parse_request(raw: bytes) -> Optional[Tuple[str, str, Dict[str, str]]]:
    """(method, path, lower-cased headers) of a request head, or None when it is not HTTP/1.x."""
    try:
        lines = raw.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1."):
        return None
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return method, target.split("?", 1)[0], headers


class BoundedServer:
    """Serves `renderer` on addr:port from one daemon thread, within `limits` (see the module docstring)."""

    def __init__(
        self,
        renderer: Renderer,
        port: int,
        addr: str = "0.0.0.0",
        limits: Optional[Limits] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.renderer = renderer
        self.limits = limits or Limits()
        self.clock = clock
        self.stats = Stats()
        self.cap = connection_cap(self.limits.max_connections)
        self._listener = listening_socket(addr, port)
        self.address: Tuple[str, int] = self._listener.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: Dict[int, _Conn] = {}
        self._per_client: Dict[str, int] = collections.Counter()
        self._waiting: Deque[_Conn] = collections.deque()
        self._rate = TokenBucket(self.limits.responses_per_s, clock())
        self._refusals = PerSecond(self.limits.refusals_per_s)
        self._listening_from: Optional[float] = None  # None: accepting; else paused until then
        self._listen(True)
        self._stopping = False  # set by stop()
        self._thread = threading.Thread(target=self._run, name="gpufleet-prometheus", daemon=True)
        self._thread.start()

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def waiting(self) -> int:  # requests in, waiting for the response rate
        return len(self._waiting)

    def stop(self, timeout: float = 5.0) -> None:
        """Closes the listener and every connection; the port is free again when this returns."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._once()
        except Exception:  # a bug here stops the endpoint, never the publisher
            log.exception("Prometheus endpoint stopped")
        finally:
            for conn in list(self._conns.values()):
                self._close(conn)
            for closable in (self._selector, self._listener, self._wake_r, self._wake_w):
                closable.close()

    def _once(self) -> None:
        now = self.clock()
        if self._listening_from is not None and now >= self._listening_from:
            self._listen(True)
        for key, mask in self._selector.select(self._wait_s(now)):
            if key.data == "wake":
                self._wake_r.recv(64)
            elif key.data is None:
                self._accept()
            elif mask & selectors.EVENT_READ:
                self._read(key.data)
            else:
                self._write(key.data)
        now = self.clock()
        self._answer(now)
        self._expire(now)

    def _wait_s(self, now: float) -> float:
        """Until the next deadline, token or resume: never longer than 1 s, so a stop is seen promptly."""
        wake = [now + 1.0, *(c.deadline for c in self._conns.values())]
        if self._waiting:
            wake.append(now + self._rate.wait_s())
        if self._listening_from is not None:
            wake.append(self._listening_from)
        return max(0.0, min(wake) - now)

    def _listen(self, on: bool, until: Optional[float] = None) -> None:
        if on:
            self._selector.register(self._listener, selectors.EVENT_READ, None)
            self._listening_from = None
        elif self._listening_from is None:
            self._selector.unregister(self._listener)
            self._listening_from = until

    def _accept(self) -> None:
        """Up to ACCEPTS_PER_ROUND: requests already sent are read before their sender could be evicted."""
        for _ in range(ACCEPTS_PER_ROUND):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in OUT_OF_FDS:
                    raise
                self.stats.out_of_fds += 1
                _warn(self.stats.out_of_fds, "out of file descriptors; pausing accepts (%s)", exc)
                self._listen(False, self.clock() + PAUSE_S)
                return
            host = str(peer[0])
            if len(self._conns) >= self.cap and self._per_client[host] < self.limits.max_per_client:
                idle = next((c for c in self._conns.values() if c.reading), None)  # the oldest such
                if idle is not None:
                    self._turn_away(idle.sock, idle.peer, evicted=True)
                    self._close(idle)
            if len(self._conns) >= self.cap or self._per_client[host] >= self.limits.max_per_client:
                self._turn_away(sock, host)
                sock.close()
            else:
                sock.setblocking(False)
                conn = self._conns[sock.fileno()] = _Conn(sock, host, self.clock() + self.limits.read_timeout_s)
                self._per_client[host] += 1
                self._selector.register(sock, selectors.EVENT_READ, conn)
                self.stats.accepted += 1
            if self._listening_from is not None:
                return

    def _turn_away(self, sock: socket.socket, host: str, evicted: bool = False) -> None:
        """A 503 (best effort; the caller closes), not a queue; the log names the limit: per address or all."""
        with contextlib.suppress(OSError):
            sock.setblocking(False)
            sock.send(REFUSED)
        self.stats.evicted += evicted
        self.stats.refused += not evicted
        what = "evicted an idle connection" if evicted else "refused a connection"
        mine = not evicted and self._per_client[host] >= self.limits.max_per_client
        limit = ("the per-address limit", self.limits.max_per_client) if mine else ("the connection cap", self.cap)
        _warn(self.stats.refused + self.stats.evicted, "at %s (%d); %s from %s", *limit, what, host)
        now = self.clock()
        if self._refusals.spent(now):  # a connect flood: let the kernel's backlog take it
            self._listen(False, float(int(now) + 1))

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:  # the client left
            self._close(conn)
            return
        if conn.feed(chunk):
            self.stats.bad_requests += 1
            self._close(conn)
            return
        if conn.reading:
            return
        conn.deadline = self.clock() + self.limits.write_timeout_s
        self._selector.unregister(conn.sock)
        self._waiting.append(conn)

    def _answer(self, now: float) -> None:
        """Answers waiting requests while the response rate allows."""
        while self._waiting and self._rate.take(now):
            conn = self._waiting.popleft()
            if conn.sock.fileno() < 0:
                self._rate.give_back()
                continue  # timed out while waiting
            conn.out = memoryview(respond(self.renderer, self.stats, conn.request))
            self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
            self._write(conn)

    def _write(self, conn: _Conn) -> None:
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # the client left
            self._close(conn)
            return
        conn.out = conn.out[sent:]
        if not conn.out:
            self._close(conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            self.stats.timed_out += 1
            _warn(self.stats.timed_out, "a connection from %s timed out", conn.peer)
            self._close(conn)

    def _close(self, conn: _Conn) -> None:
        fd = conn.sock.fileno()
        if fd < 0:
            return
        with contextlib.suppress(KeyError, ValueError):  # waiting for its turn: not registered
            self._selector.unregister(conn.sock)
        conn.sock.close()
        del self._conns[fd]
        self._per_client[conn.peer] -= 1
        if not self._per_client[conn.peer]:  # a flood from many addresses leaves no trail
            del self._per_client[conn.peer]


def _head(status: int, content_type: str, length: int, gzipped: bool = False) -> bytes:
    lines = [
        "HTTP/1.1 %d %s" % (status, REASONS[status]),
        "Content-Type: " + content_type,
        "Content-Length: %d" % length,
        "Connection: close",
    ]
    if gzipped:
        lines.append("Content-Encoding: gzip")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def listening_socket(addr: str, port: int) -> socket.socket:
    """A non-blocking listener on addr:port (IPv6 when the address is)."""
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((addr, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class PerSecond:
    """Counts events per clock second; `spent` says when this second's budget is used up."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._second = -1
        self._count = 0

    def spent(self, now: float) -> bool:
        if int(now) != self._second:
            self._second, self._count = int(now), 0
        self._count += 1
        return self._count >= self.budget


def respond(renderer: Renderer, stats: Stats, request: Optional[Tuple[str, str, Dict[str, str]]]) -> bytes:
    """The whole response to one request (its head alone for HEAD)."""
    if request is None:
        stats.bad_requests += 1
        return _head(400, "text/plain", 0)
    method, path, headers = request
    if method not in ("GET", "HEAD"):
        return _head(405, "text/plain", 0)
    if path not in PATHS:
        return _head(404, "text/plain", 0)
    renders = renderer.collects
    try:
        content_type, gzipped, body = renderer.body(headers.get("accept", ""), headers.get("accept-encoding", ""))
    except Exception:  # the collector catches its own failures; this is for anything it missed
        log.exception("Prometheus endpoint: rendering failed")
        return _head(500, "text/plain", 0)
    stats.renders += renderer.collects - renders
    stats.served += 1
    head = _head(200, content_type, len(body), gzipped)
    return head if method == "HEAD" else head + body


class TokenBucket:
    """`rate` a second, in bursts of up to max(1, rate)."""

    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self.tokens = self.burst
        self.at = now

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True

    def give_back(self) -> None:
        self.tokens += 1.0

    def wait_s(self) -> float:
        """Until the next token."""
        return max(0.0, 1.0 - self.tokens) / max(self.rate, 1e-3)


def _warn(count: int, what: str, *args: Any) -> None:
    """Logs on the 1st, 101st, ... occurrence: a flood must not flood the journal too."""
    if count % LOG_EVERY == 1:
        log.warning("Prometheus endpoint: " + what + " (%d so far)", *args, count)
