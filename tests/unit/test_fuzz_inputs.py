"""Fuzzing every parser of outside input, seeded with real samples and mutated by the operators in
tests/unit/test_fuzz_mutators.py (lone surrogates and 4-byte text in every string field, 300+ character
4-byte strings, keys dropped or renamed, wrong types, huge or NaN-ish numbers, deep nesting, extreme or
naive timestamps, duplicated records, JSON inside strings mutated):

- Lambda events (`parse_event`, every shape), seeded with events/, tests/fixtures/real_events and the
  documented shapes those lack; accepted launch failures are also classified (`describe_failure`);
- notification queue bodies (`parse_message`), and accepted notifications rendered for Slack and SNS;
- fleet policies (`parse_policy`), seeded with every policy in docs/, the template and the rehearsal,
  mutated as YAML documents and as YAML text;
- Kubernetes PodList pages as the scaler reads them (`PodReader.read`: pods and nodes, continue tokens);
- usage records (`RecordParser.parse`), replay traces (`parse_trace`) and the node publisher's config.

Every input must become valid typed objects or be rejected with the parser's documented error; any other
exception is a crash and fails the test, naming each distinct crash with a shrunk reproducer. Accepted
means usable: datetimes carry a time zone and sane years, numbers are finite, text can be stored.
hypothesis drives each parser (structure-aware, shrinking); a seeded loop drives the same operators for
volume. The counts are written to .pytest-fuzz.json for the README's reliability section.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from gpufleet.capacity.classify import FailureSource, describe_failure
from gpufleet.domain.errors import ClusterUnreadable, InvalidEvent, PolicyError
from gpufleet.domain.notification import (
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
from gpufleet.events import EventKind, parse_event
from gpufleet.events.common import EARLIEST, LATEST
from gpufleet.events.model import LaunchUnsuccessful
from gpufleet.events.queue import Flush, InvalidMessage, parse_message
from gpufleet.kubernetes import cluster as kube
from gpufleet.kubernetes.client import ApiServer, Connection
from gpufleet.notify.incidents import merge_notification, plan_delivery
from gpufleet.notify.render import SNS_MESSAGE_MAX_BYTES, SNS_SUBJECT_MAX, render_slack, render_sns
from gpufleet.notify.slack import payload_problems
from gpufleet.policy.fleet import parse_policy
from gpufleet.policy.notify import FlapDamping, Grouping
from gpufleet.settings import KubeEndpoint
from gpufleet_node import config as publisher_config
from gpufleet_tools.replay.traces import TraceError, parse_trace
from gpufleet_tools.report.identity import identify
from gpufleet_tools.report.records import RecordParser, Skipped
from rehearsal.scenario import POLICY as REHEARSAL_POLICY
from tests.unit.replay.conftest import DLRM_CSV, V2023_CSV
from tests.unit.test_fuzz_mutators import (
    Chooser,
    Crashes,
    DrawChooser,
    bulk,
    encoded,
    expand,
    hostile_text,
    is_long_four_byte,
    mutate,
    sweep,
)
from tests.unit.test_report_records import usage_doc

ROOT = Path(__file__).resolve().parents[2]
TALLY: Counter[str] = Counter()
OPERATORS: Counter[str] = Counter()  # which mutation operators the runs applied
SCALE = float(os.environ.get("GPUFLEET_FUZZ_SCALE", "1"))  # `make unit` runs a twentieth, `make test` all
SEED = os.environ.get("GPUFLEET_FUZZ_SEED", "issue-22")  # the bulk loops' seed: the same inputs every run
COUNTS = ROOT / ".pytest-fuzz.json"


def examples(n: int) -> int:
    return max(20, int(n * SCALE))


def fuzz(n: int) -> settings:
    """hypothesis settings for a property run over about `n` examples at full scale."""
    return settings(max_examples=examples(n), deadline=None, suppress_health_check=list(HealthCheck))


def record(parser: str, outcomes: Counter[str], crashes: Crashes, check: Callable[[Any], str]) -> None:
    """Count a run under `parser` (its inputs, and each outcome but "accepted"), then fail on any crash."""
    TALLY[parser] += sum(outcomes.values()) + crashes.count
    for outcome, n in outcomes.items():
        if outcome == "rendered":
            TALLY["payloads rendered"] += n
        elif outcome != "accepted":
            TALLY[f"{parser} {outcome}"] += n
    TALLY["crashes"] += crashes.count
    if crashes.found:
        pytest.fail(crashes.report(check), pytrace=False)


# ---- what accepted means ----


class Unusable(AssertionError):
    """An input was accepted, but a value in what it became is not usable (`where` names the field)."""

    def __init__(self, where: str, why: str) -> None:
        self.where = where
        super().__init__(f"{where}: {why}")


def usable(value: Any, where: str) -> None:
    """Datetimes carry a time zone and sane years, numbers are finite, text can be stored (UTF-8)."""
    if isinstance(value, datetime):
        if value.tzinfo is None or not EARLIEST <= value < LATEST:
            raise Unusable(where, "a naive or out-of-range datetime")
    elif isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise Unusable(where, "text with a lone surrogate") from None
    elif isinstance(value, float) and not math.isfinite(value):
        raise Unusable(where, "a non-finite number")
    elif isinstance(value, tuple | list | set | frozenset):
        for v in value:
            usable(v, f"{where}[]")
    elif isinstance(value, dict):
        for k, v in value.items():
            usable(k, f"{where}{{key}}")
            usable(v, f"{where}{{}}")
    elif hasattr(type(value), "model_fields"):
        for name in type(value).model_fields:
            usable(getattr(value, name), f"{type(value).__name__}.{name}")
    elif hasattr(value, "__slots__") and not isinstance(value, date):  # the report's dataclasses
        for name in value.__slots__:
            usable(getattr(value, name), f"{type(value).__name__}.{name}")


# ---- Lambda events: every shape parse_event reads ----


def _seed_files() -> list[Path]:
    return [p for folder in ("events", "tests/fixtures/real_events") for p in sorted((ROOT / folder).rglob("*.json"))]


# Documented shapes (AWS's pages) the sample folders may lack: the EventBridge Scheduler's default payload
# for a schedule with no input, and a Capacity Block delivered.
DOCUMENTED_SEEDS: list[dict[str, Any]] = [
    {
        "version": "0",
        "id": "8c7fa5ba-8d5e-4d1c-9b3a-4c7b1f0a2e11",
        "detail-type": "Scheduled Event",
        "source": "aws.scheduler",
        "account": "123456789012",
        "time": "2026-11-23T08:30:00Z",
        "region": "us-east-1",
        "resources": ["arn:aws:scheduler:us-east-1:123456789012:schedule/default/gpufleet-reconcile"],
        "detail": "{}",
    },
    {
        "version": "0",
        "id": "0a1b2c3d-0001-4e5f-8a9b-0c1d2e3f4a5b",
        "detail-type": "Capacity Block Reservation Delivered",
        "source": "aws.ec2",
        "account": "123456789012",
        "time": "2026-11-23T11:00:00Z",
        "region": "us-east-1",
        "resources": ["arn:aws:ec2:us-east-1:123456789012:capacity-reservation/cr-0123456789abcdef0"],
        "detail": {"capacity-reservation-id": "cr-0123456789abcdef0", "end-date": "2026-11-30T11:30:00Z"},
    },
]
SEEDS: list[Any] = [json.loads(p.read_text()) for p in _seed_files()] + DOCUMENTED_SEEDS
NOTIFICATION_SEEDS = [
    json.loads(r["body"])
    for s in SEEDS
    if isinstance(s, dict)
    for r in s.get("Records", [])
    if str(r.get("body", "")).startswith('{"notification_id"')
]
# The fields the brief names for long 4-byte text: alarm names, group names, execution ids, launch Details.
NAMED_FIELDS = ("alarmName", "AlarmName", "AutoScalingGroupName", "execution_id", "Availability Zone", "Subnet ID")


def check_event(doc: Any) -> str:
    """parse_event's contract: typed events, or InvalidEvent in one short line. Launch failures accepted
    are classified too (spot_watch's next step: their text is outside input)."""
    try:
        events = parse_event(expand(doc))
    except InvalidEvent as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 1000, "a rejection must be one short line"  # noqa: PT017 (a rejection's own contract)
        return "rejected"
    for e in events:
        usable(e, type(e).__name__)
        if isinstance(e, LaunchUnsuccessful):
            failure = describe_failure(
                e.activity_id, e.asg_name, e.asg_name, e.at, e.message, e.availability_zone, FailureSource.EVENT
            )
            usable(failure, "LaunchFailure")
    return "accepted"


def mutated_event(c: Chooser) -> Any:
    return mutate(c.pick(SEEDS), c, c.number(1, 3), OPERATORS)


@st.composite
def drawn_event(draw: st.DrawFn) -> Any:
    return mutated_event(DrawChooser(draw))


def test_every_documented_shape_is_a_seed_that_parses_unmutated() -> None:
    """Mutations start from valid inputs of every shape, so the accepting paths are fuzzed too."""
    kinds = Counter(e.kind for s in SEEDS if _parses(s) for e in parse_event(s))
    assert set(kinds) == set(EventKind), set(EventKind) - set(kinds)
    assert [s["source"] for s in DOCUMENTED_SEEDS if not _parses(s)] == []  # each documented payload parses


def _parses(doc: Any) -> bool:
    try:
        parse_event(doc)
    except InvalidEvent:
        return False
    return True


@fuzz(4000)
@given(drawn_event())
def test_every_mutated_event_is_parsed_or_rejected_with_the_documented_error(doc: Any) -> None:
    TALLY["events"] += 1
    if check_event(doc) == "rejected":
        TALLY["events rejected"] += 1


def test_bulk_mutated_events_never_crash_a_parser() -> None:
    outcomes, crashes = bulk(check_event, mutated_event, examples(40_000), f"{SEED}:events")
    record("events", outcomes, crashes, check_event)
    assert outcomes["accepted"] > 0 and outcomes["rejected"] > 0  # both paths reached


# ---- notification queue bodies ----


def check_body(body: Any) -> str:
    """parse_message's contract: a Notification or a Flush, or InvalidMessage; a notification accepted
    renders to a payload slack-sdk's models and Slack's limits accept, and an SNS message within limits."""
    try:
        message = parse_message(body)
    except InvalidMessage as exc:
        assert len(str(exc)) < 1000, "a rejection must be short"  # noqa: PT017 (a rejection's own contract)
        return "rejected"
    if isinstance(message, Flush):
        return "flush"
    usable(message, "Notification")
    incident = merge_notification(None, message, message.at, FlapDamping())
    assert incident is not None
    plan = plan_delivery(incident, message.at.replace(year=min(message.at.year + 1, 2099)), Grouping(), FlapDamping())
    if plan.delivery is None:
        return "accepted"
    assert payload_problems(render_slack(plan.delivery)) == []
    subject, text, attributes = render_sns(plan.delivery)
    assert len(subject) <= SNS_SUBJECT_MAX and subject.isascii()
    assert len(text.encode("utf-8")) <= SNS_MESSAGE_MAX_BYTES and all(a["StringValue"] for a in attributes.values())
    return "rendered"


RAW_BODIES = ("[" * 5000 + "]" * 5000, '{"a": ' + "9" * 5000 + "}", '{"flush": ""}', "", "\ud800", "x" * 300_000)


def mutated_body(c: Chooser) -> str:
    kind = c.pick(("notification", "notification", "notification", "raw", "text"))
    if kind == "raw":
        return c.pick(RAW_BODIES)
    if kind == "text":
        return hostile_text(encoded(c.pick(NOTIFICATION_SEEDS))[: c.number(0, 400)], c)
    return encoded(mutate(c.pick(NOTIFICATION_SEEDS), c, c.number(1, 3), OPERATORS))


@st.composite
def drawn_body(draw: st.DrawFn) -> str:
    return mutated_body(DrawChooser(draw))


@fuzz(3000)
@given(drawn_body() | st.text(max_size=200))
def test_every_queue_body_is_a_notification_or_rejected_and_renders_within_limits(body: str) -> None:
    TALLY["queue bodies"] += 1
    outcome = check_body(body)
    if outcome in ("rejected", "rendered"):
        TALLY["queue bodies rejected" if outcome == "rejected" else "payloads rendered"] += 1


def test_bulk_mutated_queue_bodies_never_crash_the_notifier() -> None:
    outcomes, crashes = bulk(check_body, mutated_body, examples(8_000), f"{SEED}:queue")
    record("queue bodies", outcomes, crashes, check_body)
    assert outcomes["rendered"] > 0 and outcomes["rejected"] > 0


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


@fuzz(400)
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


# ---- fleet policies (YAML) ----


def _policy_texts() -> list[str]:
    """Every fleet policy the repository shows: the docs' YAML blocks that are policies, the template's
    default parameter value and the rehearsal's policy."""
    blocks = [
        m.group(1)
        for p in sorted((ROOT / "docs").glob("*.md"))
        for m in re.finditer(r"```yaml\n(.*?)```", p.read_text(), re.S)
    ]
    template = (ROOT / "template.yaml").read_text()
    default = re.search(r"PolicyParameter:.*?Value: \|\n(.*?)\n\n", template, re.S)
    assert default is not None, "the template's default policy moved"
    texts = [*blocks, "\n".join(line[8:] for line in default.group(1).splitlines()), REHEARSAL_POLICY]
    return [t for t in texts if _is_policy(t)]


def _is_policy(text: str) -> bool:
    try:
        parse_policy(text)
    except PolicyError:
        return False
    return True


POLICY_TEXTS = _policy_texts()
POLICY_DOCS = [yaml.safe_load(t) for t in POLICY_TEXTS]
YAML_SNIPPETS = (
    *("&a ", "*a", "<<: *a\n", "!!python/object/apply:os.system ['true']", "!!binary aGk=", "!!set {a, b}"),
    *("? [a, b]\n: c\n", "\t", "%YAML 1.1\n---\n", "---\n", "...\n", "{", "}", "[", "]", ": ", "- ", "'", '"'),
    *("#", "\ud800", "\\uD800", "\x00", "\ufeff", "\U0001f525" * 300, "x: &a [*a]\n", "2001-12-14t21:59:43.10-05:00"),
    *(".nan", ".inf", "-.inf", "0x" + "f" * 40, "9" * 5000, "~", "!!float 1e400", "[" * 3000 + "]" * 3000),
    *("!!int x", "!!float x", "!!bool x", "!!timestamp x", "2026-02-30", "2026-11-23 25:00:00", "!!int 0b2"),
    "a: &a [1, 2]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: &d [*c, *c, *c, *c]\ne: [*d, *d, *d, *d]\n",
)


def _mutated_yaml_text(text: str, c: Chooser) -> str:
    """A text-level change: a YAML-hostile snippet inserted, a line dropped, doubled or cut short."""
    lines = text.splitlines(keepends=True) or [""]
    at = c.number(0, len(lines) - 1)
    op = c.pick(("insert", "insert", "drop", "double", "cut", "hostile"))
    if op == "insert":
        col = c.number(0, len(lines[at]))
        lines[at] = lines[at][:col] + c.pick(YAML_SNIPPETS) + lines[at][col:]
    elif op == "drop":
        del lines[at]
    elif op == "double":
        lines.insert(at, lines[at])
    elif op == "cut":
        return text[: c.number(0, len(text))]
    else:
        lines[at] = hostile_text(lines[at], c)
    return "".join(lines)


def mutated_policy(c: Chooser) -> str:
    """A policy mutated as a document (dumped as YAML, deep values spliced in as flow text) or as text."""
    if c.pick((True, False)):
        text = c.pick(POLICY_TEXTS)
        for _ in range(c.number(1, 3)):
            text = _mutated_yaml_text(text, c)
        return text
    doc = mutate(c.pick(POLICY_DOCS), c, c.number(1, 3), OPERATORS)
    text = yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)
    # Nested flow sequences: 100 levels are as refused as 3,000 (the bound is 32) and cost PyYAML's scanner
    # a fortieth of the time; the text snippets keep one 3,000 deep.
    return re.sub(r"__deep__:(\d+)", _flow_nesting, text)


