"""The report's sums, prices and findings: worked examples, then the properties that must hold for any
fleet (conservation of GPU-hours, busy within held, sharing keeps the total, findings ranked by money)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet_node.schema import TEAM_UNALLOCATED
from gpufleet_tools.report.identity import identify
from gpufleet_tools.report.prices import ON_DEMAND_US_EAST_1, PriceBook, PriceSource
from gpufleet_tools.report.records import RecordParser
from gpufleet_tools.report.usage import FindingKind, Period, Report, Selection, UsageSums
from tests.profiles import examples
from tests.unit.test_report_records import START, message

DAY0 = START.replace(hour=0, minute=0)
PERIOD = Period(DAY0, DAY0 + timedelta(days=3))
G5_12_PER_GPU = 5.672 / 4


def report_of(messages: list[str], period: Period = PERIOD, prices: PriceBook | None = None, **kw: Any) -> Report:
    sums, parser = UsageSums(period, kw.pop("selection", Selection())), RecordParser(identify)
    for m in messages:
        sums.add(parser.parse(m))
    return sums.report(prices or PriceBook(), **kw)


def windows(hours: float, **kwargs: Any) -> list[str]:
    """One record per 5-minute window for `hours` from DAY0."""
    return [message(start=DAY0 + timedelta(minutes=5 * i), **kwargs) for i in range(round(hours * 12))]


def test_the_issue_example_summed_per_team_workload_and_group() -> None:
    r = report_of(windows(10))
    teams = {t.team: t.usage for t in r.teams}
    assert set(teams) == {"team-a", "alice"}
    assert teams["team-a"].held_h == pytest.approx(20.0) and teams["alice"].held_h == pytest.approx(10.0)
    assert teams["team-a"].busy_h == pytest.approx(10 * (270.5 + 3.0) / 300)
    assert teams["team-a"].idle_h == pytest.approx(10 * 297 / 300)
    assert teams["team-a"].peak_mib == 40960
    assert teams["team-a"].cost == pytest.approx(20 * G5_12_PER_GPU)
    assert r.unallocated.team == TEAM_UNALLOCATED and r.unallocated.usage.held_h == pytest.approx(10.0)
    assert r.total.held_h == pytest.approx(40.0) and r.total.cost == pytest.approx(40 * G5_12_PER_GPU)
    [trainer, job] = r.workloads
    assert (trainer.workload.subject, trainer.gpus, trainer.nodes) == ("pod team-a/trainer-0 (main)", 2, 1)
    assert job.workload.subject == "Slurm job 4242 (alice)" and job.groups == ("eks:prod/gpu-a",)
    [group] = r.groups
    assert (group.group, group.nodes) == ("eks:prod/gpu-a", 1)
    assert (group.seen.held_h, group.allocated.held_h, group.unallocated.held_h) == pytest.approx((40, 30, 10))
    assert r.records == 120 and r.nodes == 1


def test_a_workload_with_an_idle_gpu_among_several_is_one_line_with_its_money() -> None:
    r = report_of(windows(10))
    [idle] = [f for f in r.findings if f.kind is FindingKind.IDLE_GPUS]
    assert idle.line() == (
        f"pod team-a/trainer-0 (main) requested 2 GPUs, one idle 99 % of its life: ${9.9 * G5_12_PER_GPU:,.2f}"
    )


def test_a_workload_holding_one_gpu_it_never_uses() -> None:
    notebook = {"kind": "pod", "namespace": "team-b", "pod": "notebook-7", "container": "lab"}
    r = report_of(windows(4, workloads={"0": notebook}, rows=[[0, "0", 300, 0, 300, 1024]], gpus=1))
    [idle] = [f for f in r.findings if f.kind is FindingKind.IDLE_GPUS]
    assert idle.line() == f"pod team-b/notebook-7 (lab) held 1 GPU idle 100 %: ${4 * G5_12_PER_GPU:,.2f}"


def test_all_gpus_of_a_slurm_job_idle() -> None:
    rows = [[g, "0", 300, 0, 300, 0] for g in range(4)]
    r = report_of(windows(2, workloads={"0": {"kind": "slurm", "job_id": "7", "user": "bob"}}, rows=rows))
    [idle] = [f for f in r.findings if f.kind is FindingKind.IDLE_GPUS]
    assert idle.text == "Slurm job 7 (bob) was allocated 4 GPUs, all 4 idle 100 % of their life"


def test_a_short_lived_or_busy_workload_is_no_finding() -> None:
    short = report_of(windows(0.5, rows=[[0, "0", 300, 0, 300, 0]]))
    busy = report_of(windows(5, rows=[[0, "0", 300, 290, 0, 0], [1, "0", 300, 200, 30, 0]]))
    assert not [f for f in short.findings + busy.findings if f.kind is FindingKind.IDLE_GPUS]


def test_a_group_with_unallocated_gpus_and_records_with_unknowns() -> None:
    gone = {"allocations": "kubelet socket not found"}
    messages = windows(6, node="i-1", gone=gone) + windows(6, node="i-2", gone=gone)
    r = report_of(messages)
    unallocated = next(f for f in r.findings if f.kind is FindingKind.UNALLOCATED)
    assert unallocated.text == (
        "group eks:prod/gpu-a: 0.2 GPUs unallocated on average over the period, 25 % of its GPU-hours"
    )
    assert unallocated.cost == pytest.approx(12 * G5_12_PER_GPU)
    unknown = next(f for f in r.findings if f.kind is FindingKind.UNKNOWN)
    assert unknown.text.startswith("allocations unknown on 2 nodes: kubelet socket not found; 48.0 GPU-h")
    assert unknown.cost == pytest.approx(48 * G5_12_PER_GPU)


def test_the_policys_price_comes_first_and_an_unknown_type_has_no_made_up_cost() -> None:
    book = PriceBook({"g5.12xlarge": 4.0})
    price = book.per_gpu_hour("g5.12xlarge", "asg:train")
    assert price is not None and (price.usd, price.source) == (1.0, PriceSource.POLICY)
    assert PriceBook().per_gpu_hour("x9.huge", "asg:train") is None
    # a type the table does not know: its GPUs from the policy for the group, never from the records
    assert PriceBook({"x9.huge": 16.0}).per_gpu_hour("x9.huge", "asg:train") is None
    known = PriceBook({"x9.huge": 16.0}, {"asg:train": 8}.get).per_gpu_hour("x9.huge", "asg:train")
    assert known is not None and known.usd == 2.0
    assert PriceBook().per_gpu_hour("p5e.48xlarge", None) is None  # no verified list price
    r = report_of(windows(2, instance_type="x9.huge"))
    assert all(t.usage.cost == 0 and t.usage.unpriced_h > 0 for t in r.teams)
    assert all(f.cost is None for f in r.findings)
    no_price = next(f for f in r.findings if f.kind is FindingKind.NO_PRICE)
    assert no_price.text.startswith("no price for x9.huge (1 node, 8.0 GPU-h): cost unknown")
    idle = next(f for f in r.findings if f.kind is FindingKind.IDLE_GPUS)
    assert idle.line().endswith("idle 99 % of its life (its instance type has no price)")


def test_every_type_in_the_table_has_its_gpus_and_the_families_the_issue_names() -> None:
    families = {t.split(".")[0].split("-")[0] for t in ON_DEMAND_US_EAST_1}
    assert {"g4dn", "g5", "g6", "g6e", "gr6", "p3", "p4d", "p4de", "p5", "p5e", "p5en", "p6"} <= families
    assert all(t.gpus in (1, 4, 8) and (t.on_demand is None or t.on_demand > 0) for t in ON_DEMAND_US_EAST_1.values())


def test_the_period_and_the_groups_select_the_records() -> None:
    inside = windows(1)
    before = [message(start=DAY0 - timedelta(minutes=5))]
    other = windows(1, group="asg:other", node="i-9")
    r = report_of(inside + before + other, selection=Selection(frozenset({"eks:prod/gpu-a"})))
    assert (r.records, r.outside) == (12, 13)
    by_cluster = report_of(inside + other, selection=Selection(clusters=frozenset({"prod"})))
    assert by_cluster.records == 12
    assert not Selection(frozenset({"asg:x"})).matches(None) and Selection().matches(None)


def test_period_last_ends_on_a_window_boundary() -> None:
    now = datetime(2026, 11, 23, 10, 7, 31, tzinfo=UTC)
    p = Period.last(timedelta(minutes=100), now)
    assert (p.start, p.end) == (datetime(2026, 11, 23, 8, 25, tzinfo=UTC), datetime(2026, 11, 23, 10, 5, tzinfo=UTC))
    assert p.hourly and not PERIOD.hourly and len(PERIOD.buckets()) == 3
    with pytest.raises(ValueError, match="ends before it starts"):
        Period(DAY0, DAY0)


def test_a_resent_record_counts_once_and_a_restarted_node_s_second_record_counts() -> None:
    """The publisher restarted 180 s into the window: its two records hold each GPU 300 s together."""
    before = message(rows=[[g, "0", 180, 100, 0, 0] for g in range(4)])
    after_restart = message(rows=[[g, "0", 120, 100, 0, 0] for g in range(4)])
    r = report_of([before, before, after_restart])
    assert (r.records, r.duplicates, r.flagged) == (2, 1, ())
    assert r.total.held_h == pytest.approx(4 * 300 / 3600)


def test_a_resend_read_after_another_slice_s_windows_still_counts_once() -> None:
    """Slices read side by side interleave a node's windows: W1, W2, then W1 again is a resend."""
    w1, w2 = message(), message(start=DAY0 + timedelta(minutes=5))
    r = report_of([w1, w2, w1])
    assert (r.records, r.duplicates) == (2, 1)


