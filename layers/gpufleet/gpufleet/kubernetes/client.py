"""The least a Kubernetes API client needs to list pods (and to cordon a node): GET, PATCH or POST a JSON
document with a bearer token, trusting the cluster's own certificate authority, within a deadline.
Standard library only.

Why not a client library: lightkube (the small one) 1.0.1 brings 13 new distributions into the layer for
this one GET (httpx2 and httpcore2, a fork of httpx; HTTP/2, websockets, anyio, truststore, the compiled
msgspec and the generated models: 4.9 MB, a quarter more layer); it decodes pods into strict typed
models, so one pod off its schema fails the whole listing where the pure core reads the API's JSON
leniently; and it neither restarts a listing on 410 Gone nor says how many pages it took.

No retries: the scaler asks again next minute, and a cluster that cannot be read falls back to the
utilization rules. The token travels in a header only: never in a URL, a message or a repr.
"""

from __future__ import annotations

import base64
import binascii
import gc
import http.client
import io
import json
import ssl
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any
from urllib.parse import urlencode, urlsplit

MAX_BODY = 32 * 1024 * 1024  # inflated: parsed, ~7x that in Python objects, within 512 MB; a page over it
# is asked again with half the limit (gpufleet.kubernetes.cluster)
CHUNK = 1024 * 1024  # the body is read this much at a time, the deadline looked at between reads
MERGE_PATCH = "application/merge-patch+json"  # RFC 7386: what a key is set to replaces it; null removes it


@dataclass(frozen=True)
class ApiServer:
    url: str  # https://ABC.gr7.us-east-1.eks.amazonaws.com, or http://127.0.0.1:PORT for a local API
    token: str = field(repr=False)
    ca_pem: str | None = field(default=None, repr=False)  # PEM text; None: the system's trust store


class HttpProblem(Exception):
    """Why a GET got no JSON document: `kind` is unreachable, timeout, tls, http or malformed; `status`
    and the API's Status `document` when the server answered with an error."""

    def __init__(self, kind: str, reason: str, status: int | None = None, document: Mapping[str, Any] | None = None):
        self.kind, self.reason, self.status, self.document = kind, reason, status, document or {}
        super().__init__(reason)

    @property
    def said(self) -> str:
        """The API server's own message in its Status document (first 160 characters; "" when none)."""
        return str(self.document.get("message") or "")[:160]


def ca_pem(data: str) -> str:
    """EKS's certificateAuthority.data (base64 of PEM) as PEM text; ValueError when it is not one."""
    try:
        text = base64.b64decode(data, validate=True).decode("ascii")
    except (binascii.Error, ValueError):
        raise ValueError("the certificate authority data is not base64") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError("the certificate authority data is not a PEM certificate")
    return text


class BudgetSpent(TimeoutError):
    """The listing's budget ran out before a read (raised before the socket is asked to wait at all)."""


class Pace:
    """The listing's deadline as each wait on the server gets it: `min(timeout_s, time left)`. `clipped`
    says the last wait was cut to the time left, so a timeout on it is the budget's, not the server's."""

    def __init__(self, timeout_s: float, budget_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s, self.budget_s, self.clock = timeout_s, budget_s, clock
        self.deadline = clock() + budget_s
        self.clipped = False

    def wait_s(self) -> float:
        left = self.deadline - self.clock()
        if left <= 0:
            raise BudgetSpent
        self.clipped = left < self.timeout_s
        return min(self.timeout_s, left)


class _PacedReader(io.RawIOBase):
    """The socket as http.client reads a response through it (status line, headers, body): each recv
    waits at most what the pace allows, so a server that drips a byte a second cannot hold the listing
    past its budget (a plain socket timeout is per recv: each drip would reset it).

    It reads through `raw`, the response's own socket file (`sock.makefile`), never the socket itself:
    that file holds the socket open. An answer the server closes after (`Connection: close`, HTTP/1.0)
    has its connection's socket closed by getresponse(), and a read on the bare socket then fails with
    EBADF; the file keeps it readable until the body is read and the response closes it."""

    def __init__(self, sock: Any, raw: Any, pace: Pace) -> None:
        self._sock, self._raw, self._pace = sock, raw, pace

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._pace.wait_s())
        return self._raw.readinto(buffer)  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self.closed:
            self._raw.close()  # lets the socket go: closed for good once the connection let it go too
        super().close()


