"""The least a Kubernetes API client needs to list pods: GET a JSON document from the API server with a
bearer token, trusting the cluster's own certificate authority, within a deadline. Standard library only.

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
import http.client
import json
import ssl
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

MAX_BODY = 64 * 1024 * 1024  # one page of 500 pods is a few MB; more than this is not a PodList page


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


def ca_pem(data: str) -> str:
    """EKS's certificateAuthority.data (base64 of PEM) as PEM text; ValueError when it is not one."""
    try:
        text = base64.b64decode(data, validate=True).decode("ascii")
    except (binascii.Error, ValueError):
        raise ValueError("the certificate authority data is not base64") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ValueError("the certificate authority data is not a PEM certificate")
    return text


class Connection:
    """One keep-alive connection for one listing. Each GET has `timeout_s` to connect and for each wait on
    the server; the listing as a whole has `budget_s` (a slow-dripping server cannot hold the scaler)."""

    def __init__(
        self, server: ApiServer, timeout_s: float, budget_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        parts = urlsplit(server.url)
        self._server, self._prefix, self._clock = server, parts.path.rstrip("/"), clock
        self._deadline = clock() + budget_s
        self._budget_s = budget_s
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

    def close(self) -> None:
        self._conn.close()

    def get_json(self, path: str, query: Mapping[str, str | int]) -> dict[str, Any]:
        if self._clock() > self._deadline:
            raise HttpProblem("timeout", f"the listing took over its {self._budget_s:g} s")
        headers = {
            "Authorization": f"Bearer {self._server.token}",
            "Accept": "application/json",
            "Accept-Encoding": "gzip",
            "User-Agent": "gpufleet",
        }
        try:
            self._conn.request("GET", f"{self._prefix}{path}?{urlencode(query)}", headers=headers)
            response = self._conn.getresponse()
            body = _decoded(response.read(MAX_BODY + 1), response.getheader("Content-Encoding"))
        except TimeoutError:
            raise HttpProblem("timeout", f"no answer within {self._conn.timeout:g} s") from None
        except ssl.SSLError as err:
            raise HttpProblem("tls", f"TLS failed ({err.reason or type(err).__name__})") from None
        except (OSError, http.client.HTTPException) as err:
            raise HttpProblem("unreachable", f"cannot reach the API server ({_os_reason(err)})") from None
        document = _json(body)
        if response.status != 200:
            raise HttpProblem("http", f"HTTP {response.status} {response.reason}", response.status, document)
        if document is None:
            raise HttpProblem("malformed", "the answer is not a JSON object")
        return document


def _decoded(body: bytes, encoding: str | None) -> bytes:
    if len(body) > MAX_BODY:
        raise HttpProblem("malformed", f"the answer is over {MAX_BODY // 2**20} MiB")
    if (encoding or "").lower() != "gzip":
        return body
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, MAX_BODY + 1)
    except zlib.error:
        raise HttpProblem("malformed", "the gzip answer does not inflate") from None
    if len(out) > MAX_BODY:
        raise HttpProblem("malformed", f"the answer inflates past {MAX_BODY // 2**20} MiB")
    return out


def _json(body: bytes) -> dict[str, Any] | None:
    """The answer's JSON object, None when it is not one; an answer nested past what the recursive decoder
    can follow (RecursionError, never raised out of here) is malformed, whatever its status."""
    try:
        document = json.loads(body)
    except ValueError:
        return None
    except RecursionError:
        raise HttpProblem("malformed", "the answer nests too deeply to read") from None
    return document if isinstance(document, dict) else None


def _os_reason(err: Exception) -> str:
    return getattr(err, "strerror", None) or type(err).__name__
