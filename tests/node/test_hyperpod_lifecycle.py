"""The HyperPod lifecycle scripts (ami/hyperpod/): syntax, then each run into a scratch root from a bundle
laid out as stage_bundle.sh makes it (no wheels: --no-deps), and the controller's timer command run as
written, with a fake squeue and sinfo on PATH. Python >= 3.9."""

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hyperpod_config import RESOURCE_CONFIG

REPO = Path(__file__).resolve().parents[2]
HYPERPOD = REPO / "ami" / "hyperpod"
SCRIPTS = sorted(HYPERPOD.glob("*.sh"))
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def bundle(tmp_path: Path) -> Path:
    """What stage_bundle.sh lays out, without the wheels."""
    b = tmp_path / "lifecycle" / "gpufleet"
    (b / "ami").mkdir(parents=True)
    (b / "layers" / "node").mkdir(parents=True)
    for name in ("install.sh", "publisher.json", "slurm_pending_gpus.py"):
        shutil.copy(REPO / "ami" / name, b / "ami" / name)
    for unit in (REPO / "ami").glob("*.service"):
        shutil.copy(unit, b / "ami" / unit.name)
    for unit in (REPO / "ami").glob("*.path"):
        shutil.copy(unit, b / "ami" / unit.name)
    shutil.copytree(REPO / "layers" / "node" / "gpufleet_node", b / "layers" / "node" / "gpufleet_node")
    shutil.copy(REPO / "layers" / "node" / "requirements.txt", b / "layers" / "node" / "requirements.txt")
    return b