def _flow_nesting(found: re.Match[str]) -> str:
    depth = min(int(found.group(1)), 100)
    return "[" * depth + "]" * depth


def check_policy(text: Any) -> str:
    """parse_policy's contract: a FleetPolicy, or PolicyError naming each problem."""
    try:
        policy = parse_policy(text, "fuzz.yaml")
    except PolicyError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)  # noqa: PT017 (a rejection's own contract)
        return "rejected"
    usable(policy, "FleetPolicy")
    return "accepted"


@st.composite
def drawn_policy(draw: st.DrawFn) -> str:
    return mutated_policy(DrawChooser(draw))


def test_the_policy_seeds_are_the_repository_s_policies() -> None:
    assert len(POLICY_TEXTS) >= 6 and all(isinstance(d, dict) and d for d in POLICY_DOCS)


@fuzz(600)
@given(drawn_policy())
def test_every_mutated_policy_is_parsed_or_rejected_with_policy_error(text: str) -> None:
    TALLY["policies"] += 1
    if check_policy(text) == "rejected":
        TALLY["policies rejected"] += 1


def test_bulk_mutated_policies_never_crash_the_parser() -> None:
    outcomes, crashes = bulk(check_policy, mutated_policy, examples(4_000), f"{SEED}:policies")
    record("policies", outcomes, crashes, check_policy)
    assert outcomes["accepted"] > 0 and outcomes["rejected"] > 0


