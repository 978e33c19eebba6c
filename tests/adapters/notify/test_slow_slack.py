"""Issue 29: Slack takes each post but answers after the client's timeout. The real notifier (its plan,
two-phase delivery and sweep) and the real slack-sdk poster against the emulated Slack on 127.0.0.1
(rehearsal.slack, "stall": record the post, answer late); the incident store is an in-memory fake with
the same conditional writes. The timeout is 0.2 s and the sweeps' clock is injected: nothing here
measures elapsed time. Before: every sweep re-posted the unconfirmed delivery (a NEW post a minute)."""

from __future__ import annotations

import json
import socket
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler

import pytest
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain.incidents import Incident, Silence
from gpufleet.domain.notification import Notification, Severity
from gpufleet.notify.render import MAYBE_DUPLICATE
from gpufleet.notify.service import DeliveryFailed, Notifier
from gpufleet.notify.slack import SlackConfig, SlackFailed, SlackPoster, SlackUnconfirmed
from gpufleet.policy.fleet import parse_policy
from rehearsal.loopback import serve
from rehearsal.slack import SlackReceiver, slack_receiver

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
REPEAT_S = 3600
POLICY = parse_policy(
    f"notifications: {{grouping: {{group_wait_s: 0, group_interval_s: 0, repeat_interval_s: {REPEAT_S}}}}}"
)
LATE = "stall:0.6"  # the post lands; the answer comes after the client's 0.2 s (slower on a busy machine)


@dataclass
class MemoryStore:
    """IncidentStore's contract: a put succeeds only on the version it read (None: must not exist)."""

    items: dict[str, Incident] = field(default_factory=dict)

    def get(self, key: str) -> Incident | None:
        return self.items.get(key)

    def put(self, incident: Incident, expected_version: int | None, now: datetime) -> Incident | None:
        current = self.items.get(incident.key)
        if (current.version if current else None) != expected_version:
            return None
        stored = incident.model_copy(update={"version": 0 if expected_version is None else expected_version + 1})
        self.items[incident.key] = stored
        return stored

    def all(self) -> list[Incident]:
        return list(self.items.values())

    def silences(self, now: datetime) -> list[Silence]:
        return []