def test_the_chart_bars_cover_every_bucket_of_the_period() -> None:
    r = report_of(windows(2))
    assert {b.bucket for b in r.bars} == {datetime.fromtimestamp(b, UTC) for b in PERIOD.buckets()}
    assert sum(b.held_h for b in r.bars) == pytest.approx(r.total.held_h)


def test_sharing_the_unallocated_cost_follows_allocated_hours() -> None:
    r = report_of(windows(10), share_unallocated=True)
    shares = {t.team: t.shared for t in r.teams}
    money = 10 * G5_12_PER_GPU
    assert shares == pytest.approx({"team-a": money * 2 / 3, "alice": money / 3})
    assert r.unallocated.total_cost == pytest.approx(0.0)


# ---- properties ----

TEAMS = ["team-a", "team-b", "ml", "alice"]


@st.composite
def fleets(draw: st.DrawFn) -> list[str]:
    """A few nodes' records: random workloads, time-slicing, unallocated GPUs, unknown types, bad lines."""
    messages = []
    for node in range(draw(st.integers(1, 4))):
        itype = draw(st.sampled_from(["g5.12xlarge", "p4d.24xlarge", "x9.huge"]))
        group = draw(st.sampled_from(["asg:train", "eks:ml/infer", None]))
        for window in draw(st.lists(st.integers(0, 12 * 24 * 3 - 1), min_size=1, max_size=12, unique=True)):
            refs = {
                str(i): {"kind": "pod", "namespace": draw(st.sampled_from(TEAMS)), "pod": f"p{i}"}
                for i in range(draw(st.integers(0, 3)))
            }
            rows = []
            for gpu in range(draw(st.integers(1, 4))):
                holders = draw(st.lists(st.sampled_from([*refs, None]), min_size=1, max_size=2, unique=True))
                for ref in holders:
                    held = 300.0 / len(holders)
                    busy = draw(st.floats(0, 400))  # beyond held: clamped
                    rows.append([gpu, ref, held, busy, draw(st.floats(0, held)), draw(st.floats(0, 81920))])
            start = DAY0 + timedelta(minutes=5 * window)
            messages.append(
                message(start=start, node=f"i-{node}", instance_type=itype, group=group, workloads=refs, rows=rows)
            )
        if draw(st.booleans()):
            messages.append("{broken")
    return messages


