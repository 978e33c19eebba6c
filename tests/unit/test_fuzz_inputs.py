"""Fuzzing every parser: the samples in events/ and tests/fixtures/real_events as seeds, structurally
mutated by hypothesis (keys dropped, values replaced by any JSON value, extreme or naive datetimes, lone
surrogates, 5,000-digit numbers, deep nesting, records duplicated or wrapped). Every input must either
become valid typed events or be rejected with the documented error, never another exception; accepted
notifications must render to payloads Slack and SNS accept. The counts tried are written to
.pytest-fuzz.json for the README's reliability section."""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import InvalidEvent
from gpufleet.events import parse_event
from gpufleet.events.common import EARLIEST, LATEST
from gpufleet.events.queue import Flush, InvalidMessage, parse_message
from gpufleet.notify.incidents import merge_notification, plan_delivery
from gpufleet.notify.model import (
    MAX_FACT_NAME,
    MAX_FACT_VALUE,
    MAX_FACTS,
    MAX_LINK_TITLE,
    MAX_LINKS,
    MAX_REASON,
    MAX_TITLE,
    MAX_URL,
    IncidentState,
    Link,
    Notification,
    NotificationKind,
    Severity,
)
from gpufleet.notify.policy import FlapDamping, Grouping
from gpufleet.notify.render import SNS_MESSAGE_MAX_BYTES, SNS_SUBJECT_MAX, render_slack, render_sns
from gpufleet.notify.slack import payload_problems

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [
    json.loads(p.read_text())
    for folder in (ROOT / "events", ROOT / "tests" / "fixtures" / "real_events")
    for p in sorted(folder.rglob("*.json"))
]
NOTIFICATION_SEEDS = [
    json.loads(r["body"])
    for s in SEEDS
    if isinstance(s, dict)
    for r in s.get("Records", [])
    if str(r.get("body", "")).startswith('{"notification_id"')
]
TALLY: Counter[str] = Counter()
SCALE = float(os.environ.get("GPUFLEET_FUZZ_SCALE", "1"))  # `make unit` runs a twentieth, `make test` all


def examples(n: int) -> int:
    return max(20, int(n * SCALE))


COUNTS = ROOT / ".pytest-fuzz.json"

WEIRD = st.sampled_from(
    [
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59.999999Z",
        "2026-11-23T08:00:00",  # naive
        "1969-12-31T23:59:59Z",
        "\ud800",
        "",
        "EXAMPLE",
        "<!channel> *bold* `code` &amp;",
        "x" * 5000,
        "9" * 5000,
        "Records",
        "alarmData",
    ]
)
SCALARS = st.none() | st.booleans() | st.integers(-(10**40), 10**40) | st.floats() | st.text(max_size=40) | WEIRD
VALUES = st.recursive(
    SCALARS,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=12) | WEIRD, c, max_size=3),
    max_leaves=10,
)


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if len(prefix) > 12:  # never walk into a buried (deeply nested) value
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


DEEP = "__deep__"


def _expand(doc: Any) -> Any:
    if doc == DEEP:
        return _deep(3000)
    if isinstance(doc, dict):
        return {k: _expand(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_expand(v) for v in doc]
    return doc


def _deep(depth: int) -> Any:
    node: Any = "bottom"
    for _ in range(depth):
        node = {"a": node}
    return node


def _mutate(doc: Any, path: tuple[Any, ...], op: str, value: Any) -> Any:
    """One structural change at `path`: delete, replace, duplicate, wrap or bury under deep nesting."""
    if not path:
        return [doc] if op == "wrap" else value
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "delete":
        del parent[last]
    elif op == "wrap":
        parent[last] = [parent[last]]
    elif op == "duplicate" and isinstance(parent, list):
        parent.append(json.loads(json.dumps(parent[last])))
    elif op == "deep":
        parent[last] = DEEP  # expanded in the test: a 3,000-level value would choke hypothesis's printer
    else:
        parent[last] = value
    return doc


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Any]) -> Any:
    doc = json.loads(json.dumps(draw(st.sampled_from(seeds))))
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(["replace", "replace", "delete", "wrap", "duplicate", "deep"]))
        with contextlib.suppress(KeyError, IndexError, TypeError):  # the path is gone after an earlier change
            doc = _mutate(doc, path, op, draw(VALUES))
    return doc


