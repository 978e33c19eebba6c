"""The replay's outputs tell the truth: the plot's pending panel scales to the ranked runs, and `gpufleet
replay` prints the pods that never fit (gpufleet_tools.replay.plot draws with matplotlib; the command line
writes files). The replay itself: tests/unit/replay/test_truth.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet_tools.replay.plot import legend_label, pending_limit
from tests.unit.replay.conftest import V2023_CSV
from tests.unit.replay.test_truth import _outcome


def test_the_pending_panel_ignores_a_run_that_is_not_ranked_and_labels_it_clipped() -> None:
    runs = [
        _outcome("gpufleet", [0.0, 10.0, 4.0]),
        _outcome("cluster-autoscaler", [0.0, 20.0, 0.0]),
        _outcome("asg-target-tracking", [50.0, 900.0, 2000.0], "cannot start at min 0: no metric without capacity"),
    ]
    limit = pending_limit(runs)
    assert limit == pytest.approx(22.0)  # the ranked runs' highest, with headroom: not 2,000
    assert legend_label(runs[0], limit) == "gpufleet"
    assert legend_label(runs[2], limit) == (
        "asg-target-tracking (not ranked: cannot start at min 0: no metric without capacity; clipped)"
    )
    assert pending_limit(runs[:2]) is None  # every run ranked: matplotlib scales as before


def test_gpufleet_replay_prints_the_pods_that_never_fit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpufleet_tools.cli import main

    trace, out = tmp_path / "pods.csv", tmp_path / "out"
    trace.write_text(V2023_CSV)
    args = ["replay", "--trace", str(trace), "--out", str(out), "--no-progress", "--gpus-per-node", "4"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "\n1 pods never fit a node of 4 GPUs (" in printed  # the 8-GPU pod: counted, not dropped
    doc = json.loads((out / "report.json").read_text())
    assert doc["pods"] == 3 and doc["never_fit"]["pods"] == 1
    assert doc["never_fit"]["gpu_hours"] == round(8 * 120 / 60, 2)  # 7,200 s of 8 GPUs
    assert (out / "capacity.png").exists()