@settings(max_examples=examples(60), deadline=None)
@given(messages=fleets(), share=st.booleans())
def test_gpu_hours_are_conserved_and_busy_stays_within_held(messages: list[str], share: bool) -> None:
    r = report_of(messages, share_unallocated=share)
    teams_held = sum(t.usage.held_h for t in r.teams) + r.unallocated.usage.held_h
    assert teams_held == pytest.approx(r.total.held_h)
    assert sum(g.seen.held_h for g in r.groups) == pytest.approx(r.total.held_h)
    assert sum(g.allocated.held_h + g.unallocated.held_h for g in r.groups) == pytest.approx(r.total.held_h)
    assert sum(w.usage.held_h for w in r.workloads) == pytest.approx(teams_held - r.unallocated.usage.held_h)
    for line in [*(t.usage for t in r.teams), r.unallocated.usage, *(w.usage for w in r.workloads), r.total]:
        assert line.busy_h <= line.held_h + 1e-9 and line.idle_h <= line.held_h + 1e-9
    priced = sum(t.usage.cost for t in r.teams) + r.unallocated.usage.cost
    assert priced == pytest.approx(r.total.cost)


@settings(max_examples=examples(60), deadline=None)
@given(messages=fleets())
def test_sharing_the_unallocated_cost_keeps_the_total(messages: list[str]) -> None:
    plain, shared = report_of(messages), report_of(messages, share_unallocated=True)
    total = sum(t.total_cost for t in shared.teams) + shared.unallocated.total_cost
    assert total == pytest.approx(plain.total.cost)
    assert sum(t.shared for t in shared.teams) == pytest.approx(-shared.unallocated.shared)
    assert all(t.shared >= 0 for t in shared.teams)


@settings(max_examples=examples(60), deadline=None)
@given(messages=fleets())
def test_findings_are_ranked_by_money_unknown_money_last(messages: list[str]) -> None:
    costs = [f.cost for f in report_of(messages).findings]
    known = [c for c in costs if c is not None]
    assert costs == [*known, *([None] * (len(costs) - len(known)))]
    assert known == sorted(known, reverse=True)


@settings(max_examples=examples(40), deadline=None)
@given(messages=fleets(), seed=st.integers(0, 1000))
def test_the_order_records_arrive_in_does_not_matter(messages: list[str], seed: int) -> None:
    shuffled = list(messages)
    random.Random(seed).shuffle(shuffled)
    a, b = report_of(messages), report_of(shuffled)
    assert (a.records, a.total.held_h, a.total.cost) == pytest.approx((b.records, b.total.held_h, b.total.cost))
    found = [sorted((f.kind, f.subject, f.cost or 0.0) for f in r.findings) for r in (a, b)]
    assert [f[:2] for f in found[0]] == [f[:2] for f in found[1]]
    assert [f[2] for f in found[0]] == pytest.approx([f[2] for f in found[1]])
