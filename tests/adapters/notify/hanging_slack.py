"""A hanging Slack on 127.0.0.1 (EMULATED: not Slack): it answers its first `answers` posts, then takes
each connection and its post and never answers, as a stuck webhook or Web API looks from the client.
Threads left waiting are let go when the block ends."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs

from rehearsal.loopback import serve


@dataclass
class Post:
    path: str
    text: str
    answered: bool


@dataclass
class HangingSlack:
    answers: int = 0  # posts answered before it hangs; raise it to let a later delivery through
    posts: list[Post] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, path: str, payload: dict[str, Any]) -> bool:
        """Records the post; whether it is answered."""
        with self._lock:
            answered = sum(p.answered for p in self.posts) < self.answers
            self.posts.append(Post(path, str(payload.get("text", "")), answered))
            return answered

    def answered(self) -> list[str]:
        return [p.text for p in self.posts if p.answered]

    def hung(self) -> list[str]:
        return [p.text for p in self.posts if not p.answered]


def _handler(slack: HangingSlack) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if "json" in self.headers.get("Content-Type", ""):
                payload = json.loads(raw or b"{}")
            else:
                payload = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            if not slack.take(self.path, payload):
                slack.release.wait()  # never answers while the test runs
                return
            api = self.path.startswith("/api/")
            body = json.dumps({"ok": True, "ts": f"1700000000.{len(slack.posts):06d}"}).encode() if api else b"ok"
            with contextlib.suppress(OSError):
                self.send_response(200)
                self.send_header("Content-Type", "application/json" if api else "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

    return Handler


@contextmanager
def hanging_slack(answers: int = 0) -> Iterator[tuple[HangingSlack, str]]:
    """(the server, its base URL): webhooks under base + "/services/...", the Web API under base + "/api/"."""
    slack = HangingSlack(answers)
    with serve(_handler(slack)) as base:
        try:
            yield slack, base
        finally:
            slack.release.set()