class _PacedResponse(http.client.HTTPResponse):
    def __init__(self, sock: Any, *args: Any, pace: Pace, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self.fp = io.BufferedReader(_PacedReader(sock, self.fp.detach(), pace))  # nothing read yet: no buffer lost


class Connection:
    """One keep-alive connection for one listing. The listing as a whole has `budget_s`; every wait on
    the server (to connect, for each recv) gets `timeout_s` or the time left, whichever is less, and the
    body is read in CHUNK pieces with the deadline looked at between them, so a listing ends within its
    budget whatever the server does. The clock is injected (tests drive it)."""

    def __init__(
        self, server: ApiServer, timeout_s: float, budget_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        parts = urlsplit(server.url)
        self._server, self._prefix = server, parts.path.rstrip("/")
        self.pace = Pace(timeout_s, budget_s, clock)
        self.reads = 0  # body chunks read, all GETs together
        host, port = parts.hostname or "", parts.port
        if parts.scheme == "https":
            try:
                context = ssl.create_default_context(cadata=server.ca_pem) if server.ca_pem else None
            except ssl.SSLError as err:
                raise HttpProblem("tls", f"the certificate authority does not load ({err.reason})") from None
            self._conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=timeout_s, context=context or ssl.create_default_context()
            )
        else:
            self._conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        self._conn.response_class = partial(_PacedResponse, pace=self.pace)  # type: ignore[assignment]

    def close(self) -> None:
        self._conn.close()

    def get_json(self, path: str, query: Mapping[str, str | int] | None = None) -> dict[str, Any]:
        """GET one JSON document: a list page (`query`: limit, continue, ...) or one object (a node)."""
        return self._call("GET", path, query or {})

    def patch_json(self, path: str, patch: Mapping[str, Any], content_type: str = MERGE_PATCH) -> dict[str, Any]:
        """PATCH one object (a JSON merge patch by default: null removes a key); the object as it is after."""
        return self._call("PATCH", path, {}, json.dumps(patch).encode(), content_type)

    def post_json(self, path: str, document: Mapping[str, Any]) -> dict[str, Any]:
        """POST one document (a SelfSubjectAccessReview); the API's answer (HTTP 200 or 201)."""
        return self._call("POST", path, {}, json.dumps(document).encode(), "application/json")

    def _call(
        self, method: str, path: str, query: Mapping[str, str | int], body: bytes | None = None, content_type: str = ""
    ) -> dict[str, Any]:
        headers = {
            "Authorization": f"Bearer {self._server.token}",
            "Accept": "application/json",
            "Accept-Encoding": "gzip",
            "User-Agent": "gpufleet",
        }
        if body is not None:
            headers["Content-Type"] = content_type
        url = f"{self._prefix}{path}?{urlencode(query)}" if query else f"{self._prefix}{path}"
        response: http.client.HTTPResponse | None = None
        try:
            wait = self.pace.wait_s()
            self._conn.timeout = wait  # to connect (a kept-alive connection: to send)
            sock = getattr(self._conn, "sock", None)
            if sock is not None:
                sock.settimeout(wait)
            if body is None:
                self._conn.request(method, url, headers=headers)
            else:
                self._conn.request(method, url, body=body, headers=headers)
            response = self._conn.getresponse()
            body = self._body(response)
        except HttpProblem:
            self._conn.close()  # a body left half read: the next GET starts on a fresh connection
            if response is not None:
                response.close()  # a closing answer's socket is the response's alone: let it go now
            raise
        except BudgetSpent:
            raise HttpProblem("timeout", f"the listing took over its {self.pace.budget_s:g} s") from None
        except TimeoutError:
            if self.pace.clipped:
                raise HttpProblem("timeout", f"the listing took over its {self.pace.budget_s:g} s") from None
            raise HttpProblem("timeout", f"no answer within {self.pace.timeout_s:g} s") from None
        except ssl.SSLError as err:
            raise HttpProblem("tls", f"TLS failed ({err.reason or type(err).__name__})") from None
        except (OSError, http.client.HTTPException) as err:
            raise HttpProblem("unreachable", f"cannot reach the API server ({_os_reason(err)})") from None
        document = _json(body)
        if response.status not in (200, 201):
            raise HttpProblem("http", f"HTTP {response.status} {response.reason}", response.status, document)
        if document is None:
            raise HttpProblem("malformed", "the answer is not a JSON object")
        return document

    def _body(self, response: Any) -> bytes:
        """The answer's body, inflated as it arrives: CHUNK bytes a read (a short read is its end, as
        http.client reads), the deadline looked at before each, never more than MAX_BODY held."""
        gzipped = (response.getheader("Content-Encoding") or "").lower() == "gzip"
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
        parts: list[bytes] = []
        arrived = held = 0
        while True:
            self.pace.wait_s()
            raw = response.read(CHUNK)
            self.reads += 1
            arrived += len(raw)
            if arrived > MAX_BODY:
                raise HttpProblem("too_large", f"the answer is over {MAX_BODY // 2**20} MiB")
            part = raw
            if inflater is not None:
                try:
                    part = inflater.decompress(raw, MAX_BODY + 1 - held)
                except zlib.error:
                    raise HttpProblem("malformed", "the gzip answer does not inflate") from None
            held += len(part)
            if held > MAX_BODY or (inflater is not None and inflater.unconsumed_tail):
                raise HttpProblem("too_large", f"the answer inflates past {MAX_BODY // 2**20} MiB")
            parts.append(part)
            if len(raw) < CHUNK:
                return b"".join(parts)


def too_large(problem: HttpProblem) -> bool:
    """A page the client would not hold (over MAX_BODY) or the server would not send: 413, or a Status
    that says the answer is too large (etcd's and gRPC's limits surface as 500s that say so). Every
    listing asks such a page again with half the limit."""
    if problem.kind == "too_large" or problem.status == 413:
        return True
    said = str(problem.document.get("message") or "").lower()
    return problem.status is not None and ("too large" in said or "larger than max" in said)


def _json(body: bytes) -> dict[str, Any] | None:
    """The answer's JSON object, None when it is not one; an answer nested past what the recursive decoder
    can follow (RecursionError, never raised out of here) is malformed, whatever its status."""
    collecting = gc.isenabled()
    gc.disable()  # JSON makes no cycles; a page's ~10^5 new objects would run the collector over every pod held
    try:
        document = json.loads(body)
    except ValueError:
        return None
    except RecursionError:
        raise HttpProblem("malformed", "the answer nests too deeply to read") from None
    finally:
        if collecting:
            gc.enable()
    return document if isinstance(document, dict) else None


def _os_reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or type(err).__name__
