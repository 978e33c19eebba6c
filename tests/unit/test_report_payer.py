"""Issue 41 (part 3): who pays is part of what a record says. A Slurm job's key is `slurm:<job>` and a
unit's `unit:<name>`, but the payer is the job's user (account, partition with --by) and the unit's user:
a resend is the same content, payer included, and one workload key billed to two payers is two lines.

The forger's record: the node's own window, predicted (an idle-allocated GPU is held 300 s, busy 0, idle
300, peak 0 in every window), with only the payer changed, written first into the node's stream. Before:
the node's own records were dropped as resends and 16.0 GPU-h moved alice -> mallory (--by team), nlp ->
finance (--by account). Now both records of each window are a flagged conflict and neither is billed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from gpufleet_tools.report.identity import identify_by
from gpufleet_tools.report.model import FlagKind, Period, Report
from gpufleet_tools.report.records import RecordParser
from gpufleet_tools.report.render import table
from gpufleet_tools.report.usage import UsageSums
from tests.unit.test_report_records import message
from tests.unit.test_report_usage import DAY0

PERIOD = Period(DAY0, DAY0 + timedelta(hours=6))
ALICE = {"kind": "slurm", "job_id": "4242", "user": "alice", "account": "nlp", "partition": "gpu"}
MALLORY = {**ALICE, "user": "mallory", "account": "finance"}
VLLM = {"kind": "unit", "unit": "vllm.service", "user": "bob"}
IDLE_ROWS = [[g, "0", 300, 0, 300, 0] for g in range(4)]  # idle-allocated: what each window says
Event = tuple[str, int, str]


def window(w: int, workload: dict[str, Any], node: str = "i-s") -> Event:
    at = DAY0 + timedelta(minutes=5 * w)
    text = message(start=at, node=node, group="hyperpod:ml/gpu-a", workloads={"0": workload}, rows=IDLE_ROWS)
    return node, int(at.timestamp() * 1000), text


def report(events: list[Event], by: str = "team") -> Report:
    """In FilterLogEvents' order: by timestamp, then as ingested (a pre-written window comes first)."""
    sums, parser = UsageSums(PERIOD), RecordParser(identify_by(by))
    for stream, stamp, text in sorted(events, key=lambda e: e[1]):
        sums.add(parser.parse(text, stream, stamp))
    return sums.report()


def teams(r: Report) -> dict[str, float]:
    return {t.team: t.usage.held_h for t in r.teams}


def honest(workload: dict[str, Any] = ALICE) -> list[Event]:
    return [window(w, workload) for w in range(48)]  # 4 h of 4 GPUs: 16.0 GPU-h


@pytest.mark.parametrize(("by", "payer", "forged"), [("team", "alice", "mallory"), ("account", "nlp", "finance")])
def test_a_prewritten_window_with_only_the_payer_changed_is_a_conflict_not_a_resend(
    by: str, payer: str, forged: str
) -> None:
    assert teams(report(honest(), by)) == {payer: pytest.approx(16.0)}
    r = report([*(window(w, MALLORY) for w in range(48)), *honest()], by)
    assert forged not in teams(r) and payer not in teams(r) and r.total.held_h == 0
    assert r.duplicates == 0
    [flag] = r.flagged
    assert (flag.kind, flag.stream, flag.records) == (FlagKind.CONFLICT, "i-s", 96)
    assert flag.claimed_h == pytest.approx(32.0) and "neither counted" in flag.detail


def test_a_unit_resent_with_another_user_is_a_conflict() -> None:
    r = report([*(window(w, {**VLLM, "user": "mallory"}) for w in range(48)), *honest(VLLM)])
    assert teams(r) == {} and [(f.kind, f.records) for f in r.flagged] == [(FlagKind.CONFLICT, 96)]


def test_only_the_account_changed_is_a_conflict_whatever_the_report_is_by() -> None:
    """--by team does not bill the account, but the record says it: the flagged set does not depend on --by."""
    moved = [window(w, {**ALICE, "account": "finance"}) for w in range(48)]
    for by in ("team", "account", "partition"):
        r = report([*moved, *honest()], by)
        assert r.total.held_h == 0 and r.flagged_records == 96, by


def test_one_record_elsewhere_naming_the_job_with_another_payer_does_not_take_the_job() -> None:
    """Before: a workload's team was the first one read for its key, so one forged record of job 4242
    (in a window the node did not write, on an id of the forger's own) moved all 16.0 GPU-h of the job.
    Now each (workload, payer) is its own line: the forger's record bills only what it claims itself."""
    forged = window(0, MALLORY, node="i-f")  # on an id of the forger's own, read first
    r = report([forged, *honest()], "team")
    assert teams(r) == {"alice": pytest.approx(16.0), "mallory": pytest.approx(4 * 300 / 3600)}
    lines = sorted((w.workload.label, w.workload.team, round(w.usage.held_h, 3)) for w in r.workloads)
    assert lines == [("Slurm job 4242 (alice)", "alice", 16.0), ("Slurm job 4242 (mallory)", "mallory", 0.333)]
    note = "note: slurm:4242 is billed to 2 payers: alice, mallory (its records disagree on who pays)"
    assert note in table(r).splitlines()
