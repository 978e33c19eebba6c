"""Issue 29: one node's records must not set the report's money. Ten honest p5.48xlarge nodes for a day
(1,920 GPU-h, $13,209.60) and the probe's forged records on top of them, each read as the reader hands
it on (log stream, event timestamp, message): every forgery is flagged with its stream, never summed.
The old report (no stream, no bounds, byte-identical dedupe, a type's GPUs from the records) summed them:
x146, x14,500, +192 GPU-h, +2,778 GPU-h to `finance`, $28,800 -> $28.81. A window's records that hold more
together than the node can are all flagged, none counted: whoever wrote first, no team is billed."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from gpufleet_tools.report import bounds
from gpufleet_tools.report.bounds import together_slack
from gpufleet_tools.report.identity import identify
from gpufleet_tools.report.model import FlagKind, Period, Report
from gpufleet_tools.report.prices import PriceBook
from gpufleet_tools.report.records import RecordParser
from gpufleet_tools.report.render import json_doc, table
from gpufleet_tools.report.usage import UsageSums
from tests.unit.test_report_records import message
from tests.unit.test_report_usage import DAY0

DAY = Period(DAY0, DAY0 + timedelta(days=1))
P5 = "p5.48xlarge"
FINANCE = {"kind": "pod", "namespace": "finance", "pod": "ledger-0", "container": "main"}
Event = tuple[str, int, str]  # (log stream, timestamp ms, message): what the reader hands on


def event(node: str, minutes: int, stream: str | None = None, **kw: Any) -> Event:
    at = DAY0 + timedelta(minutes=minutes)
    kw.setdefault("instance_type", P5)
    kw.setdefault("gpus", 8)
    kw.setdefault("group", "asg:train")
    kw.setdefault("workloads", {"0": {"kind": "pod", "namespace": f"team-{node[-1]}", "pod": "p", "container": "c"}})
    kw.setdefault("rows", [[g, "0", 300, 200, 0, 1000] for g in range(8)])
    return stream or node, int(at.timestamp() * 1000), message(start=at, node=node, **kw)


def hour_rows(gpus: int = 8) -> list[list[Any]]:
    return [[g, "0", 3600, 2400, 0, 1000] for g in range(gpus)]


def honest(nodes: int = 10, **kw: Any) -> list[Event]:
    """Hour-long windows (a node may write them: usage_window_s 3600), to keep the test fast."""
    kw.setdefault("rows", hour_rows())
    return [event(f"i-{n}", 60 * w, seconds=3600, **kw) for n in range(nodes) for w in range(24)]


def report(events: list[Event], book: PriceBook | None = None) -> Report:
    """In the order FilterLogEvents returns them: by timestamp, then as they were written (a resend or a
    forgery of a window comes right after the window's first record)."""
    sums, parser = UsageSums(DAY, book=book), RecordParser(identify)
    for stream, stamp, text in sorted(events, key=lambda e: e[1]):
        sums.add(parser.parse(text, stream, stamp))
    return sums.report()


def teams(r: Report) -> dict[str, float]:
    return {t.team: t.usage.held_h for t in r.teams}


def test_the_honest_fleet() -> None:
    r = report(honest())
    assert r.total.held_h == pytest.approx(1920.0) and r.total.cost == pytest.approx(13_209.60)
    assert r.records == 240 and not r.flagged


@pytest.mark.parametrize(
    ("forged", "kind", "claimed_h"),
    [
        # held 1e9 s on one GPU (the old report: x146)
        (event("i-3", 5, rows=[[0, "0", 1e9, 0, 0, 0]]), FlagKind.HELD, 1e9 / 3600),
        # a window of 10^12 s holding 10^11 s of a GPU (the old report: x14,500)
        (event("i-3", 5, seconds=10**12, rows=[[0, "0", 1e11, 0, 0, 0]]), FlagKind.WINDOW, 1e11 / 3600),
        # more GPUs than a p5.48xlarge has
        (event("i-3", 5, gpus=4000, rows=[[g, "0", 300, 0, 0, 0] for g in range(4000)]), FlagKind.GPUS, 4000 / 12),
        # stamped at another time than its window: it would be read in another slice than the window's records
        (("i-3", 0, message(start=DAY0, node="i-3", instance_type=P5, gpus=8)), FlagKind.STAMP, 4 * 300 / 3600),
    ],
)
def test_a_record_claiming_more_than_its_node_can_hold_is_flagged_not_summed(
    forged: Event, kind: FlagKind, claimed_h: float
) -> None:
    r = report([*honest(), forged])
    assert r.total.held_h == pytest.approx(1920.0) and r.total.cost == pytest.approx(13_209.60)
    [flag] = r.flagged
    assert (flag.kind, flag.stream, flag.node, flag.records) == (kind, "i-3", "i-3", 1)
    assert flag.claimed_h == pytest.approx(claimed_h) and flag.bound_h <= 8.0  # 8 GPUs, an hour at most


def test_a_day_resent_with_a_space_added_is_counted_once() -> None:
    resent = [(s, t, m.replace(",", ", ", 1)) for s, t, m in honest() if s == "i-5"]
    r = report([*honest(), *resent])
    assert r.total.held_h == pytest.approx(1920.0) and (r.duplicates, r.flagged) == (24, ())


def test_a_window_written_again_with_other_content_is_a_conflict_and_neither_record_counts() -> None:
    """The node's own stream (IAM lets any node write it): the window already holds all 8 GPUs. Which of
    the two is true cannot be told, so neither is billed: i-5's day is a flagged conflict, not finance's."""
    moved = [event("i-5", 60 * w, seconds=3600, rows=hour_rows(), workloads={"0": FINANCE}) for w in range(24)]
    r = report([*honest(), *moved])
    assert r.total.held_h == pytest.approx(1920.0 - 192.0) and "finance" not in teams(r)
    [flag] = r.flagged
    assert (flag.kind, flag.stream, flag.records, flag.teams) == (FlagKind.CONFLICT, "i-5", 48, ("finance", "team-5"))
    assert flag.claimed_h == pytest.approx(384.0)
    assert flag.bound_h == pytest.approx(24 * 8 * (3600 + together_slack(3600)) / 3600)
    assert (
        "2 different records of one window" in flag.detail and "neither counted: a node can hold at most" in flag.detail
    )


def test_a_forger_that_writes_a_nodes_windows_before_the_node_does_gets_nothing() -> None:
    """Probe (a): the forger pre-writes i-5's coming windows into i-5's stream as `finance` (CloudWatch
    Logs takes events up to 2 h ahead), so FilterLogEvents returns the forged record of each window first.
    Before: the first read was counted (finance 192 GPU-h) and i-5's honest record was the flagged one."""
    moved = [event("i-5", 60 * w, seconds=3600, rows=hour_rows(), workloads={"0": FINANCE}) for w in range(24)]
    r = report([*moved, *honest()])  # same timestamps: the forged ones were ingested first
    assert "finance" not in teams(r) and r.total.held_h == pytest.approx(1920.0 - 192.0)
    [flag] = r.flagged
    assert (flag.kind, flag.stream, flag.records, flag.teams) == (FlagKind.CONFLICT, "i-5", 48, ("finance", "team-5"))


def minute(node: str, w: int, **kw: Any) -> Event:
    """A 60 s window (usage_window_s 60) that holds all 8 GPUs."""
    return event(node, w, seconds=60, rows=[[g, "0", 60, 40, 0, 0] for g in range(8)], **kw)


def test_a_second_record_of_a_short_window_does_not_fit_in_the_slack() -> None:
    """Probe (b): with 60 s windows the old slack (60 s + 1 % a GPU) left room for a whole second record:
    finance's was counted after the honest one, and the per-hour check then flagged the node's own later
    windows. Now the slack scales with the window (1 s + 2 %): the two records of each window are a
    conflict and neither counts; the windows the forger left alone all count."""
    forged = [minute("i-1", w, workloads={"0": FINANCE}) for w in range(30)]
    r = report([*(minute("i-1", w) for w in range(60)), *forged])
    assert "finance" not in teams(r)
    assert teams(r) == {"team-1": pytest.approx(30 * 8 * 60 / 3600)}  # the 30 windows the forger left alone
    [flag] = r.flagged
    assert (flag.kind, flag.stream, flag.records, flag.teams) == (FlagKind.CONFLICT, "i-1", 60, ("finance", "team-1"))
    assert "neither counted" in flag.detail


def test_records_of_a_window_that_fit_together_all_count_within_the_slack_only() -> None:
    """A restarted publisher's two records of a 60 s window, its first sample reaching 1 s before the
    window: counted. A forger's extra second a GPU on top is within the slack too; 3 s are not."""
    before = event("i-1", 0, seconds=60, rows=[[g, "0", 31, 0, 0, 0] for g in range(8)])
    after = event("i-1", 0, seconds=60, rows=[[g, "0", 30, 0, 0, 0] for g in range(8)])
    assert report([before, after]).total.held_h == pytest.approx(8 * 61 / 3600)
    extra = event("i-1", 0, seconds=60, rows=[[0, "0", 3, 0, 0, 0]], workloads={"0": FINANCE})
    r = report([before, after, extra])
    assert r.total.held_h == 0 and [(f.kind, f.records) for f in r.flagged] == [(FlagKind.CONFLICT, 3)]


def test_finance_under_another_nodes_id_is_flagged_with_the_stream_it_came_from() -> None:
    forged = event("i-2", 5, stream="i-7", workloads={"0": FINANCE}, rows=[[0, "0", 1e7, 0, 0, 0]])
    r = report([*honest(), forged])
    assert "finance" not in teams(r) and r.total.held_h == pytest.approx(1920.0)
    [flag] = r.flagged
    assert (flag.kind, flag.stream, flag.node, flag.teams) == (FlagKind.STREAM, "i-7", "i-2", ("finance",))
    assert flag.claimed_h == pytest.approx(2777.8, abs=0.1)
    assert "names node i-2 but was written to stream i-7" in flag.line()


def test_windows_that_overlap_their_own_nodes_windows_are_a_conflict() -> None:
    """An hour-long window and eleven 5-minute ones in it: each within its own bounds, together twice what
    8 GPUs hold in an hour. They are judged as one group: none counts, whichever is read first."""
    fives = [event("i-4", 60 + 5 * w) for w in range(1, 12)]
    hour = event("i-4", 60, seconds=3600, rows=[[g, "0", 3600, 0, 0, 0] for g in range(8)])
    r = report([*fives, hour])
    assert r.total.held_h == 0
    [flag] = r.flagged
    assert (flag.kind, flag.records) == (FlagKind.CONFLICT, 12)
    assert "12 different records of overlapping windows" in flag.detail and "none counted" in flag.detail
    assert flag.bound_h == pytest.approx(8 * (3600 + together_slack(3600)) / 3600)


def test_a_record_split_in_parts_and_a_restarted_nodes_second_record_both_count() -> None:
    first = [[g, "0", 150, 100, 0, 0] for g in range(8)]
    events = [event("i-0", 0, rows=first[:4]), event("i-0", 0, rows=first[4:]), event("i-0", 0, rows=first)]
    r = report(events)
    assert r.total.held_h == pytest.approx(8 * 300 / 3600) and not r.flagged and r.records == 3


def test_gpus_4000_on_a_policy_priced_type_does_not_divide_its_price() -> None:
    book = PriceBook({"x9.huge": 120.0}, {"asg:x9": 4}.get)
    rows = hour_rows(4)
    fleet = honest(instance_type="x9.huge", group="asg:x9", gpus=4, rows=rows)
    assert report(fleet, book).total.cost == pytest.approx(28_800.0)
    forged = event("i-1", 5, instance_type="x9.huge", group="asg:x9", gpus=4000, rows=rows[:1])
    r = report([*fleet, forged], book)
    assert r.total.cost == pytest.approx(28_800.0)
    assert [(f.kind, f.stream) for f in r.flagged] == [(FlagKind.GPUS, "i-1")]
    assert "a x9.huge has 4 (policy)" in r.flagged[0].detail
    assert [(p.instance_type, p.gpus, p.per_gpu_hour) for p in r.prices] == [("x9.huge", 4, 30.0)]


def test_a_policy_priced_type_without_a_trusted_gpu_count_has_no_cost_rather_than_a_claimed_one() -> None:
    fleet = honest(nodes=1, instance_type="x9.huge", group="asg:x9", gpus=4, rows=hour_rows(1))
    r = report(fleet, PriceBook({"x9.huge": 120.0}))
    assert r.total.cost == 0 and r.total.unpriced_h == pytest.approx(24.0)
    [no_price] = [f for f in r.findings if f.subject == "x9.huge"]
    assert "set demand.gpus_per_node for asg:x9 in the policy" in no_price.text


def test_the_flagged_records_are_in_the_table_and_the_json_with_stream_claim_and_bound() -> None:
    forged = event("i-2", 5, stream="i-7", workloads={"0": FINANCE}, rows=[[0, "0", 1e7, 0, 0, 0]])
    r = report([*honest(nodes=1), forged])
    text = table(r)
    assert text.splitlines()[1] == "24 usage records from 1 node; 1 flagged, not summed"
    assert "FLAGGED RECORDS" in text and "  1. stream i-7: 1 record of node i-2 (p5.48xlarge, " in text
    [doc] = json.loads(json.dumps(json_doc(r)))["flagged"]
    assert (doc["kind"], doc["stream"], doc["node"], doc["records"], doc["teams"]) == (
        "stream",
        "i-7",
        "i-2",
        1,
        ["finance"],
    )
    assert doc["claimed_gpu_hours"] == pytest.approx(1e7 / 3600) and doc["bound_gpu_hours"] == 0.0


def test_a_window_is_judged_when_its_slice_is_read_and_a_late_record_cannot_unseat_it() -> None:
    """The reader tells when a slice is read to its end: its windows are summed then (memory let go). A
    record of a judged window read later (FilterLogEvents never does: a slice comes in timestamp order)
    is counted only if it fits with the window's counted records, else it alone is flagged."""
    sums, parser = UsageSums(DAY), RecordParser(identify)
    for node_window in (0, 1):
        stream, stamp, text = minute("i-1", node_window)
        sums.add(parser.parse(text, stream, stamp))
    assert sums.records == 1  # window 0 (the node's records moved past it); window 1 may have more to come
    sums.slice_read(int(DAY0.timestamp() * 1000), int(DAY0.timestamp() * 1000) + 86_400_000)
    assert sums.records == 2
    sums, parser = UsageSums(DAY), RecordParser(identify)
    for e in [minute("i-1", 0), minute("i-1", 1), minute("i-1", 0, workloads={"0": FINANCE})]:
        sums.add(parser.parse(e[2], e[0], e[1]))
    r = sums.report()
    assert "finance" not in teams(r) and r.total.held_h == pytest.approx(2 * 8 * 60 / 3600)
    [flag] = r.flagged
    assert (flag.kind, flag.records, flag.teams) == (FlagKind.CONFLICT, 1, ("finance",))
    assert "read after the other records of its window were judged" in flag.detail


def test_a_window_flooded_with_records_is_a_conflict_without_holding_them_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory: a group of more records than a node writes is judged a conflict at once, and the records
    that come after it are flagged as they are read."""
    monkeypatch.setattr(bounds, "MAX_GROUP_RECORDS", 3)
    flood = [event("i-1", 0, rows=[[0, "0", 1 + n, 0, 0, 0]], workloads={"0": FINANCE}) for n in range(5)]
    r = report([event("i-1", 0), *flood])
    assert r.total.held_h == 0 and sum(f.records for f in r.flagged) == 6
    assert {f.kind for f in r.flagged} == {FlagKind.CONFLICT}
