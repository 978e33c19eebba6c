"""A local Slack-compatible receiver on 127.0.0.1 (EMULATED: not Slack).

Accepts incoming-webhook posts (`POST /services/...`) and the Web API's `chat.postMessage`
(`POST /api/chat.postMessage`, bot-token mode: each message gets a `ts`, and a post with `thread_ts`
is a reply in that thread, as in Slack), records every message it received, and can misbehave on purpose:
answer 429 with Retry-After, 500, be down (connection refused-like 503s) for a while, or accept a
message and then stall past the client's timeout (an answer lost after the post landed).
"""

from __future__ import annotations

import contextlib
import html
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs

from rehearsal.loopback import serve

JSON = {"Content-Type": "application/json"}


@dataclass
class Received:
    path: str
    payload: dict[str, Any]
    answered: bool  # False: the post landed but the client never saw the answer
    ts: str = ""  # the message's id, as chat.postMessage answers it; a reply names its thread's in thread_ts


@dataclass
class SlackReceiver:
    """Misbehaviour is scripted per request: `script` is consumed first, then `default` applies.
    Script entries: "ok", "429:<seconds>", "500", "503", "stall:<seconds>" (record, then answer late),
    "400:<error>" (refuse the post as Slack does: HTTP 400 and the error for a webhook, ok=false for the API)."""

    script: deque[str] = field(default_factory=deque)
    down_until: float = 0.0  # monotonic; answer 503 without recording while down
    clock: Callable[[], float] = time.monotonic
    received: list[Received] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    refused: list[Received] = field(default_factory=list)
    on_message: Callable[[Received], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _ts: int = 0

    def next_behaviour(self) -> str:
        with self._lock:
            if self.clock() < self.down_until:
                return "down"
            return self.script.popleft() if self.script else "ok"

    def record(self, path: str, payload: dict[str, Any], answered: bool) -> str:
        with self._lock:
            self._ts += 1
            item = Received(path, payload, answered, ts=f"1700000000.{self._ts:06d}")
            self.received.append(item)
        if self.on_message:
            self.on_message(item)
        return item.ts

    def delivered(self) -> list[Received]:
        return list(self.received)


def _handler(receiver: SlackReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            behaviour = receiver.next_behaviour()
            receiver.answers.append(behaviour)
            if behaviour == "down":
                return self._reply(503, b"service unavailable")
            if behaviour.startswith("429"):
                return self._reply(429, b"rate_limited", {"Retry-After": behaviour.split(":")[1]})
            if behaviour in ("500", "503"):
                return self._reply(int(behaviour), b"internal_error")
            ctype = self.headers.get("Content-Type", "")
            if "json" in ctype:
                payload = json.loads(raw or b"{}")
            else:
                payload = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
                if "blocks" in payload:
                    payload["blocks"] = json.loads(payload["blocks"])
            api = self.path.startswith("/api/")
            if behaviour.startswith("400:"):
                error = behaviour.split(":", 1)[1]
                receiver.refused.append(Received(self.path, payload, answered=True))
                if api:
                    return self._reply(200, json.dumps({"ok": False, "error": error}).encode(), JSON)
                return self._reply(400, error.encode())
            if behaviour.startswith("stall"):
                receiver.record(self.path, payload, answered=False)
                time.sleep(float(behaviour.split(":")[1]))
                with contextlib.suppress(OSError):  # the client gave up already
                    self._reply(200, b"ok")
                return None
            ts = receiver.record(self.path, payload, answered=True)
            if api:
                body = json.dumps({"ok": True, "channel": payload.get("channel"), "ts": ts}).encode()
                return self._reply(200, body, JSON)
            return self._reply(200, b"ok")

    return Handler


@contextmanager
def slack_receiver(receiver: SlackReceiver | None = None) -> Iterator[tuple[SlackReceiver, str]]:
    """(receiver, base URL). Webhook URL: base + "/services/T000/B000/XXXX"; API: base + "/api/"."""
    receiver = receiver or SlackReceiver()
    with serve(_handler(receiver)) as url:
        yield receiver, url


def describe(payload: dict[str, Any]) -> list[str]:
    """A Block Kit message as plain lines, the way it reads in the channel (for the demo's console)."""
    lines: list[str] = []
    for block in payload.get("blocks", []):
        kind = block.get("type")
        if kind == "header":
            lines.append(block["text"]["text"])
        elif kind == "section" and "fields" in block:
            lines.append("  " + " | ".join(f["text"].replace("*", "").replace("\n", ": ", 1) for f in block["fields"]))
        elif kind == "section":
            lines.extend("  " + line.replace("*", "") for line in block["text"]["text"].splitlines())
        elif kind == "context":
            lines.append("  " + " ".join(e["text"] for e in block["elements"]).replace("`", ""))
        elif kind == "actions":
            lines.append("  links: " + ", ".join(e["text"]["text"] for e in block["elements"]))
    return [html.unescape(line) for line in lines] or [payload.get("text", "")]  # as Slack shows entities
