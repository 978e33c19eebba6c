"""Fuzzing every parser of outside input, seeded with real samples and mutated by the operators in
tests/unit/test_fuzz_mutators.py (lone surrogates and 4-byte text in every string field, 300+ character
4-byte strings, keys dropped or renamed, wrong types, huge or NaN-ish numbers, deep nesting, extreme or
naive timestamps, duplicated records, JSON inside strings mutated):

- Lambda events (`parse_event`, every shape), seeded with events/, tests/fixtures/real_events and the
  documented shapes those lack; accepted launch failures are also classified (`describe_failure`);
- fleet policies (`parse_policy`), seeded with every policy in docs/ and the template, mutated as YAML
  documents and as YAML text;
- usage records (`RecordParser.parse`), replay traces (`parse_trace`) and the node publisher's config.

Every input must become valid typed objects or be rejected with the parser's documented error; any other
exception is a crash and fails the test, naming each distinct crash with a shrunk reproducer. Accepted
means usable: datetimes carry a time zone and sane years, numbers are finite, text can be stored.
hypothesis drives each parser (structure-aware, shrinking); a seeded loop drives the same operators for
volume, scaled by the hypothesis profile (tests/profiles.py: FUZZ_SCALE).

The parsers behind adapters are fuzzed by the same machinery in tests/adapters/test_fuzz_adapter_inputs.py:
notification queue bodies (`parse_message`, accepted notifications rendered for Slack, checked by
slack-sdk, and SNS), Kubernetes PodList pages as the scaler reads them (`PodReader.read` over the API
client), and the rehearsal's policy as a policy seed. `make fuzz` runs both at full scale, and writes the
counts to .pytest-fuzz.json for the README's reliability section.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.capacity.classify import FailureSource, describe_failure
from gpufleet.domain.errors import InvalidEvent, PolicyError
from gpufleet.events import EventKind, parse_event
from gpufleet.events.common import EARLIEST, LATEST
from gpufleet.events.model import LaunchUnsuccessful
from gpufleet.policy.fleet import parse_policy
from gpufleet_node import config as publisher_config
from gpufleet_tools.replay.traces import TraceError, parse_trace
from gpufleet_tools.report.identity import identify
from gpufleet_tools.report.records import RecordParser, Skipped
from tests.profiles import FUZZ_SCALE
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
SCALE = FUZZ_SCALE  # `make unit` runs a twentieth, `make test` half, `make fuzz` all
SEED = os.environ.get("GPUFLEET_FUZZ_SEED", "issue-22")  # the bulk loops' seed: the same inputs every run
COUNTS = ROOT / ".pytest-fuzz.json"
PARSERS = ("events", "queue bodies", "policies", "pod listings", "usage records", "replay traces", "publisher configs")


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


# ---- fleet policies (YAML) ----


def _policy_texts() -> list[str]:
    """Every fleet policy the repository shows: the docs' YAML blocks that are policies and the template's
    default parameter value (the rehearsal's: tests/adapters/test_fuzz_adapter_inputs.py)."""
    blocks = [
        m.group(1)
        for p in sorted((ROOT / "docs").glob("*.md"))
        for m in re.finditer(r"```yaml\n(.*?)```", p.read_text(), re.S)
    ]
    template = (ROOT / "template.yaml").read_text()
    default = re.search(r"PolicyParameter:.*?Value: \|\n(.*?)\n\n", template, re.S)
    assert default is not None, "the template's default policy moved"
    texts = [*blocks, "\n".join(line[8:] for line in default.group(1).splitlines())]
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


def mutated_policy(c: Chooser, texts: list[str] = POLICY_TEXTS, docs: list[Any] = POLICY_DOCS) -> str:
    """A policy mutated as a document (dumped as YAML, deep values spliced in as flow text) or as text."""
    if c.pick((True, False)):
        text = c.pick(texts)
        for _ in range(c.number(1, 3)):
            text = _mutated_yaml_text(text, c)
        return text
    doc = mutate(c.pick(docs), c, c.number(1, 3), OPERATORS)
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
    "policies": (check_policy, POLICY_DOCS, _policy_yaml),
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
    swept(parser, *SWEPT[parser])


def swept(parser: str, check: Callable[[Any], str], seeds: list[Any], wrap: Callable[[Any], Any]) -> None:
    """Each hostile text in every string field and key of the seeds (every 1/SCALE-th below full scale)."""
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
    """Runs after the properties above (file order) and after tests/adapters/test_fuzz_adapter_inputs.py
    (`make fuzz` runs it first): the figures for the README; the operators and the named-field probes must
    all have been used."""
    assert TALLY["events"] > 0
    assert set(OPERATORS) >= {"delete", "text", "number", "type", "time", "deep", "duplicate", "wrap", "rename"}
    TALLY["mutated inputs"] = sum(TALLY[p] for p in PARSERS)
    if SCALE == 1 and all(TALLY[p] for p in PARSERS):  # the README quotes the full run's counts, all parsers
        COUNTS.write_text(json.dumps({k: TALLY[k] for k in sorted(TALLY)} | {"operators": dict(OPERATORS)}, indent=1))
