"""Fuzzing the parsers of outside input that sit behind adapters, by the machinery and operators of
tests/unit/test_fuzz_inputs.py (which fuzzes the pure parsers, and whose counts these add to):

- notification queue bodies (`parse_message`), and accepted notifications rendered for Slack (the payload
  checked by slack-sdk's models: gpufleet.notify.slack, glue) and SNS;
- Kubernetes PodList pages as the scaler reads them (`PodReader.read` over the API client, its socket a
  fake: pods and nodes, continue tokens, gzip);
- the rehearsal's policy as one more policy seed (rehearsal.scenario imports the runtime).

Every input must become valid typed objects or be rejected with the parser's documented error; any other
exception is a crash and fails the test. `make fuzz` runs this file first, then the pure fuzz, whose last
test writes the counts of both.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from unittest import mock

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from gpufleet.domain.errors import ClusterUnreadable
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
from gpufleet.events.queue import Flush, InvalidMessage, parse_message
from gpufleet.kubernetes import cluster as kube
from gpufleet.kubernetes.client import ApiServer, Connection
from gpufleet.notify.incidents import merge_notification, plan_delivery
from gpufleet.notify.render import SNS_MESSAGE_MAX_BYTES, SNS_SUBJECT_MAX, render_slack, render_sns
from gpufleet.notify.slack import payload_problems
from gpufleet.policy.notify import FlapDamping, Grouping
from gpufleet.settings import KubeEndpoint
from rehearsal.scenario import POLICY as REHEARSAL_POLICY
from tests.unit.test_fuzz_inputs import (
    NOTIFICATION_SEEDS,
    OPERATORS,
    ROOT,
    SEED,
    TALLY,
    check_policy,
    examples,
    fuzz,
    mutated_policy,
    record,
    swept,
    usable,
)
from tests.unit.test_fuzz_mutators import Chooser, DrawChooser, bulk, encoded, hostile_text, mutate

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


# ---- the rehearsal's policy, one more seed of the policy fuzz ----
# Its share of the policy fuzz when it was one seed of eleven there: about 1/11 of 600 drawn, 4,000 bulk.

DEMO_TEXTS = [REHEARSAL_POLICY]
DEMO_DOCS = [yaml.safe_load(REHEARSAL_POLICY)]


def mutated_demo_policy(c: Chooser) -> str:
    return mutated_policy(c, DEMO_TEXTS, DEMO_DOCS)


@st.composite
def drawn_demo_policy(draw: st.DrawFn) -> str:
    return mutated_demo_policy(DrawChooser(draw))


def test_the_demos_policy_is_a_policy() -> None:
    assert check_policy(REHEARSAL_POLICY) == "accepted"


@fuzz(60)
@given(drawn_demo_policy())
def test_every_mutated_demo_policy_is_parsed_or_rejected_with_policy_error(text: str) -> None:
    TALLY["policies"] += 1
    if check_policy(text) == "rejected":
        TALLY["policies rejected"] += 1


def test_bulk_mutated_demo_policies_never_crash_the_parser() -> None:
    outcomes, crashes = bulk(check_policy, mutated_demo_policy, examples(400), f"{SEED}:demo-policy")
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


# ---- the sweep: each hostile text in every string field and key of every seed ----

SWEPT = {
    "queue bodies": (check_body, NOTIFICATION_SEEDS, encoded),
    "pod listings": (check_pages, PAGE_SEEDS, lambda pages: {"table": 1, "gzip": False, "pages": pages}),
    "policies": (check_policy, DEMO_DOCS, lambda doc: yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)),
}


@pytest.mark.parametrize("parser", list(SWEPT))
def test_each_hostile_text_in_every_string_field_is_parsed_or_rejected(parser: str) -> None:
    """Every string field and key of every seed, each probe in turn (a subset, evenly spread, below full
    scale): parsed to usable values or rejected with the documented error."""
    swept(parser, *SWEPT[parser])
