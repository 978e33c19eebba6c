"""A usage record is checked field by field: a bad one is skipped with its reason, never raised. Also the
builder the report's other tests use (`usage_doc`, `message`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet_node.schema import TEAM_UNKNOWN, USAGE_RECORD_VERSION
from gpufleet_tools.report.identity import identify
from gpufleet_tools.report.records import RecordParser, Skipped, SkipReason, UsageRecord, WorkloadKind
from tests.profiles import examples

START = datetime(2026, 11, 23, 10, 5, tzinfo=UTC)
TRAINER = {"kind": "pod", "namespace": "team-a", "pod": "trainer-0", "container": "main", "pod_uid": "u-1"}
ALICE_JOB = {"kind": "slurm", "job_id": "4242", "user": "alice"}
EXAMPLE_ROWS = [[0, "0", 300, 270.5, 0, 40960], [1, "0", 300, 3.0, 297, 512], [2, "1", 300, 150, 0, 20000]]


def usage_doc(
    start: datetime = START,
    node: str = "i-0abc",
    instance_type: str = "g5.12xlarge",
    group: str | None = "eks:prod/gpu-a",
    gpus: int = 4,
    workloads: dict[str, dict[str, Any]] | None = None,
    rows: list[list[Any]] | None = None,
    gone: dict[str, str] | None = None,
    seconds: int = 300,
) -> dict[str, Any]:
    """A usage record as the node writes it (gpufleet_node.schema); defaults: the issue's example."""
    doc: dict[str, Any] = {
        "v": USAGE_RECORD_VERSION,
        "start": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "s": seconds,
        "node": node,
        "type": instance_type,
        "group": group,
        "gpus": gpus,
        "w": {"0": TRAINER, "1": ALICE_JOB} if workloads is None else workloads,
        "u": [*EXAMPLE_ROWS, [3, None, 300, 0, 300, 0]] if rows is None else rows,
    }
    if gone:
        doc["gone"] = gone
    return doc


def message(**kwargs: Any) -> str:
    return json.dumps(usage_doc(**kwargs), separators=(",", ":"))


def parse(text: str) -> UsageRecord | Skipped:
    return RecordParser(identify).parse(text)


def test_the_issue_example_parses_into_typed_rows() -> None:
    doc = usage_doc(gone={"allocations": "kubelet socket not found"})
    record = parse(json.dumps(doc))
    assert isinstance(record, UsageRecord)
    assert (record.start, record.seconds, record.node, record.instance_type) == (
        int(START.timestamp()),
        300,
        "i-0abc",
        "g5.12xlarge",
    )
    assert record.group == "eks:prod/gpu-a" and record.gpus == 4
    assert record.gone == (("allocations", "kubelet socket not found"),)
    trainer, job = record.rows[0].workload, record.rows[2].workload
    assert trainer is not None and job is not None
    assert (trainer.team, trainer.label, trainer.subject, trainer.kind) == (
        "team-a",
        "team-a/trainer-0 (main)",
        "pod team-a/trainer-0 (main)",
        WorkloadKind.POD,
    )
    assert (job.team, job.subject, job.kind) == ("alice", "Slurm job 4242 (alice)", WorkloadKind.SLURM)
    assert record.rows[3].workload is None
    assert [(r.gpu, r.held_s, r.busy_s, r.idle_s, r.peak_mib) for r in record.rows[:2]] == [
        (0, 300.0, 270.5, 0.0, 40960.0),
        (1, 300.0, 3.0, 297.0, 512.0),
    ]


def _with(**changes: Any) -> str:
    doc = usage_doc()
    for key, value in changes.items():
        if value is _DROP:
            doc.pop(key)
        else:
            doc[key] = value
    return json.dumps(doc)


_DROP = object()


@pytest.mark.parametrize(
    ("text", "reason", "detail"),
    [
        ("not json at all", SkipReason.NOT_JSON, "not json"),
        ("[1, 2]", SkipReason.NOT_JSON, "a JSON list"),
        (_with(v=2), SkipReason.VERSION, "v=2"),
        (_with(v=_DROP), SkipReason.VERSION, "v=None"),
        (_with(start=_DROP), SkipReason.MALFORMED, "start is missing"),
        (_with(start="yesterday"), SkipReason.MALFORMED, "start is not an ISO 8601 time"),
        (_with(s=0), SkipReason.MALFORMED, "s (window seconds)"),
        (_with(gpus=True), SkipReason.MALFORMED, "gpus"),
        (_with(node=""), SkipReason.MALFORMED, "node is missing"),
        (_with(group=7), SkipReason.MALFORMED, "group"),
        (_with(u={"0": 1}), SkipReason.MALFORMED, "w, u or gone"),
        (_with(u=[[0, "0", 300, 1, 0]]), SkipReason.MALFORMED, "a usage row is not [gpu, workload"),
        (_with(u=[[0, "9", 300, 1, 0, 0]]), SkipReason.MALFORMED, "names workload '9', not in w"),
        (_with(u=[[0, None, -1, 0, 0, 0]]), SkipReason.MALFORMED, "held seconds is not a number >= 0"),
        (_with(u=[[0, None, 300, "busy", 0, 0]]), SkipReason.MALFORMED, "busy seconds"),
        (_with(u=[[-1, None, 300, 0, 0, 0]]), SkipReason.MALFORMED, "gpu index"),
        (_with(w={"0": "pod"}), SkipReason.MALFORMED, "a workload in w is not an object"),
        (_with(w={"0": {"kind": "pod", "namespace": 5}}), SkipReason.MALFORMED, "not a string"),
        (
            '{"v":1,"start":"2026-11-23T10:05:00Z","s":300,"node":"i","type":"t","gpus":1,"u":[[0,null,NaN,0,0,0]]}',
            SkipReason.MALFORMED,
            "held seconds",
        ),
    ],
)
def test_a_bad_record_is_skipped_with_its_reason(text: str, reason: SkipReason, detail: str) -> None:
    skipped = parse(text)
    assert isinstance(skipped, Skipped)
    assert skipped.reason is reason and detail in skipped.detail


