"""docs/local-fleet.md, run verbatim: every `sh` block of the page, in order, in one bash session at the
checkout's root (the machinery of the README's local session). A new user's own fleet on the local
stack: a node group with its backing ASG, a waiting pod doctor reads, an alarm that scales the group,
and what on-call gets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.integration.test_readme_local_session import ROOT, run_session

PAGE = ROOT / "docs" / "local-fleet.md"
pytestmark = pytest.mark.integration


def shell_blocks() -> list[str]:
    """The page's ```sh blocks, joined in order, line by line (a heredoc's body included)."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", PAGE.read_text(), flags=re.MULTILINE | re.DOTALL)
    return [line for block in blocks for line in block.splitlines()]


def test_the_local_fleet_page_runs_verbatim(tmp_path: Path) -> None:
    lines = shell_blocks()
    assert lines[0].startswith('eval "$(.venv/bin/gpufleet local up') and lines[-1].endswith("local down")
    proc = run_session(lines, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eks:ml/infer-gpu: backing ASG eks-" in proc.stderr
    assert "ok      eks:ml/infer-gpu: demand source cluster ml: the API answers: 1 pod(s) waiting" in proc.stdout
    assert "delivered to scaler (rule AlarmStateChange)" in proc.stderr
    assert "[emulated EKS] ml/infer-gpu: backing ASG 1 -> 2" in proc.stderr
    assert "-> UpdateNodegroupConfig ml/infer-gpu desiredSize = 2" in proc.stdout
    assert "== gpufleet [INFO] eks:ml/infer-gpu: scaled 1 -> 2" in proc.stdout
    assert "1 message(s) to on-call" in proc.stderr
    assert "local stack stopped" in proc.stderr and not (ROOT / ".gpufleet-local").exists()
