"""`python -m bench --quick`: every benchmark's code path at small sizes, so `make bench` cannot rot unnoticed
(an import error or an API change fails here). The numbers are never checked: only that it completes and
that every section printed a table row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import SECTIONS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
def test_every_benchmark_runs_in_quick_mode() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for line in proc.stdout.splitlines():
        if line.startswith("## "):
            current = sections.setdefault(line[3:], [])
        elif line.startswith("|") and not line.startswith("|---"):
            current.append(line)
    for heading, _ in SECTIONS:
        assert heading in sections, f"section {heading!r} missing from:\n{proc.stdout[-4000:]}"
        # a header row and at least one result row
        assert len(sections[heading]) >= 2, f"section {heading!r} printed no result:\n{proc.stdout[-4000:]}"