@dataclass
class Queue:
    flushes: list[tuple[str, int]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def schedule_flush(self, key: str, delay_s: int) -> None:
        self.flushes.append((key, delay_s))

    def reject(self, body: str, reason: str) -> None:
        self.rejected.append(reason)


@contextmanager
def notifier(
    script: list[str], timeout_s: float = 2.0, base: str | None = None
) -> Iterator[tuple[Notifier, SlackReceiver, MemoryStore]]:
    """A webhook notifier whose Slack answers as `script` says, then normally ("ok"); or one posting to
    `base`. slack-sdk's pauses between its own retries are not slept."""
    receiver = SlackReceiver(script=deque(script))
    with nullcontext((receiver, base)) if base else slack_receiver(receiver) as (rx, url):
        secret = f"{url}/services/T0/B0/X"
        poster = SlackPoster(SlackConfig.from_secret(secret), timeout_s=timeout_s, sleep=lambda s: None)
        store = MemoryStore()
        n = Notifier(
            store=store,  # type: ignore[arg-type]
            queue=Queue(),  # type: ignore[arg-type]
            sns=None,
            slack=lambda: poster,
            load_policy=lambda: POLICY,
            logger=Logger(service="test-notifier"),
            emf=Metrics(namespace="test", service="notifier"),
        )
        yield n, rx, store


def warning(n: int) -> str:
    return Notification(
        notification_id=f"id-{n}",
        kind="scaling",
        severity=Severity.WARNING,
        group="asg:train",
        incident_key=f"asg:train|capacity#{n}",
        title=f"asg:train: cannot scale ({n})",
        at=T0,
    ).model_dump_json()


def run(n: Notifier, start_s: int, end_s: int) -> list[dict[str, int]]:
    """Sweeps every 30 s (twice the schedule's rate, as a redelivery would add) on the injected clock."""
    return [n.sweep(T0 + timedelta(seconds=t)) for t in range(start_s, end_s + 1, 30)]


def texts(rx: SlackReceiver) -> list[str]:
    return [str(r.payload.get("text", "")) for r in rx.received]


def test_a_slack_that_answers_late_gets_each_post_twice_at_most_in_three_minutes() -> None:
    """Two incidents; every post lands but is answered late. In 3 minutes of sweeps: the first post and
    one repeat each, the repeat marked; the store says so; after the repeat interval, one more each."""
    with notifier([LATE] * 10, timeout_s=0.2) as (n, rx, store):
        for i in (1, 2):
            with pytest.raises(DeliveryFailed, match="did not answer in time"):
                n.handle_message(warning(i), T0)
        run(n, 30, 180)
        in_three_minutes = texts(rx)
        held = [inc.in_flight for inc in store.all()]
        run(n, 210 + REPEAT_S, 240 + REPEAT_S)
    assert len(in_three_minutes) == 4 and all(not r.answered for r in rx.received)
    for i in (1, 2):
        mine = [t for t in in_three_minutes if f"({i})" in t]
        assert len(mine) == 2 and MAYBE_DUPLICATE not in mine[0] and MAYBE_DUPLICATE in mine[1]
    assert all(d is not None and d.unanswered == 2 and d.unanswered_at is not None for d in held)
    after = texts(rx)[4:]
    assert len(after) == 2 and all(MAYBE_DUPLICATE in t for t in after)


def test_a_slack_that_errors_is_still_retried_at_every_sweep_and_one_that_answers_is_unaffected() -> None:
    """503s (slack-sdk retries each post twice more; the server could not take it) send nothing: every sweep
    tries again, unmarked. Then Slack answers: the next incident is posted once, and the sweeps after have
    nothing to do."""
    with notifier(["503"] * 9) as (n, rx, store):
        with pytest.raises(DeliveryFailed, match="HTTP 503"):
            n.handle_message(warning(1), T0)
        retried = run(n, 30, 90)
        assert n.handle_message(warning(2), T0 + timedelta(seconds=100)) == "posted-new"
        quiet = run(n, 120, 240)
    assert retried == [{"failed": 1}, {"failed": 1}, {"posted-new": 1}] and all(o == {} for o in quiet)
    assert rx.answers == ["503"] * 9 + ["ok", "ok"] and len(rx.received) == 2
    assert not any(MAYBE_DUPLICATE in t for t in texts(rx))
    assert all(inc.in_flight is None and inc.sent_count == 1 for inc in store.all())


def test_a_slack_that_refuses_connections_is_still_retried_at_every_sweep() -> None:
    with socket.socket() as s:  # a port nothing listens on: connections are refused
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    with notifier([], base=closed) as (n, _, store):
        with pytest.raises(DeliveryFailed, match="unreachable"):
            n.handle_message(warning(1), T0)
        outcomes = run(n, 30, 180)
    assert outcomes == [{"failed": 1}] * 6
    [incident] = store.all()
    assert incident.in_flight is not None and incident.in_flight.unanswered == 0
    assert incident.in_flight.attempts == 7


@contextmanager
def landing_slack(status: int, body: bytes = b"") -> Iterator[tuple[list[bytes], str]]:
    """(posts, base URL): a Slack edge that takes every post (it lands) and answers `status` with `body`,
    as a gateway does when the backend that posted it was slow (504) or failed after posting."""
    posts: list[bytes] = []

    class Edge(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            posts.append(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    with serve(Edge) as base:
        yield posts, base


@pytest.mark.parametrize("status", [500, 502, 504])
def test_a_post_answered_with_an_error_after_it_landed_is_repeated_once_then_held(status: int) -> None:
    """Issue 29 (probe): each post lands and the edge answers 500, 502 or 504. Before: slack-sdk retried
    a 500 twice within the post and every sweep posted again, unmarked (21 posts in 10 minutes). Now: the
    post and one marked repeat in 10 minutes of sweeps, then held to the repeat interval."""
    with landing_slack(status) as (posts, base), notifier([], base=base) as (n, _, store):
        with pytest.raises(DeliveryFailed, match=f"HTTP {status}"):
            n.handle_message(warning(1), T0)
        run(n, 30, 600)
        in_ten_minutes = [json.loads(p)["text"] for p in posts]
        run(n, 630 + REPEAT_S, 660 + REPEAT_S)
        [incident] = store.all()
    assert len(in_ten_minutes) == 2
    assert MAYBE_DUPLICATE not in in_ten_minutes[0] and MAYBE_DUPLICATE in in_ten_minutes[1]
    assert len(posts) == 3 and MAYBE_DUPLICATE in json.loads(posts[2])["text"]  # one more after the interval
    assert incident.in_flight is not None and incident.in_flight.unanswered == 3


@pytest.mark.parametrize(
    ("mode", "status", "body", "unconfirmed", "attempts"),
    [
        ("webhook", 500, b"rollup_error", True, 1),
        ("webhook", 502, b"", True, 1),
        ("webhook", 504, b"", True, 1),
        ("webhook", 503, b"", False, 3),  # the server could not take it: retried within the post
        ("bot", 500, b"", True, 1),
        ("bot", 504, b"", True, 1),
        ("bot", 200, b'{"ok": false, "error": "internal_error"}', True, 1),
        ("bot", 200, b'{"ok": false, "error": "fatal_error"}', True, 1),
        ("bot", 503, b"", False, 3),
    ],
)
def test_which_answers_may_have_posted(mode: str, status: int, body: bytes, unconfirmed: bool, attempts: int) -> None:
    """Answers that do not prove the post was refused raise SlackUnconfirmed and are not retried within
    the post (a retry would post again, unmarked); a 503 is retried, as before."""
    with landing_slack(status, body) as (posts, base):
        secret = f"{base}/services/T0/B0/X" if mode == "webhook" else '{"bot_token": "xoxb-t", "channel": "#c"}'
        poster = SlackPoster(SlackConfig.from_secret(secret), api_url=f"{base}/api/", sleep=lambda s: None)
        with pytest.raises(SlackFailed) as caught:
            poster.post({"text": "t", "blocks": []})
    assert isinstance(caught.value, SlackUnconfirmed) is unconfirmed
    assert len(posts) == attempts
