"""The Slurm publisher's report namespace (issue 41): with --hyperpod, its own `Slurm/<aws:userid>` from sts
GetCallerIdentity, the literal the controller reads (gpufleet_node.schema); nothing is sent when the
identity cannot be learned (the report would land where nobody reads it); --asg keeps plain Slurm."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from gpufleet_node import schema

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("slurm_pending_gpus_ns", ROOT / "ami" / "slurm_pending_gpus.py")
assert _spec is not None and _spec.loader is not None
slurm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slurm)


class Cw:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def put_metric_data(self, **kw: Any) -> None:
        self.calls.append(kw)


class Sts:
    def __init__(self, userid: str | None = "AROACTRL:SageMaker", fail: bool = False) -> None:
        self.userid, self.fail = userid, fail

    def get_caller_identity(self) -> dict[str, Any]:
        if self.fail:
            raise RuntimeError("Unable to locate credentials")
        return {"UserId": self.userid} if self.userid else {}


def _run(argv: list[str], sts: Any) -> tuple[int, Cw]:
    cw = Cw()
    code = slurm.main(argv, squeue=lambda: [], cloudwatch=cw, sinfo=lambda: [], sagemaker=None, sts=sts)
    return code, cw


def test_the_literals_agree_with_the_schema() -> None:
    assert slurm.SLURM_NAMESPACE == schema.SLURM_NAMESPACE
    assert slurm.SLURM_PREFIX == schema.SLURM_NAMESPACE_PREFIX


def test_hyperpod_writes_its_whole_report_into_its_own_namespace(tmp_path: Path) -> None:
    code, cw = _run(["--hyperpod", "c:g", "--resource-config", str(tmp_path / "none.json"), "--no-api"], Sts())
    assert code == 0
    [call] = cw.calls
    assert call["Namespace"] == schema.slurm_namespace("AROACTRL:SageMaker")  # its role's, as HyperPod names it


def test_without_its_identity_nothing_is_sent(tmp_path: Path) -> None:
    for sts in (Sts(fail=True), Sts(userid=None)):
        code, cw = _run(["--hyperpod", "c:g", "--resource-config", str(tmp_path / "none.json"), "--no-api"], sts)
        assert (code, cw.calls) == (1, [])


def test_asg_mode_and_an_explicit_namespace_are_left_as_they_were(tmp_path: Path) -> None:
    code, cw = _run(["--asg", "slurm-gpu"], Sts(fail=True))
    assert code == 0 and cw.calls[0]["Namespace"] == "Slurm"
    code, cw = _run(["--hyperpod", "c:g", "--namespace", "Mine", "--no-api",
                     "--resource-config", str(tmp_path / "none.json")], Sts(fail=True))  # fmt: skip
    assert code == 0 and cw.calls[0]["Namespace"] == "Mine"
