"""ami/slurm_pending_gpus.py --marks-table, what the controller removes a drained node on: DrainedNode = 1 only
for a node Slurm shows drained with gpufleet's reason, no job, that gpufleet still asks to drain (never for a
drain scontrol failed to apply, nor one resumed this run); and a node whose resource-file id the SageMaker API
contradicts (a new node on an address a deleted one freed) is never drained. Python >= 3.9."""

import json
import subprocess

from test_slurm_drains import A1, A2, TABLE, FakeDynamoDB, _cluster, emulation, slurm

from fakes import FakeCloudWatch

STALE_FILE = {
    "ClusterConfig": {"ClusterName": "ml"},
    "InstanceGroups": [
        {
            "Name": "gpu",
            "Instances": [{"InstanceName": "gpu-1", "CustomerIpAddress": "10.1.0.5", "InstanceId": "i-old"}],
        }
    ],
}


class _OwnSts:
    """sts GetCallerIdentity of the controller node's role [fake]: its aws:userid."""

    def get_caller_identity(self) -> dict:
        return {"UserId": "AROACONTROLLER:SageMaker", "Account": "123456789012"}


OWN_STS = _OwnSts()
OWN_NAMESPACE = "Slurm/AROACONTROLLER:SageMaker"


class FakeSageMaker:
    """ListClusterNodes [fake]: ip 10.1.0.5 is `node_id` now; `error` fails every call."""

    def __init__(self, node_id="i-new", error=None):
        self.node_id = node_id
        self.error = error
        self.calls = 0

    def list_cluster_nodes(self, **kw):
        self.calls += 1
        if self.error is not None:
            raise self.error
        host = "ip-10-1-0-5.ec2.internal"
        return {
            "ClusterNodeSummaries": [
                {"InstanceId": self.node_id, "InstanceGroupName": "gpu", "PrivateDnsHostname": host}
            ]
        }


def _report(tmp_path, s, ddb, doc=None, spec="ml-cluster:gpu-a", extra=("--no-api",), **kw):
    """One publisher minute; returns {(metric, instance id): value} of the node data it put."""
    from hyperpod_config import RESOURCE_CONFIG

    config = tmp_path / "rc.json"
    config.write_text(json.dumps(doc or RESOURCE_CONFIG))
    cw = FakeCloudWatch()
    argv = ["--hyperpod", spec, "--resource-config", str(config), "--marks-table", TABLE, *extra]
    assert slurm.main(argv, squeue=lambda: [], cloudwatch=cw, sinfo=s.sinfo, dynamodb=ddb, **kw, sts=OWN_STS) == 0
    [call] = cw.calls
    return {
        (d["MetricName"], {x["Name"]: x["Value"] for x in d["Dimensions"]}["InstanceId"]): d["Value"]
        for d in call["MetricData"]
        if d["MetricName"] != "PendingGPUs"
    }


def test_drained_node_only_for_gpufleets_drain_landed_with_no_job_and_still_asked(tmp_path) -> None:
    s, ddb = _cluster(), FakeDynamoDB({"i-0a2": "attrition"})
    assert ("DrainedNode", "i-0a2") not in _report(tmp_path, s, ddb, scontrol=s.scontrol)  # asked: draining
    s.set_base(A2, "idle")  # its job ended: `drained`
    got = _report(tmp_path, s, ddb, scontrol=s.scontrol)
    assert got[("DrainedNode", "i-0a2")] == 1.0 and got[("IdleNode", "i-0a2")] == 1.0
    assert [k for k in got if k[0] == "DrainedNode"] == [("DrainedNode", "i-0a2")]
    ddb.drains = {}  # gpufleet reopened it: resumed this run, so not reported drained (sinfo was read before)
    got = _report(tmp_path, s, ddb, scontrol=s.scontrol)
    assert s.calls[-1] == ["scontrol", "update", "NodeName=" + A2, "State=RESUME"]
    assert ("DrainedNode", "i-0a2") not in got and got[("IdleNode", "i-0a2")] == 1.0


def test_a_drain_scontrol_never_applied_is_never_reported_drained(tmp_path) -> None:
    s, ddb = _cluster(), FakeDynamoDB({"i-0a1": "attrition"})

    def failing(argv):
        raise subprocess.CalledProcessError(1, argv, "slurm_update error: Socket timed out on send/recv operation")

    for _ in range(5):
        got = _report(tmp_path, s, ddb, scontrol=failing)
        assert got.get(("IdleNode", "i-0a1")) == 1.0 and ("DrainedNode", "i-0a1") not in got


def test_someone_elses_drain_is_never_reported_drained(tmp_path) -> None:
    s = _cluster()
    s.drain_by_someone(A1, "xid 79")
    assert not [k for k in _report(tmp_path, s, FakeDynamoDB({"i-0a1": "attrition"})) if k[0] == "DrainedNode"]


def test_a_node_whose_file_id_the_api_contradicts_is_not_drained(tmp_path, capsys) -> None:
    s = emulation.EmulatedSlurm()
    s.add("ip-10-1-0-5", "idle")  # a new node on the address a deleted one (i-old, still in the file) freed
    sm = FakeSageMaker("i-new")
    _report(
        tmp_path, s, FakeDynamoDB({"i-old": "attrition"}), STALE_FILE, "ml:gpu", (), sagemaker=sm, scontrol=s.scontrol
    )
    assert s.calls == [] and sm.calls == 1
    assert "ip-10-1-0-5 (i-old) not drained: the SageMaker API says ip-10-1-0-5 is i-new" in capsys.readouterr().err


def test_an_id_the_api_agrees_with_or_cannot_check_is_drained_and_no_drain_no_api_call(tmp_path, capsys) -> None:
    for sm in (FakeSageMaker("i-old"), FakeSageMaker(error=RuntimeError("ThrottlingException"))):
        s = emulation.EmulatedSlurm()
        s.add("ip-10-1-0-5", "idle")
        ddb = FakeDynamoDB({"i-old": "attrition"})
        _report(tmp_path, s, ddb, STALE_FILE, "ml:gpu", (), sagemaker=sm, scontrol=s.scontrol)
        assert [c[3] for c in s.calls] == ["State=DRAIN"] and sm.calls == 1
    assert "not checked with the API: ThrottlingException" in capsys.readouterr().err
    s, sm = emulation.EmulatedSlurm(), FakeSageMaker("i-new")
    s.add("ip-10-1-0-5", "idle")
    _report(tmp_path, s, FakeDynamoDB({}), STALE_FILE, "ml:gpu", (), sagemaker=sm, scontrol=s.scontrol)
    assert sm.calls == 0  # nothing to drain: the publisher's minute costs no API call