# ---- Kubernetes PodList pages, as the scaler reads a cluster ----

PODLIST = json.loads((ROOT / "tests" / "fixtures" / "kubernetes" / "pods-pending-gpu.json").read_text())
STATUSES = {"410 Gone": 410, "500 Internal Server Error": 500}  # a page answered with this status instead
_LONE = re.compile("[\ud800-\udfff]")  # in a Python str, a surrogate is always a lone one


def _paged(items: list[Any], sizes: tuple[int, ...]) -> list[Any]:
    pages, start = [], 0
    for i, size in enumerate(sizes):
        last = i == len(sizes) - 1
        meta = {"resourceVersion": "48213", "continue": "" if last else f"token-{i + 1}"}
        pages.append({"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": items[start : start + size]})
        start += size
    return pages


PAGE_SEEDS: list[list[Any]] = [
    [PODLIST],
    _paged(PODLIST["items"], (3, 3, 2)),
    [*_paged(PODLIST["items"], (4, 4))[:1], "410 Gone", *_paged(PODLIST["items"], (8,))],  # restarts once
]
GPU_TABLES = ({"nvidia.com/gpu": 1.0}, {"nvidia.com/gpu": 1.0, "k8s.amazonaws.com/vgpu": 10.0})


def _answer(page: Any, gzipped: bool) -> tuple[int, bytes, bool]:
    """A page as the API server sends it: JSON as Go writes it (a lone surrogate becomes U+FFFD, so none
    ever arrives), optionally gzip-compressed; a status name answers with that status; other text as is."""
    if isinstance(page, str) and page in STATUSES:
        return STATUSES[page], b'{"kind": "Status", "message": "' + page.encode() + b'"}', False
    body = page.encode("utf-8", "surrogatepass") if isinstance(page, str) else encoded(_as_go_writes(page)).encode()
    return 200, gzip.compress(body, mtime=0) if gzipped else body, gzipped