def run(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_scripts_parse_and_say_their_usage(script: Path) -> None:
    assert run("-n", str(script)).returncode == 0
    if script.name.startswith("install_"):
        out = run(str(script), "--help")
        assert out.returncode == 0 and "Usage:" in out.stdout


def test_worker_installs_the_publisher_with_its_instance_group_source(tmp_path: Path) -> None:
    b, root = bundle(tmp_path), tmp_path / "root"
    config = tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    script = HYPERPOD / "install_gpufleet_worker.sh"
    out = run(str(script), "--bundle", str(b), "--root", str(root), "--resource-config", str(config), "--no-deps")
    assert out.returncode == 0, out.stderr
    assert (root / "opt/gpufleet/lib/gpufleet_node/identity.py").exists()
    assert json.loads((root / "var/lib/gpufleet/resource_config.json").read_text()) == RESOURCE_CONFIG
    assert stat.S_IMODE((root / "var/lib/gpufleet/resource_config.json").stat().st_mode) == 0o644
    publisher = json.loads((root / "etc/gpufleet/publisher.json").read_text())
    assert publisher["hyperpod_resource_config"] == "/var/lib/gpufleet/resource_config.json"
    dropin = (root / "etc/systemd/system/gpufleet-publisher.service.d/hyperpod.conf").read_text()
    [exec_start] = [line for line in dropin.splitlines() if line.startswith("ExecStart=") and len(line) > 10]
    python = exec_start.split("=", 1)[1].split()[0]
    assert subprocess.run([python, "-c", "import sys; sys.exit(sys.version_info < (3, 9))"]).returncode == 0
    assert "PATH=/opt/slurm/bin:" in dropin


def test_worker_without_a_bundle_stops_with_one_line(tmp_path: Path) -> None:
    script = HYPERPOD / "install_gpufleet_worker.sh"
    out = run(str(script), "--bundle", str(tmp_path / "none"), "--root", str(tmp_path / "root"), "--no-deps")
    assert out.returncode == 1 and "bundle incomplete" in out.stderr


def fake_slurm(bin_dir: Path) -> None:
    bin_dir.mkdir()
    scripts = {
        "squeue": "echo '5001|2|2|train|N/A|gres/gpu:8|N/A'",
        "sinfo": "printf 'ip-10-1-28-64|idle\\nip-10-1-28-65|mixed\\n'",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text("#!/bin/sh\n%s\n" % body)
        path.chmod(0o755)


def test_controller_installs_a_minutely_timer_whose_command_publishes(tmp_path: Path) -> None:
    b, root = bundle(tmp_path), tmp_path / "root"
    config = tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    script = HYPERPOD / "install_gpufleet_controller.sh"
    out = run(str(script), "--group", "gpu-a=train", "--group", "gpu-b", "--bundle", str(b), "--root", str(root),
              "--resource-config", str(config), "--no-deps")  # fmt: skip
    assert out.returncode == 0, out.stderr
    units = root / "etc/systemd/system"
    assert "OnCalendar=*-*-* *:*:00" in (units / "gpufleet-slurm-backlog.timer").read_text()
    service = (units / "gpufleet-slurm-backlog.service").read_text()
    [exec_start] = [line for line in service.splitlines() if line.startswith("ExecStart=")]
    argv = shlex.split(exec_start.split("=", 1)[1])
    assert argv[2:] == ["--hyperpod", "ml-cluster:gpu-a=train", "--hyperpod", "ml-cluster:gpu-b",
                        "--region", "us-west-2", "--resource-config", str(config),
                        "--node-cache", "/var/lib/gpufleet/hyperpod_nodes.json"]  # fmt: skip
    assert "StateDirectory=gpufleet" in service  # the node id cache's directory, writable under ProtectSystem
    assert not (units / "gpufleet-imds-guard.service").exists()  # opt-in only
    fake_slurm(tmp_path / "bin")
    env = dict(os.environ, PATH="%s%s%s" % (tmp_path / "bin", os.pathsep, os.environ.get("PATH", "")))
    installed = root / "opt/gpufleet/bin/slurm_pending_gpus.py"
    dry = subprocess.run([sys.executable, str(installed), *argv[2:-2], "--dry-run"],  # no cache written here
                         capture_output=True, text=True, env=env, timeout=30)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [
        "Slurm/${aws:userid}/PendingGPUs ClusterName=ml-cluster InstanceGroupName=gpu-a: 16",
        "Slurm/${aws:userid}/PendingGPUs ClusterName=ml-cluster InstanceGroupName=gpu-b: 0",
        "Slurm/${aws:userid}/IdleNode ClusterName=ml-cluster InstanceGroupName=gpu-a InstanceId=i-0a1: 1",
    ]


def test_controller_can_block_imds_for_every_user_but_root(tmp_path: Path) -> None:
    """docs/security.md: a user of the controller node could read its role's credentials from IMDS and put
    IdleNode=1 for a busy node; the opt-in guard rejects IMDS for every uid but root and those allowed."""
    b, root = bundle(tmp_path), tmp_path / "root"
    config = tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    out = run(str(HYPERPOD / "install_gpufleet_controller.sh"), "--group", "gpu-a", "--bundle", str(b),
              "--root", str(root), "--resource-config", str(config), "--no-deps", "--block-imds-for-users",
              "--imds-allow-user", "cwagent")  # fmt: skip
    assert out.returncode == 0, out.stderr
    unit = (root / "etc/systemd/system/gpufleet-imds-guard.service").read_text()
    rules = [line.split("|| ", 1)[1].rstrip("'") for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert rules == [
        "iptables -A OUTPUT -d 169.254.169.254 -m owner --uid-owner root -j ACCEPT",
        "iptables -A OUTPUT -d 169.254.169.254 -m owner --uid-owner cwagent -j ACCEPT",
        "iptables -A OUTPUT -d 169.254.169.254 -j REJECT",
        "ip6tables -A OUTPUT -d fd00:ec2::254 -m owner --uid-owner root -j ACCEPT",
        "ip6tables -A OUTPUT -d fd00:ec2::254 -m owner --uid-owner cwagent -j ACCEPT",
        "ip6tables -A OUTPUT -d fd00:ec2::254 -j REJECT",
    ]
    assert all(line.startswith("ExecStart=/bin/sh") for line in unit.splitlines() if "iptables -C" in line[:40])


def test_controller_needs_a_group(tmp_path: Path) -> None:
    out = run(str(HYPERPOD / "install_gpufleet_controller.sh"), "--root", str(tmp_path), "--no-deps")
    assert out.returncode == 2 and "--group" in out.stderr
