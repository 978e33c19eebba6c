"""ami/slurm_pending_gpus.py --marks-table: the controller applies the Slurm drains gpufleet asks for in its
state table, against an emulated slurmctld (rehearsal/slurm_emulation.py: sinfo's real `%N|%T|%E` lines,
scontrol's update semantics). Python >= 3.9."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from hyperpod_config import RESOURCE_CONFIG

from fakes import FakeCloudWatch

ROOT = Path(__file__).resolve().parents[2]


class _OwnSts:
    """sts GetCallerIdentity of the controller node's role [fake]: its aws:userid."""

    def get_caller_identity(self) -> dict:
        return {"UserId": "AROACONTROLLER:SageMaker", "Account": "123456789012"}


OWN_STS = _OwnSts()
OWN_NAMESPACE = "Slurm/AROACONTROLLER:SageMaker"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


slurm = _load("slurm_pending_gpus_drains", ROOT / "ami" / "slurm_pending_gpus.py")
emulation = _load("slurm_emulation_for_node_tests", ROOT / "rehearsal" / "slurm_emulation.py")

A1, A2, A3 = "ip-10-1-28-64", "ip-10-1-28-65", "ip-10-1-28-66"  # i-0a1, i-0a2, i-0a3 (gpu-a)
TABLE = "gpufleet-state"


