"""ami/slurm_pending_gpus.py (Python >= 3.9): squeue's pending jobs -> the GPUs they ask for -> one datum."""

import importlib.util
import subprocess
from pathlib import Path

import pytest

from fakes import FakeCloudWatch

SCRIPT = Path(__file__).resolve().parents[2] / "ami" / "slurm_pending_gpus.py"
_spec = importlib.util.spec_from_file_location("slurm_pending_gpus", SCRIPT)
slurm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slurm)  # type: ignore[union-attr]

# What `squeue --states=PENDING --noheader --format=%i|%D|%b|%P` prints (Slurm 23.x shows gres/gpu:N).
SQUEUE = """\
4101|2|gres/gpu:8|gpu
4102|1|gres/gpu:a100:4|gpu
4103|1|N/A|cpu
4104|1|gres/gpu:2,gres/shard:1|gpu,debug
4105|1|gpu:1|debug
4106_[1-4]|1|gres:gpu:1|gpu
not a line
"""


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [("gpu:4", 4), ("gpu:a100:2", 2), ("gres/gpu:8", 8), ("gres:gpu:a100:8", 8), ("N/A", 0), ("(null)", 0),
     ("gres/gpu:2,gres/shard:1", 2), ("gpu:a100:2,gpu:v100:1", 3), ("shard:4", 0)],
)  # fmt: skip
def test_gpus_per_node_from_gres(gres: str, gpus: int) -> None:
    assert slurm.gpus_per_node(gres) == gpus


def test_pending_gpus_counts_gres_times_nodes_and_filters_partitions() -> None:
    lines = SQUEUE.splitlines()
    assert slurm.pending_gpus(lines) == 16 + 4 + 0 + 2 + 1 + 1
    assert slurm.pending_gpus(lines, ["gpu"]) == 16 + 4 + 2 + 1
    assert slurm.pending_gpus(lines, ["debug"]) == 2 + 1


def test_one_datum_on_the_groups_dimension() -> None:
    cw = FakeCloudWatch()
    assert slurm.main(["--asg", "slurm-gpu", "--partition", "gpu"], squeue=SQUEUE.splitlines, cloudwatch=cw) == 0
    [call] = cw.calls
    assert call["Namespace"] == "Slurm"
    [d] = call["MetricData"]
    assert (d["MetricName"], d["Value"], d["Dimensions"]) == (
        "PendingGPUs",
        23.0,
        [{"Name": "AutoScalingGroupName", "Value": "slurm-gpu"}],
    )


def test_squeue_missing_is_one_line_and_nothing_sent(capsys: pytest.CaptureFixture) -> None:
    def broken() -> list:
        raise subprocess.CalledProcessError(1, ["squeue"], stderr="slurm_load_jobs error")

    cw = FakeCloudWatch()
    assert slurm.main(["--asg", "a"], squeue=broken, cloudwatch=cw) == 1
    assert cw.calls == [] and capsys.readouterr().err.startswith("error: squeue failed")