def _check_value(value: Any) -> None:
    """Accepted means usable: datetimes carry a time zone and sane years, text can be stored."""
    if isinstance(value, datetime):
        assert value.tzinfo is not None and EARLIEST <= value < LATEST, value
    elif isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, tuple | list):
        for v in value:
            _check_value(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_value(k)
            _check_value(v)
    elif hasattr(type(value), "model_fields"):
        for name in type(value).model_fields:
            _check_value(getattr(value, name))


@settings(max_examples=examples(4000), deadline=None, suppress_health_check=list(HealthCheck))
@given(mutated(SEEDS))
def test_every_mutated_event_is_parsed_or_rejected_with_the_documented_error(doc: Any) -> None:
    TALLY["events"] += 1
    try:
        events = parse_event(_expand(doc))
    except InvalidEvent as exc:
        TALLY["events rejected"] += 1
        assert "\n" not in str(exc) and len(str(exc)) < 1000  # noqa: PT017 (one line, never the body)
        return
    for e in events:
        _check_value(e)


def _encoded(doc: Any) -> str:
    """The body as JSON text, the deep sentinel spliced in as text (json.dumps itself would recurse)."""
    return json.dumps(doc).replace(json.dumps(DEEP), '{"a": ' * 3000 + '"bottom"' + "}" * 3000)


BODIES = (
    st.builds(_encoded, mutated(NOTIFICATION_SEEDS))
    | st.text(max_size=200)
    | st.sampled_from(["[" * 5000 + "]" * 5000, '{"a": ' + "9" * 5000 + "}", '{"flush": ""}', "", "\ud800"])
)


@settings(max_examples=examples(3000), deadline=None, suppress_health_check=list(HealthCheck))
@given(BODIES)
def test_every_queue_body_is_a_notification_or_rejected_and_renders_within_limits(body: str) -> None:
    TALLY["queue bodies"] += 1
    try:
        message = parse_message(body)
    except InvalidMessage as exc:
        TALLY["queue bodies rejected"] += 1
        assert len(str(exc)) < 1000  # noqa: PT017
        return
    if isinstance(message, Flush):
        return
    _check_value(message)
    incident = merge_notification(None, message, message.at, FlapDamping())
    assert incident is not None
    plan = plan_delivery(incident, message.at.replace(year=min(message.at.year + 1, 2099)), Grouping(), FlapDamping())
    if plan.delivery is None:
        return
    TALLY["payloads rendered"] += 1
    assert payload_problems(render_slack(plan.delivery)) == []
    subject, text, attributes = render_sns(plan.delivery)
    assert len(subject) <= SNS_SUBJECT_MAX and subject.isascii()
    assert len(text.encode("utf-8")) <= SNS_MESSAGE_MAX_BYTES and all(a["StringValue"] for a in attributes.values())


def _mrkdwn_texts(node: Any) -> list[str]:
    """Every mrkdwn object's text (Slack parses those for mentions and links; plain_text is shown as written)."""
    if isinstance(node, list):
        return [t for v in node for t in _mrkdwn_texts(v)]
    if not isinstance(node, dict):
        return []
    own = [node["text"]] if node.get("type") == "mrkdwn" else []
    return own + [t for v in node.values() for t in _mrkdwn_texts(v)]


NASTY_TEXT = st.text(max_size=40) | st.sampled_from(
    ["<!channel>", "<!here|here>", "*_~`>&<", "<https://evil.example|click>", "\u202e\u0000\n\r", "é" * 400]
)


def _text(limit: int, min_size: int = 0) -> st.SearchStrategy[str]:
    """Text up to a field's own limit: short and nasty, or long and multi-byte (byte limits bite first)."""
    at_limit = st.sampled_from(["x", "é", "\U0001f525", "<", "&"]).map(lambda c: c * limit)  # cheap to draw
    return (NASTY_TEXT | at_limit).filter(lambda t: min_size <= len(t) <= limit)


NOTIFICATIONS = st.builds(
    Notification,
    notification_id=st.text(min_size=1, max_size=40),
    kind=st.sampled_from(list(NotificationKind)),
    severity=st.sampled_from(list(Severity)),
    group=st.text(min_size=1, max_size=300),
    incident_key=st.text(min_size=1, max_size=400),
    title=_text(MAX_TITLE, 1),
    facts=st.dictionaries(_text(MAX_FACT_NAME), _text(MAX_FACT_VALUE), max_size=MAX_FACTS),
    reason=_text(MAX_REASON),
    links=st.lists(st.builds(Link, title=_text(MAX_LINK_TITLE, 1), url=_text(MAX_URL, 1)), max_size=MAX_LINKS).map(
        tuple
    ),
    state=st.sampled_from(list(IncidentState)),
    at=st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2090, 1, 1), timezones=st.just(UTC)),
)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(NOTIFICATIONS, min_size=1, max_size=4))
def test_every_valid_notification_renders_within_slack_and_sns_limits(notes: list[Notification]) -> None:
    """Every field at its own limit, multi-byte, with mrkdwn and mentions: the payload stays valid and
    a mention or link written in a field never becomes a live one."""
    incident = None
    for n in notes:  # one incident; a repeated notification id changes nothing (None)
        same = n.model_copy(update={"incident_key": notes[0].incident_key})
        incident = merge_notification(incident, same, n.at, FlapDamping()) or incident
    assert incident is not None
    plan = plan_delivery(incident, max(n.at for n in notes) + timedelta(days=1), Grouping(), FlapDamping())
    if plan.delivery is None:
        return
    TALLY["extreme notifications rendered"] += 1
    payload = render_slack(plan.delivery)
    assert payload_problems(payload) == []
    parsed = [payload["text"], *_mrkdwn_texts(payload["blocks"])]  # the fallback text is mrkdwn too
    assert not [t for t in parsed if "<!" in t or "<http" in t]
    subject, text, attributes = render_sns(plan.delivery)
    assert len(subject) <= SNS_SUBJECT_MAX and subject.isascii()
    assert len(text.encode("utf-8")) <= SNS_MESSAGE_MAX_BYTES and all(a["StringValue"] for a in attributes.values())


def test_zz_record_the_counts() -> None:
    """Runs after the two properties above (file order): the figures for the README."""
    if SCALE == 1:  # the README quotes the full run's counts
        COUNTS.write_text(json.dumps(dict(TALLY), indent=1))
    assert TALLY["events"] > 0