def test_busy_and_idle_never_count_beyond_the_time_held() -> None:
    """A time-sliced GPU: a workload busier than its even share of the time is busy all of its share."""
    record = parse(message(rows=[[0, "0", 150, 240, 0, 0], [0, "1", 150, 60, 400, 0]]))
    assert isinstance(record, UsageRecord)
    assert [(r.held_s, r.busy_s, r.idle_s) for r in record.rows] == [(150, 150, 0), (150, 60, 150)]


def test_a_missing_group_and_peak_are_read_as_none_and_zero() -> None:
    record = parse(message(group=None, rows=[[0, "0", 300, 10, 0, None]]))
    assert isinstance(record, UsageRecord)
    assert record.group is None and record.rows[0].peak_mib == 0


def test_each_workload_identity_is_resolved_once() -> None:
    calls = []

    def counting(doc: Any) -> Any:
        calls.append(doc)
        return identify(doc)

    parser = RecordParser(counting)
    for _ in range(50):
        assert isinstance(parser.parse(message()), UsageRecord)
    assert len(calls) == 2


def test_an_unknown_workload_kind_belongs_to_the_unknown_team() -> None:
    record = parse(message(workloads={"0": {"kind": "martian"}}, rows=[[0, "0", 300, 0, 300, 0]]))
    assert isinstance(record, UsageRecord)
    w = record.rows[0].workload
    assert w is not None and (w.kind, w.team) == (WorkloadKind.UNKNOWN, TEAM_UNKNOWN)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=6), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(
    field=st.sampled_from(["v", "start", "s", "node", "type", "group", "gpus", "w", "u", "gone"]),
    value=json_values,
)
def test_any_value_in_any_field_parses_or_is_skipped(field: str, value: Any) -> None:
    doc = usage_doc()
    doc[field] = value
    assert isinstance(parse(json.dumps(doc)), UsageRecord | Skipped)


@settings(max_examples=examples(200), deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_parses_or_is_skipped(text: str) -> None:
    assert isinstance(parse(text), UsageRecord | Skipped)


# ---- hostile input the fuzzer found (tests/unit/test_fuzz_inputs.py): skipped, never raised ----


def test_a_number_too_big_for_a_float_is_skipped_not_raised() -> None:
    skipped = parse(message(rows=[[0, None, 10**400, 0, 0, 0]]))
    assert isinstance(skipped, Skipped)
    assert skipped.reason is SkipReason.MALFORMED and "held seconds" in skipped.detail


def test_json_nested_deeper_than_the_parser_can_go_is_skipped_not_raised() -> None:
    skipped = parse("[" * 100_000)
    assert isinstance(skipped, Skipped)
    assert skipped.reason is SkipReason.NOT_JSON and "nested" in skipped.detail


LONE = "i-0\udc00abc"  # json.dumps writes it as the escape \udc00, which json.loads takes back


@pytest.mark.parametrize(
    ("changes", "detail"),
    [
        ({"node": LONE}, "node"),
        ({"instance_type": LONE}, "type"),
        ({"group": LONE}, "group"),
        ({"gone": {LONE: "kubelet unreachable"}}, "gone"),
        ({"gone": {"pods": LONE}}, "gone"),
        ({"workloads": {"0": {**TRAINER, "namespace": LONE}}, "rows": [[0, "0", 300, 0, 300, 0]]}, "namespace"),
        ({"workloads": {"0": {**ALICE_JOB, "user": LONE}}, "rows": [[0, "0", 300, 0, 300, 0]]}, "user"),
    ],
    ids=["node", "type", "group", "gone-what", "gone-why", "namespace", "user"],
)
def test_a_lone_surrogate_in_text_the_report_keeps_skips_the_record(changes: dict[str, Any], detail: str) -> None:
    """The report writes these out as UTF-8, which a lone surrogate is not."""
    skipped = parse(message(**changes))
    assert isinstance(skipped, Skipped)
    assert skipped.reason is SkipReason.MALFORMED and detail in skipped.detail and "surrogate" in skipped.detail


def test_a_pair_of_surrogate_escapes_is_one_character_and_parses() -> None:
    record = parse(message(node="i-\U0001f525"))  # json.dumps writes \ud83d\udd25: a valid pair
    assert isinstance(record, UsageRecord) and record.node == "i-\U0001f525"
