"""The report's formats: the terminal table, Markdown, CSV (parses, every line), JSON (every number) and
the chart's series (the PNG drawn from it: tests/adapters/test_report_png.py)."""

from __future__ import annotations

import csv
import io
import json
from datetime import timedelta

import pytest

from gpufleet_node.schema import TEAM_UNALLOCATED
from gpufleet_tools.report.model import Period
from gpufleet_tools.report.render import (
    BAR_WIDTH,
    CSV_COLUMNS,
    OTHER,
    Format,
    chart_series,
    csv_text,
    json_doc,
    markdown,
    money,
    render,
    table,
)
from tests.unit.test_report_records import message
from tests.unit.test_report_usage import DAY0, PERIOD, report_of, windows


@pytest.mark.parametrize(
    ("cost", "unpriced", "shown"),
    [(1234.5, 0, "$1,234.50"), (0, 3, "unknown"), (12, 3, "$12.00 + ?"), (-5, 0, "-$5.00"), (0, 0, "$0.00")],
)
def test_money(cost: float, unpriced: float, shown: str) -> None:
    assert money(cost, unpriced) == shown


def test_the_table_has_teams_workloads_groups_findings_and_notes() -> None:
    text = table(report_of(windows(10)))
    for heading in ("TEAMS", "WORKLOADS (top 2 by cost)", "GROUPS", "FINDINGS (by money)"):
        assert heading in text
    lines = text.splitlines()
    assert lines[0] == f"GPU usage {PERIOD.describe()}, all groups"
    assert lines[1] == "120 usage records from 1 node"
    assert any(line.startswith(TEAM_UNALLOCATED) and line.endswith("$14.18") for line in lines)
    assert "  2. pod team-a/trainer-0 (main) requested 2 GPUs, one idle 99 % of its life: $14.04" in lines
    assert "note: idle: utilization <= 5 %; busy: utilization-weighted GPU-hours" in lines


def test_the_table_says_so_when_there_is_nothing() -> None:
    text = table(report_of([]))
    assert "no usage records in this period" in text and "TEAMS" not in text


def test_top_cuts_the_workloads_and_says_how_many_more() -> None:
    text = table(report_of(windows(10)), top=1)
    assert "WORKLOADS (top 1 by cost)" in text and "... 1 more (--top N, or --format csv for all)" in text


def test_shared_unallocated_columns() -> None:
    text = table(report_of(windows(10), share_unallocated=True))
    assert "+ unallocated" in text and "-$14.18" in text


def test_csv_has_a_row_for_every_line_and_parses() -> None:
    r = report_of(windows(10), share_unallocated=True)
    rows = list(csv.DictReader(io.StringIO(csv_text(r))))
    assert tuple(rows[0]) == CSV_COLUMNS
    sections = [row["section"] for row in rows]
    assert sections.count("team") == 2 and sections.count("workload") == 2 and "unallocated" in sections
    assert sections.count("group") == 1 and sections.count("total") == 1 and "finding" in sections
    total = next(row for row in rows if row["section"] == "total")
    assert float(total["gpu_hours_held"]) + float(total["gpu_hours_unallocated"]) == pytest.approx(40.0)
    assert sum(float(row["shared_unallocated_usd"]) for row in rows if row["section"] == "team") == pytest.approx(
        14.18, abs=0.01
    )


def test_json_holds_every_number() -> None:
    r = report_of(windows(10))
    doc = json.loads(render(r, Format.JSON))
    assert doc == json_doc(r)
    assert doc["total"]["gpu_hours_held"] == pytest.approx(40.0)
    assert {t["team"] for t in doc["teams"]} == {"team-a", "alice"}
    assert doc["workloads"][0]["label"] == "team-a/trainer-0 (main)"
    assert doc["prices"] == [
        {"instance_type": "g5.12xlarge", "gpus": 4, "usd_per_gpu_hour": 1.418, "source": "table"},
    ]
    assert len(doc["series"]) == 3 * 3  # 3 days x (2 teams + unallocated)


def test_json_says_an_unknown_cost_is_null() -> None:
    doc = json_doc(report_of(windows(2, instance_type="x9.huge")))
    assert doc["total"]["cost_usd"] is None and doc["total"]["unpriced_gpu_hours"] == pytest.approx(8.0)


def test_markdown_tables() -> None:
    text = markdown(report_of(windows(10)))
    assert text.startswith("# GPU usage report\n")
    assert "| team | workloads | GPU-h held |" in text and "|---|---:|" in text
    assert "## Findings (by money)" in text


def test_chart_series_folds_small_teams_into_other_and_keeps_every_hour() -> None:
    refs = {str(i): {"kind": "user", "user": f"u{i}"} for i in range(5)}
    rows = [[i, str(i), 300, 100 * i, 0, 0] for i in range(5)] + [[5, None, 300, 0, 300, 0]]
    r = report_of(windows(3, workloads=refs, rows=rows, gpus=8, instance_type="g5.48xlarge"))
    s = chart_series(r, max_teams=2)
    assert s.teams[-2:] == (OTHER, TEAM_UNALLOCATED) and len(s.teams) == 4
    held = sum(sum(v) for v in s.held.values())
    assert held == pytest.approx(r.total.held_h)
    assert len(s.buckets) == 3 and not s.hourly and "per day" in s.title


# ---- the chart: a partial bucket drawn as the part it is (issue 29) ----


def test_a_partial_last_hour_is_drawn_as_its_part_at_its_rate_not_as_a_smaller_whole_hour() -> None:
    """Steady usage (4 GPUs) for 2.5 hours: the third hour holds half as many GPU-hours, because the
    period covers half of it. The old chart drew 4, 4, 2 on full-width bars: usage seemed to halve."""
    period = Period(DAY0, DAY0 + timedelta(hours=2, minutes=30))
    s = chart_series(report_of(windows(2.5), period=period))
    held = [sum(s.held[t][i] for t in s.teams) for i in range(3)]
    assert held == pytest.approx([4.0, 4.0, 2.0])  # the GPU-hours, as summed
    drawn = [sum(s.rate(s.held[t])[i] for t in s.teams) for i in range(3)]
    assert drawn == pytest.approx([4.0, 4.0, 4.0])  # the heights: GPU-hours per whole hour
    assert [s.partial(i) for i in range(3)] == [False, False, True]
    assert s.bar(0) == pytest.approx((-BAR_WIDTH / 2, BAR_WIDTH))
    assert s.bar(2) == pytest.approx((2 - BAR_WIDTH / 2, BAR_WIDTH / 2))  # half as wide, on the left of its slot
    areas = [h * s.bar(i)[1] / BAR_WIDTH for i, h in enumerate(drawn)]
    assert areas == pytest.approx(held)  # a bar's area is still its GPU-hours


def test_a_partial_first_hour_lies_on_the_right_of_its_slot() -> None:
    start = DAY0 + timedelta(minutes=45)
    period = Period(start, DAY0 + timedelta(hours=2))
    r = report_of([message(start=start + timedelta(minutes=5 * i)) for i in range(15)], period=period)
    s = chart_series(r)
    assert s.bar(0) == pytest.approx((BAR_WIDTH / 4, BAR_WIDTH / 4))  # the last quarter of 00:00
    assert sum(s.rate(s.held[t])[0] for t in s.teams) == pytest.approx(4.0)
    assert [b["covered"] for b in json_doc(r)["series"] if b["team"] == "alice"] == [0.25, 1.0]