class FakeDynamoDB:
    """GetItem on gpufleet's state table, the item in the shape aws.slurm_marks writes it [fake]."""

    def __init__(self, drains=None, error=None) -> None:
        self.drains = drains or {}  # instance id -> reason
        self.error = error
        self.calls: list = []

    def get_item(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        if not self.drains:
            return {}
        item = {"pk": kwargs["Key"]["pk"], "sk": kwargs["Key"]["sk"]}
        for iid, reason in self.drains.items():
            item["node#" + iid] = {"M": {"reason": {"S": reason}, "at": {"S": "2026-11-27T00:00:00+00:00"}}}
        return {"Item": item}


def _cluster() -> "emulation.EmulatedSlurm":
    s = emulation.EmulatedSlurm()
    s.add(A1, "idle")
    s.add(A2, "allocated")
    s.add(A3, "idle", partitions=("gpu", "debug"))
    return s


def _run(tmp_path, s, dynamodb, extra=("--marks-table", TABLE)) -> dict:
    """One publisher minute; returns IdleNode by instance id."""
    config = tmp_path / "rc.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    cw = FakeCloudWatch()
    argv = ["--hyperpod", "ml-cluster:gpu-a", "--resource-config", str(config), "--no-api", *extra]
    code = slurm.main(
        argv, squeue=lambda: [], cloudwatch=cw, sinfo=s.sinfo, dynamodb=dynamodb, scontrol=s.scontrol, sts=OWN_STS
    )
    assert code == 0
    [call] = cw.calls
    return {
        {x["Name"]: x["Value"] for x in d["Dimensions"]}["InstanceId"]: d["Value"]
        for d in call["MetricData"]
        if d["MetricName"] == "IdleNode"
    }


def test_a_requested_node_is_drained_with_a_gpufleet_reason_and_read_with_consistency(tmp_path) -> None:
    s, ddb = _cluster(), FakeDynamoDB({"i-0a2": "consolidation: emptiest node\nof 3"})
    _run(tmp_path, s, ddb)
    assert s.calls == [
        ["scontrol", "update", "NodeName=" + A2, "State=DRAIN", "Reason=gpufleet: consolidation: emptiest node of 3"]
    ]
    assert ddb.calls == [
        {
            "TableName": TABLE,
            "Key": {"pk": {"S": "slurm-marks#ml-cluster"}, "sk": {"S": "MARKS"}},
            "ConsistentRead": True,
        }
    ]
    assert f"{A2}|draining|gpufleet: consolidation: emptiest node of 3" in s.sinfo()  # [emulated] real format
    _run(tmp_path, s, ddb)
    assert len(s.calls) == 1  # already draining: not asked again


def test_draining_is_not_idle_and_drained_by_gpufleet_is(tmp_path) -> None:
    s, ddb = _cluster(), FakeDynamoDB({"i-0a2": "attrition"})
    assert _run(tmp_path, s, ddb) == {"i-0a1": 1.0, "i-0a3": 1.0}  # i-0a2 drains: its job still runs
    s.set_base(A2, "idle")  # the job ended: Slurm shows `drained`, no new job may start there
    assert f"{A2}|drained|gpufleet: attrition" in s.sinfo()
    assert _run(tmp_path, s, ddb) == {"i-0a1": 1.0, "i-0a2": 1.0, "i-0a3": 1.0}


def test_a_node_no_longer_requested_is_resumed(tmp_path) -> None:
    s = _cluster()
    _run(tmp_path, s, FakeDynamoDB({"i-0a1": "attrition", "i-0a3": "attrition"}))
    assert [c[3] for c in s.calls] == ["State=DRAIN", "State=DRAIN"]
    s.calls.clear()
    _run(tmp_path, s, FakeDynamoDB({"i-0a3": "attrition"}))  # gpufleet reopened i-0a1 (waiting work fits it)
    assert s.calls == [["scontrol", "update", "NodeName=" + A1, "State=RESUME"]]
    assert f"{A1}|idle|none" in s.sinfo()


def test_a_node_drained_by_someone_else_is_never_resumed_never_claimed_never_idle(tmp_path) -> None:
    s = _cluster()
    s.drain_by_someone(A1, "xid 79 on GPU 3")
    s.drain_by_someone(A3, "gpu health check")
    # Requested (i-0a1) or not (i-0a3): nothing is run on either, and neither is reported idle.
    assert _run(tmp_path, s, FakeDynamoDB({"i-0a1": "attrition"})) == {}
    assert s.calls == []
    assert f"{A1}|drained|xid 79 on GPU 3" in s.sinfo()


def test_a_down_node_is_left_alone(tmp_path) -> None:
    s = _cluster()
    s.set_base(A1, "down")
    _run(tmp_path, s, FakeDynamoDB({"i-0a1": "attrition"}))
    assert s.calls == []


def test_without_the_flag_nothing_is_read_and_nothing_runs(tmp_path) -> None:
    s, ddb = _cluster(), FakeDynamoDB({"i-0a1": "attrition"})
    assert _run(tmp_path, s, ddb, extra=()) == {"i-0a1": 1.0, "i-0a3": 1.0}
    assert ddb.calls == [] and s.calls == []


def test_an_unreadable_item_drains_and_resumes_nothing(tmp_path, capsys) -> None:
    s = _cluster()
    s.drain_by_someone(A1, "gpufleet: attrition")  # gpufleet's own earlier drain: must not be resumed blind
    assert _run(tmp_path, s, FakeDynamoDB(error=RuntimeError("AccessDenied"))) == {"i-0a1": 1.0, "i-0a3": 1.0}
    assert s.calls == []
    assert "drains for ml-cluster unread, none applied" in capsys.readouterr().err


def test_dry_run_reads_and_says_but_runs_nothing(tmp_path, capsys) -> None:
    s, ddb = _cluster(), FakeDynamoDB({"i-0a1": "attrition"})
    config = tmp_path / "rc.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    argv = ["--hyperpod", "ml-cluster:gpu-a", "--resource-config", str(config), "--no-api",
            "--marks-table", TABLE, "--dry-run"]  # fmt: skip
    assert slurm.main(argv, squeue=lambda: [], sinfo=s.sinfo, dynamodb=ddb, scontrol=s.scontrol, sts=OWN_STS) == 0
    assert s.calls == []
    assert f"would run: scontrol update NodeName={A1} State=DRAIN Reason=gpufleet: attrition" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("lines", "idle"),
    [
        (["n|idle|none"], True),
        (["n|idle"], True),  # the older two-field format
        (["n|drained|gpufleet: attrition"], True),
        (["n|drained*|gpufleet: attrition"], False),  # not responding
        (["n|draining|gpufleet: attrition"], False),
        (["n|drained|maintenance"], False),
        (["n|drained|gpufleet: a", "n|draining|gpufleet: a"], False),
        (["n|mixed|none"], False),
    ],
)
def test_which_sinfo_lines_are_idle(lines, idle) -> None:
    assert slurm.node_states(lines) == {"n": idle}


def test_the_controller_installer_passes_the_marks_table_and_refuses_a_bad_name(tmp_path) -> None:
    import shlex

    from test_hyperpod_lifecycle import HYPERPOD, bundle, run

    b, config = bundle(tmp_path), tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    common = ["--group", "gpu-a", "--bundle", str(b), "--resource-config", str(config), "--no-deps"]
    script = str(HYPERPOD / "install_gpufleet_controller.sh")
    out = run(script, *common, "--root", str(tmp_path / "root"), "--marks-table", "gpufleet-state")
    assert out.returncode == 0, out.stderr
    service = (tmp_path / "root/etc/systemd/system/gpufleet-slurm-backlog.service").read_text()
    [exec_start] = [line for line in service.splitlines() if line.startswith("ExecStart=")]
    assert shlex.split(exec_start)[-2:] == ["--marks-table", "gpufleet-state"]
    bad = run(script, *common, "--root", str(tmp_path / "root2"), "--marks-table", "x; rm -rf /")
    assert bad.returncode == 2 and "not a DynamoDB table name" in bad.stderr
