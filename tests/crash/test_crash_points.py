"""Every action scenario, with the k-th AWS call failing (error, or lost answer after the effect) for every
k: invariant violations must be 0. The figures (scenarios x call indexes tried) are printed and written
to .pytest-crash-points.json for the README's reliability section."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rehearsal.slack import slack_receiver
from tests.conftest import ROOT
from tests.crash import scenarios as s
from tests.crash.harness import Run, World, sweep
from tests.crash.hyperpod_scenario import HyperPodAttrition, HyperPodScaleIn

NOW = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
SUMMARY = ROOT / ".pytest-crash-points.json"


@pytest.fixture(scope="module")
def slack() -> Iterator[object]:
    with slack_receiver() as receiver:
        yield receiver


def builders(tmp: Path, endpoint: str, slack: object) -> dict[str, Callable[[], World]]:
    return {
        "alarm scale-out": lambda: s.AlarmScaleOut(tmp),
        "scale-in, two victims": lambda: s.ScaleInTwoVictims(tmp, NOW),
        "scale-in, work lands on a victim between attempts": lambda: s.ScaleInWorkLands(tmp, NOW),
        "schedule window": lambda: s.ScheduleWindow(tmp),
        "demand scale-out (job queue)": lambda: s.DemandScaleOut(tmp),
        "queue scale-in (a job in flight, its runner protected)": lambda: s.QueueScaleIn(tmp, NOW),
        "fallback raise": lambda: s.FallbackRaise(tmp, NOW, endpoint),
        "fallback hand-back": lambda: s.FallbackHandBack(tmp, NOW),
        "OOM replacement": lambda: s.OomReplacement(tmp, NOW),
        "spot interruption: replace early, hand back": lambda: s.InterruptionReplacement(tmp, NOW),
        "notifier post to Slack + SNS": lambda: s.NotifierPost(tmp, NOW, slack),
        "hyperpod scale-in (idle nodes by id, a job's node kept)": lambda: HyperPodScaleIn(tmp, NOW),
        "hyperpod attrition (Slurm drain asked, idle nodes removed once drained)": lambda: HyperPodAttrition(tmp, NOW),
    }


SCENARIOS = [
    "alarm scale-out",
    "scale-in, two victims",
    "scale-in, work lands on a victim between attempts",
    "schedule window",
    "demand scale-out (job queue)",
    "queue scale-in (a job in flight, its runner protected)",
    "fallback raise",
    "fallback hand-back",
    "OOM replacement",
    "spot interruption: replace early, hand back",
    "notifier post to Slack + SNS",
    "hyperpod scale-in (idle nodes by id, a job's node kept)",
    "hyperpod attrition (Slurm drain asked, idle nodes removed once drained)",
]


@pytest.mark.integration
@pytest.mark.parametrize("name", SCENARIOS)
def test_no_crash_point_breaks_an_invariant(name: str, aws: str, tmp_path: Path, slack: object) -> None:
    runs: list[Run] = sweep(name, builders(tmp_path, aws, slack)[name], NOW, aws)
    clean, faulted = runs[0], runs[1:]
    assert clean.violations == [], f"{name} fails without any fault: {clean.violations}"
    assert clean.calls > 0 and len(faulted) == 2 * clean.calls
    broken = [f"k={r.at} {r.mode} ({r.fired}): {v}" for r in faulted for v in r.violations]
    summary = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    summary[name] = {"calls": clean.calls, "runs": len(faulted), "violations": len(broken)}
    SUMMARY.write_text(json.dumps(summary, indent=1))
    print(f"\ncrash points: {name}: {clean.calls} calls x 2 faults = {len(faulted)} runs, {len(broken)} violations")
    assert broken == [], "\n".join(broken)
