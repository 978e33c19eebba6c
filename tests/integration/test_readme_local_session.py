"""The docs' local session (docs/cli.md, "Local invoke without Docker"), run verbatim: the lines between
its local-session markers, in one bash session at the checkout's root, with no AWS credentials or endpoint
in the environment beforehand. They must bring up the stack, pass the doctor, scale the example group
through the template's rule, explain it, and leave nothing running."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SESSION_PAGE = ROOT / "docs" / "cli.md"
pytestmark = pytest.mark.integration


def documented_session() -> list[str]:
    text = SESSION_PAGE.read_text()
    block = text.split("<!-- local-session:start -->\n```sh\n")[1].split("```\n<!-- local-session:end -->")[0]
    return [line for line in block.splitlines() if line.strip()]


def run_session(lines: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """`lines` in one `bash -e` at the checkout's root, with no AWS credentials or endpoint in the
    environment beforehand; a run that fails still leaves nothing running."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GPUFLEET_"))}
    env.update(HOME=str(home), POWERTOOLS_METRICS_DISABLED="true")
    try:
        return subprocess.run(
            ["bash", "-e", "-c", "\n".join(lines)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        if (ROOT / ".gpufleet-local").exists():  # a failed run must not leave moto behind
            subprocess.run([str(ROOT / ".venv/bin/gpufleet"), "local", "down"], cwd=ROOT, check=False)


def test_the_documented_local_session_runs_verbatim(tmp_path: Path) -> None:
    lines = documented_session()
    assert lines[0].startswith('eval "$(.venv/bin/gpufleet local up') and lines[-1].endswith("local down")
    proc = run_session(lines, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "0 error(s), 0 warning(s)" in proc.stdout
    assert "delivered to scaler (rule AlarmStateChange)" in proc.stderr
    assert "delivered 1 queued notification(s) to notifier" in proc.stderr
    assert "alarm gpufleet-train-gpu-high in ALARM: scale out 2 -> 4" in proc.stdout
    assert "local stack stopped" in proc.stderr and not (ROOT / ".gpufleet-local").exists()