def _as_go_writes(doc: Any) -> Any:
    if isinstance(doc, str):
        return _LONE.sub("\ufffd", doc)
    if isinstance(doc, dict):
        return {_as_go_writes(k): _as_go_writes(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_as_go_writes(v) for v in doc]
    return doc


class FakeHttp:
    """Stands in for the http.client connection under kube_http.Connection: each GET gets the next
    answer; when they run out, the server stops answering (a timeout)."""

    timeout = kube.TIMEOUT_S

    def __init__(self, answers: list[tuple[int, bytes, bool]]) -> None:
        self.answers, self.served = answers, 0
        self.status, self.reason, self.body, self.gzipped = 0, "", b"", False

    def request(self, method: str, url: str, headers: dict[str, str]) -> None:
        if self.served >= len(self.answers):
            raise TimeoutError
        self.status, self.body, self.gzipped = self.answers[self.served]
        self.reason, self.served = "Fuzzed", self.served + 1

    def getresponse(self) -> FakeHttp:
        return self

    def read(self, limit: int) -> bytes:
        return self.body[:limit]

    def getheader(self, name: str) -> str | None:
        return "gzip" if name == "Content-Encoding" and self.gzipped else None

    def close(self) -> None:
        pass


ANSWERS: list[list[tuple[int, bytes, bool]]] = [[]]  # the listing being fuzzed


def _connect(server: ApiServer, timeout_s: float, budget_s: float) -> Connection:
    connection = Connection(server, timeout_s, budget_s)
    connection._conn = FakeHttp(ANSWERS[0])  # type: ignore[assignment]  # the real GET path, a fake socket
    return connection


READERS = [
    kube.PodReader(mock.Mock(), mock.Mock(), {"ml": KubeEndpoint(url="http://kube.example", token=SecretStr("t"))}, t)
    for t in GPU_TABLES
]


@pytest.fixture(autouse=True, scope="module")
def _fake_api_server() -> Iterator[None]:
    with mock.patch.object(kube, "Connection", _connect):
        yield


def check_pages(given: dict[str, Any]) -> str:
    """PodReader.read's contract: the cluster's waiting GPU pods and GPU nodes, or ClusterUnreadable."""
    pages = given["pages"] if isinstance(given["pages"], list) else [given["pages"]]
    ANSWERS[0] = [_answer(p, given["gzip"]) for p in pages]
    try:
        pods = READERS[given["table"]].read("ml")
    except ClusterUnreadable as exc:
        assert exc.cluster == "ml" and "\n" not in str(exc)  # noqa: PT017 (a rejection's own contract)
        return "rejected"
    usable(pods, "ClusterPods")
    assert all(w.gpus > 0 for w in pods.waiting)
    return "accepted"


def mutated_pages(c: Chooser) -> dict[str, Any]:
    """Pages of one listing mutated (pods, continue tokens, kinds, the pages themselves), gzip-compressed
    or not, and which GPU resource table the cluster uses (whole GPUs, or shares too)."""
    table, gzipped = c.number(0, len(GPU_TABLES) - 1), c.pick((False, False, True))
    return {"table": table, "gzip": gzipped, "pages": mutate(c.pick(PAGE_SEEDS), c, c.number(1, 4), OPERATORS)}


@st.composite
def drawn_pages(draw: st.DrawFn) -> dict[str, Any]:
    return mutated_pages(DrawChooser(draw))


@fuzz(400)
@given(drawn_pages())
def test_every_mutated_pod_listing_is_read_or_the_cluster_is_unreadable(given: dict[str, Any]) -> None:
    TALLY["pod listings"] += 1
    if check_pages(given) == "rejected":
        TALLY["pod listings rejected"] += 1


def test_bulk_mutated_pod_listings_never_crash_the_reader() -> None:
    outcomes, crashes = bulk(check_pages, mutated_pages, examples(5_000), f"{SEED}:pods")
    record("pod listings", outcomes, crashes, check_pages)
    assert outcomes["accepted"] > 0 and outcomes["rejected"] > 0


# ---- operator tooling: usage records, replay traces, the publisher's config ----

RECORD_SEEDS = [
    usage_doc(),
    usage_doc(group=None, gone={"pods": "kubelet unreachable"}, rows=[[0, None, 300, 0, 300, 0]], workloads={}),
]


def check_usage_record(message: Any) -> str:
    """RecordParser.parse's contract: a typed record, or Skipped with its reason; never an exception."""
    parsed = RecordParser(identify).parse(message)
    if isinstance(parsed, Skipped):
        return "skipped"
    usable(parsed, "UsageRecord")
    assert all(r.held_s >= r.busy_s >= 0 and r.held_s >= r.idle_s >= 0 for r in parsed.rows)
    return "accepted"


def mutated_usage_record(c: Chooser) -> str:
    return encoded(mutate(c.pick(RECORD_SEEDS), c, c.number(1, 3), OPERATORS))


def check_trace(text: Any) -> str:
    """parse_trace's contract: a Trace, or TraceError naming the line. The file is read as `gpufleet
    replay` opens it (UTF-8, newline=""); a lone surrogate stands for bytes that are not UTF-8."""
    lines = io.TextIOWrapper(io.BytesIO(text.encode("utf-8", "surrogatepass")), encoding="utf-8", newline="")
    try:
        trace = parse_trace(lines, "fuzz.csv")
    except TraceError:
        return "rejected"
    usable(trace, "Trace")
    return "accepted"


def mutated_trace(c: Chooser) -> str:
    """A trace with cells replaced by hostile values (numbers, text), rows doubled, columns dropped."""
    rows = [line.split(",") for line in c.pick((DLRM_CSV, V2023_CSV)).splitlines()]
    for _ in range(c.number(1, 3)):
        row = c.pick(rows)
        op, at = c.pick(("cell", "cell", "number", "double", "drop")), c.number(0, len(row) - 1)
        if op == "cell":
            row[at] = hostile_text(row[at], c)
        elif op == "number":
            row[at] = c.pick(("inf", "-inf", "1e400", "-1", "nan", "9" * 5000, "0x10", "1_000", "", '"1,2"'))
        elif op == "double":
            rows.append(list(row))
        else:
            del row[at]
    return "\n".join(",".join(r) for r in rows)


CONFIG_SEEDS = [dict(publisher_config.DEFAULTS), {"window_s": 60, "detail": "full", "prometheus": True}]


def check_publisher_config(text: Any) -> str:
    """config.load's contract: the settings, or ConfigError (exit code 2, one line)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", encoding="utf-8", errors="surrogatepass") as f:
        f.write(text)
        f.flush()
        try:
            loaded = publisher_config.load(f.name)
        except publisher_config.ConfigError as exc:
            assert "\n" not in str(exc)  # noqa: PT017 (a rejection's own contract)
            return "rejected"
    usable(loaded, "publisher config")
    return "accepted"


def mutated_publisher_config(c: Chooser) -> str:
    return encoded(mutate(c.pick(CONFIG_SEEDS), c, c.number(1, 2), OPERATORS))


TOOLING = {
    "usage records": (check_usage_record, mutated_usage_record, 3_000),
    "replay traces": (check_trace, mutated_trace, 2_000),
    "publisher configs": (check_publisher_config, mutated_publisher_config, 1_000),
}


@pytest.mark.parametrize("parser", list(TOOLING))
def test_bulk_mutated_tooling_inputs_never_crash_their_parser(parser: str) -> None:
    check, make, n = TOOLING[parser]
    outcomes, crashes = bulk(check, make, examples(n), f"{SEED}:{parser}")
    record(parser, outcomes, crashes, check)
    assert outcomes["accepted"] > 0 and len(outcomes) > 1


@st.composite
def drawn_tooling_input(draw: st.DrawFn) -> tuple[str, str]:
    parser = draw(st.sampled_from(list(TOOLING)))
    return parser, TOOLING[parser][1](DrawChooser(draw))


@fuzz(300)
@given(drawn_tooling_input())
def test_every_mutated_tooling_input_is_parsed_or_rejected(given: tuple[str, str]) -> None:
    parser, text = given
    TALLY[parser] += 1
    outcome = TOOLING[parser][0](text)
    if outcome != "accepted":
        TALLY[f"{parser} {outcome}"] += 1


# ---- the sweep: each hostile text in every string field and key of every seed ----


def _policy_yaml(doc: Any) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


SWEPT: dict[str, tuple[Callable[[Any], str], list[Any], Callable[[Any], Any]]] = {
    "events": (check_event, SEEDS, lambda doc: doc),
    "queue bodies": (check_body, NOTIFICATION_SEEDS, encoded),
    "policies": (check_policy, POLICY_DOCS, _policy_yaml),
    "pod listings": (check_pages, PAGE_SEEDS, lambda pages: {"table": 1, "gzip": False, "pages": pages}),
    "usage records": (check_usage_record, RECORD_SEEDS, encoded),
    "publisher configs": (check_publisher_config, CONFIG_SEEDS, encoded),
}


def test_the_sweep_puts_long_four_byte_text_in_each_named_field() -> None:
    """Alarm names, group names, execution ids and launch Details each get 300+ 4-byte characters."""
    reached = {
        where[-1]
        for seed in SEEDS
        for where, doc in sweep(seed)
        if where[-1] in NAMED_FIELDS and is_long_four_byte(_at(doc, where))
    }
    assert reached == set(NAMED_FIELDS)


def _at(doc: Any, where: tuple[Any, ...]) -> Any:
    for part in where:
        doc = json.loads(doc)[part] if isinstance(doc, str) else doc[part]  # into a JSON string field too
    return doc


@pytest.mark.parametrize("parser", list(SWEPT))
def test_each_hostile_text_in_every_string_field_is_parsed_or_rejected(parser: str) -> None:
    """Every string field and key of every seed, each probe in turn (a subset, evenly spread, below full
    scale): parsed to usable values or rejected with the documented error."""
    check, seeds, wrap = SWEPT[parser]
    every = max(1, round(1 / SCALE))
    outcomes: Counter[str] = Counter()
    crashes = Crashes()
    for i, (_, doc) in enumerate(d for seed in seeds for d in sweep(seed)):
        if i % every:
            continue
        try:
            outcomes[check(wrap(doc))] += 1
        except Exception as exc:
            crashes.add(exc, wrap(doc))
    record(parser, outcomes, crashes, check)
    assert sum(outcomes.values()) > 0


# ---- the figures ----


def test_zz_record_the_counts() -> None:
    """Runs after the properties above (file order): the figures for the README; the operators and the
    named-field probes must all have been used."""
    assert TALLY["events"] > 0
    assert set(OPERATORS) >= {"delete", "text", "number", "type", "time", "deep", "duplicate", "wrap", "rename"}
    TALLY["mutated inputs"] = sum(TALLY[p] for p in ("events", "queue bodies", "policies", "pod listings", *TOOLING))
    if SCALE == 1:  # the README quotes the full run's counts
        COUNTS.write_text(json.dumps({k: TALLY[k] for k in sorted(TALLY)} | {"operators": dict(OPERATORS)}, indent=1))
