"""ami/install.sh for real into a temporary root, and the systemd unit checked by systemd-analyze."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("ami-root")
    proc = subprocess.run(
        ["bash", str(REPO / "ami" / "install.sh"), "--root", str(root), "--no-deps"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return root


def test_layout(root):
    assert (root / "opt/gpufleet/lib/gpufleet_node/__main__.py").is_file()
    assert (root / "etc/gpufleet/publisher.json").is_file()
    unit = (root / "etc/systemd/system/gpufleet-publisher.service").read_text()
    assert "Restart=always" in unit and "DeviceAllow=char-nvidia-frontend rw" in unit
    assert "ExecStart=/usr/bin/python3 -m gpufleet_node --config /etc/gpufleet/publisher.json" in unit
    assert not list((root / "opt/gpufleet/lib").rglob("__pycache__"))


def test_reinstall_keeps_an_edited_config(root):
    config = root / "etc/gpufleet/publisher.json"
    config.write_text('{"high_resolution": true}')
    subprocess.run(["bash", str(REPO / "ami" / "install.sh"), "--root", str(root), "--no-deps"], check=True)
    assert config.read_text() == '{"high_resolution": true}'


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not available here")
def test_unit_passes_systemd_analyze_verify(root):
    proc = subprocess.run(
        ["systemd-analyze", "verify", str(root / "etc/systemd/system/gpufleet-publisher.service")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Unknown key" not in proc.stderr and "Unknown lvalue" not in proc.stderr


def test_installed_package_runs_and_says_clearly_there_is_no_driver(root, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(root / "opt/gpufleet/lib"), LD_LIBRARY_PATH=str(tmp_path))
    config = tmp_path / "publisher.json"
    config.write_text("{}")
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet_node", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        check=False,
    )
    assert proc.returncode == 3
    assert len(proc.stderr.strip().splitlines()) == 1


def test_help_says_what_it_installs_and_changes_nothing(tmp_path):
    proc = subprocess.run(
        ["bash", str(REPO / "ami" / "install.sh"), "--help"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout.startswith("Usage: install.sh")
    assert "/opt/gpufleet/lib" in proc.stdout and "--no-deps" in proc.stdout
    wrong = subprocess.run(
        ["bash", str(REPO / "ami" / "install.sh"), "--root", str(tmp_path), "--bogus"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode == 2 and "see --help" in wrong.stderr and list(tmp_path.iterdir()) == []
