"""ami/install.sh installs `gpufleet-node` (the busy helper's console command) beside the publisher."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_gpufleet_node_command_is_installed_and_runs(tmp_path: Path) -> None:
    root = tmp_path / "root"
    subprocess.run(["bash", str(REPO / "ami" / "install.sh"), "--root", str(root), "--no-deps"], check=True)
    wrapper = root / "usr/local/bin/gpufleet-node"
    assert os.access(str(wrapper), os.X_OK)
    text = wrapper.read_text()
    assert "PYTHONPATH=/opt/gpufleet/lib" in text and 'exec /usr/bin/python3 -m gpufleet_node.cli "$@"' in text
    assert (root / "etc/tmpfiles.d/gpufleet-busy.conf").read_text().split() == [
        "d",
        "/run/gpufleet-busy",
        "0777",
        "root",
        "root",
        "-",
    ]
    # What the wrapper runs, from the installed copy: `busy` without a command is a usage error.
    env = dict(os.environ, PYTHONPATH=str(root / "opt/gpufleet/lib"))
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_node.cli", "busy"], env=env, capture_output=True, text=True, cwd=str(tmp_path)
    )
    assert proc.returncode == 2 and "no command given" in proc.stderr
    helped = subprocess.run(
        [sys.executable, "-m", "gpufleet_node.cli", "busy", "--help"], env=env, capture_output=True, text=True
    )
    assert helped.returncode == 0 and "scale-in" in helped.stdout
