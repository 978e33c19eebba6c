"""A drain gpufleet asked of Slurm that never shows in Slurm's report (the publisher run without
--marks-table, scontrol failing) keeps the node for good: that is told once, with what to check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.domain.slurm_report import SlurmWord, late_drains

NOW = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)


def test_a_drain_not_landed_after_five_minutes_is_told_once() -> None:
    word = SlurmWord(idle={"i-a", "i-b", "i-c"}, removable={"i-c"})
    asked = {"i-a": NOW - timedelta(minutes=6), "i-b": NOW - timedelta(minutes=2), "i-c": NOW - timedelta(minutes=9)}
    told: set[str] = set()
    [line] = late_drains(word, asked, NOW, told)
    assert line.startswith("i-a: Slurm drain asked at 09:24 UTC, not in Slurm's report yet")
    assert "--marks-table" in line
    assert late_drains(word, asked, NOW + timedelta(minutes=1), told) == []  # once
