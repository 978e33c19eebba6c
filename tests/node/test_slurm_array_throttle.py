"""ami/slurm_pending_gpus.py (Python >= 3.9): a job array's throttle (`%N`) counts only the tasks that may
still start (issue 42). Slurm's job_array.html / sbatch(1) --array: "A maximum number of simultaneously
running tasks from the job array may be specified using a '%' separator" (`--array=0-15%4`). squeue(1)
without -r prints the array's pending tasks as one line (`123_[3-100%4]`) and each started task as
`<array job id>_<index>` (`123_1`), so the room left is the throttle minus the started tasks."""

import importlib.util
from pathlib import Path
from typing import List

import pytest

from fakes import FakeCloudWatch

SCRIPT = Path(__file__).resolve().parents[2] / "ami" / "slurm_pending_gpus.py"
_spec = importlib.util.spec_from_file_location("slurm_pending_gpus_throttle", SCRIPT)
slurm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slurm)  # type: ignore[union-attr]

GROUP = "ml-cluster:gpu-a=train"
OWN = "AROACONTROLLER:SageMaker"


class _Sts:
    def get_caller_identity(self) -> dict:
        return {"UserId": OWN, "Account": "123456789012"}


def line(job_id: str, state: str = "PENDING", reason: str = "Resources") -> str:
    """One line of this script's squeue format: one node, 8 GPUs per element (`--gpus-per-node=8`)."""
    return "%s|1|1|train|N/A|gres/gpu:8|N/A|%s|%s" % (job_id, state, reason)


def running(*ids: str) -> List[str]:
    return [line(i, "RUNNING", "None") for i in ids]


def hyperpod_total(lines: List[str]) -> int:
    totals, _ = slurm.pending_by_group(lines, [slurm.GroupSpec.parse(GROUP)])
    return totals[("ml-cluster", "gpu-a")]


@pytest.mark.parametrize(
    ("lines", "gpus"),
    [
        # the issue: throttle 4, 2 running -> 2 more may start, 2 x 8 = 16 (the old count: 4 x 8 = 32)
        pytest.param([line("123_[3-100%4]"), *running("123_1", "123_2")], 16, id="issue-42-throttle-4-two-running"),
        pytest.param([line("123_[3-100%4]")], 32, id="throttle-4-none-running"),
        pytest.param([line("123_[3-100]"), *running("123_1", "123_2")], 98 * 8, id="no-throttle"),
        pytest.param([line("123_[5-100%4]"), *running("123_1", "123_2", "123_3", "123_4")], 0, id="throttle-full"),
        pytest.param([line("123_[3-4%4]"), *running("123_1")], 16, id="bounded-by-pending-tasks"),
        pytest.param([line("123_[3-100%4]"), *running("124_1", "124_2", "125")], 32, id="other-arrays-running"),
        pytest.param(
            [line("123_[3-100%4]"), line("123_1", "SUSPENDED", "None"), line("123_2", "CONFIGURING", "None")],
            16,
            id="suspended-and-configuring-hold-places",
        ),
        pytest.param([line("123_[3-100%4]"), line("123_1", "COMPLETING", "None")], 32, id="completing-has-ended"),
        pytest.param([line("123_[3-100%0]"), *running("123_1")], 98 * 8, id="throttle-0-is-no-limit"),
        pytest.param([line("123_[3-100%4]"), *running("123_1", "123_2", "4101")], 16, id="running-jobs-no-demand"),
    ],
)
def test_an_arrays_pending_gpus_are_the_room_its_throttle_leaves(lines: List[str], gpus: int) -> None:
    assert hyperpod_total(lines) == gpus
    assert slurm.pending_gpus(lines) == gpus


def test_an_unparseable_throttle_counts_every_pending_element_and_says_so(capsys) -> None:
    """A throttle squeue printed in a form this script cannot read (`%x`, a cut string) is not applied: the
    count is the one before throttles were read (a too-large backlog is seen on the stderr note, a too-small
    one would hide demand)."""
    lines = [line("123_[3-10%x]"), *running("123_1", "123_2")]
    assert hyperpod_total(lines) == 8 * 8
    err = capsys.readouterr().err
    assert err.count("array throttle unreadable") == 1 and "123_[3-10%x] (64 GPUs)" in err


def test_the_published_datum_honours_the_throttle(capsys) -> None:
    """Through main(): the squeue lines in, the PendingGPUs datum out (16, not 32)."""
    cw = FakeCloudWatch()
    squeue = lambda: [line("123_[3-100%4]"), *running("123_1", "123_2")]  # noqa: E731
    argv = ["--hyperpod", GROUP, "--no-api", "--resource-config", "/nonexistent"]
    assert slurm.main(argv, squeue=squeue, cloudwatch=cw, sinfo=lambda: [], sts=_Sts()) == 0
    pending = [d for call in cw.calls for d in call["MetricData"] if d["MetricName"] == "PendingGPUs"]
    assert [d["Value"] for d in pending] == [16.0]


def test_squeue_lists_started_jobs_and_their_state() -> None:
    states = next(a for a in slurm.SQUEUE if a.startswith("--states=")).split("=", 1)[1].split(",")
    assert set(states) == {"PENDING", "RUNNING", "SUSPENDED"}  # RUNNING lists CONFIGURING jobs too
    fmt = next(a for a in slurm.SQUEUE if a.startswith("--Format="))
    assert [f.split(":")[0] for f in fmt.split("=", 1)[1].split(",")][-2:] == ["State", "Reason"]
