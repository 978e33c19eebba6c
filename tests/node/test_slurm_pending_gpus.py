"""ami/slurm_pending_gpus.py (Python >= 3.9): squeue's pending jobs -> the GPUs they ask for -> one datum."""

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Optional

import pytest
from hyperpod_config import RESOURCE_CONFIG

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


class _OwnSts:
    """sts GetCallerIdentity of the controller node's role [fake]: its aws:userid."""

    def get_caller_identity(self) -> dict:
        return {"UserId": "AROACONTROLLER:SageMaker", "Account": "123456789012"}


OWN_STS = _OwnSts()
OWN_NAMESPACE = "Slurm/AROACONTROLLER:SageMaker"


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [("gpu:4", 4), ("gpu:a100:2", 2), ("gres/gpu:8", 8), ("gres:gpu:a100:8", 8), ("N/A", 0), ("(null)", 0),
     ("gres/gpu:2,gres/shard:1", 2), ("gpu:a100:2,gpu:v100:1", 3), ("shard:4", 0)],
)  # fmt: skip
def test_gpus_per_node_from_gres(gres: str, gpus: int) -> None:
    assert slurm.gpus_per_node(gres) == gpus


def test_pending_gpus_counts_gres_times_nodes_and_filters_partitions() -> None:
    lines = SQUEUE.splitlines()
    assert slurm.pending_gpus(lines) == 16 + 4 + 0 + 2 + 1 + 4  # 4106_[1-4]: four pending elements
    assert slurm.pending_gpus(lines, ["gpu"]) == 16 + 4 + 2 + 4
    assert slurm.pending_gpus(lines, ["debug"]) == 2 + 1


def test_one_datum_on_the_groups_dimension() -> None:
    cw = FakeCloudWatch()
    assert slurm.main(["--asg", "slurm-gpu", "--partition", "gpu"], squeue=SQUEUE.splitlines, cloudwatch=cw) == 0
    [call] = cw.calls
    assert call["Namespace"] == "Slurm"
    [d] = call["MetricData"]
    assert (d["MetricName"], d["Value"], d["Dimensions"]) == (
        "PendingGPUs",
        26.0,
        [{"Name": "AutoScalingGroupName", "Value": "slurm-gpu"}],
    )


def test_squeue_missing_is_one_line_and_nothing_sent(capsys: pytest.CaptureFixture) -> None:
    def broken() -> list:
        raise subprocess.CalledProcessError(1, ["squeue"], stderr="slurm_load_jobs error")

    cw = FakeCloudWatch()
    assert slurm.main(["--asg", "a"], squeue=broken, cloudwatch=cw) == 1
    assert cw.calls == [] and capsys.readouterr().err.startswith("error: squeue failed")


# ---- HyperPod: --hyperpod, TRES requests, idle nodes ----


class FakeSageMaker:
    """ListClusterNodes (pages of 2) and DescribeClusterNode as the API reference shapes them; `hostnames`
    False: summaries without PrivateDnsHostname (older API versions), so each id needs a describe."""

    def __init__(self, nodes: list, hostnames: bool = True, error: Optional[Exception] = None) -> None:
        self.nodes = nodes  # (id, group, ip)
        self.hostnames = hostnames
        self.error = error
        self.calls: list = []

    def list_cluster_nodes(self, **kw):
        self.calls.append(("ListClusterNodes", kw))
        if self.error:
            raise self.error
        start = int(kw.get("NextToken", 0))
        page = []
        for node_id, group, ip in self.nodes[start : start + 2]:
            summary = {"InstanceId": node_id, "InstanceGroupName": group, "InstanceStatus": {"Status": "Running"}}
            if self.hostnames:
                summary["PrivateDnsHostname"] = "ip-%s.us-west-2.compute.internal" % ip.replace(".", "-")
            page.append(summary)
        out = {"ClusterNodeSummaries": page}
        if start + 2 < len(self.nodes):
            out["NextToken"] = str(start + 2)
        return out

    def describe_cluster_node(self, **kw):
        self.calls.append(("DescribeClusterNode", kw))
        [(node_id, group, ip)] = [n for n in self.nodes if n[0] == kw["NodeId"]]
        return {"NodeDetails": {"InstanceId": node_id, "InstanceGroupName": group, "PrivatePrimaryIp": ip}}


NO_API = FakeSageMaker([], error=RuntimeError("no SageMaker endpoint"))

# What this script's `squeue --Format=JobID:0|,NumNodes:0|,NumTasks:0|,Partition:0|,tres-per-job:0|,
# tres-per-node:0|,tres-per-task:0` prints: TRES strings as Slurm builds them (src/common/proc_args.c
# xfmt_tres: "gres/gpu:N"; tres_per_task "cpu=N,gres/gpu=N", src/common/slurm_opt.c); N/A when unset.
SQUEUE_TRES = """\
5001|2|2|train|N/A|gres/gpu:8|N/A
5002|1|1|train|gres/gpu:4|N/A|N/A
5003|1|4|debug|N/A|N/A|cpu=4,gres/gpu=1
5004|2|16|train,debug|gres/gpu:16|gres/gpu:8|N/A
5005|1|1|cpu|N/A|N/A|cpu=2
5006|1|1|other|gres/gpu:a100:2|N/A|N/A
"""


@pytest.mark.parametrize(
    ("tres", "gpus"),
    [("gres/gpu:4", 4), ("gres/gpu:a100:2", 2), ("gpu:2", 2), ("N/A", 0), ("(null)", 0), ("", 0),
     ("gres/gpu=1", 1), ("cpu=4,gres/gpu:a100=2", 2), ("gres:gpu:8", 8), ("gres/gpu", 1), ("gpu:a100", 1),
     ("gres/gpu:8,gres/shard:2", 8), ("gres/shard:4", 0), ("license/iop1=1,cpu=10", 0)],
)  # fmt: skip
def test_gpus_in_a_tres_field(tres: str, gpus: int) -> None:
    assert slurm.gpus_in(tres) == gpus


@pytest.mark.parametrize(
    ("line", "gpus"),
    [("5001|2|2|train|N/A|gres/gpu:8|N/A", 16),  # --gpus-per-node=8 -N2
     ("5002|1|1|train|gres/gpu:4|N/A|N/A", 4),  # --gpus=4
     ("5003|1|4|debug|N/A|N/A|cpu=4,gres/gpu=1", 4),  # --gpus-per-task=1 -n4
     ("5004|2|16|train,debug|gres/gpu:16|gres/gpu:8|N/A", 16),  # the same GPUs said twice: not 32
     ("4101|2|gres/gpu:8|gpu", 16)],  # the older %i|%D|%b|%P line
)  # fmt: skip
def test_a_jobs_gpus_from_each_kind_of_request(line: str, gpus: int) -> None:
    job = slurm.parse_job(line)
    assert job is not None and job.gpus == gpus


def test_partitions_map_jobs_to_instance_groups_and_unmapped_jobs_are_said() -> None:
    specs = [slurm.GroupSpec.parse("ml-cluster:gpu-a=train"), slurm.GroupSpec.parse("ml-cluster:gpu-b=debug")]
    totals, unmapped = slurm.pending_by_group(SQUEUE_TRES.splitlines(), specs)
    assert totals == {("ml-cluster", "gpu-a"): 16 + 4 + 16, ("ml-cluster", "gpu-b"): 4}
    assert unmapped == ["5006"]  # a GPU job in partition `other`; 5005 asks no GPU
    catch_all = [specs[0], slurm.GroupSpec.parse("ml-cluster:gpu-b")]
    totals, unmapped = slurm.pending_by_group(SQUEUE_TRES.splitlines(), catch_all)
    assert totals[("ml-cluster", "gpu-b")] == 4 + 2 and unmapped == []


@pytest.mark.parametrize(
    ("state", "idle"),
    [("idle", True), ("IDLE", True), ("idle~", False), ("idle*", False), ("idle#", False), ("idle%", False),
     ("idle!", False), ("idle$", False), ("idle@", False), ("idle-", False), ("mixed", False),
     ("allocated", False), ("drained", False), ("draining", False), ("completing", False), ("down*", False),
     ("reserved", False), ("maint", False), ("idle+drain", False), ("IDLE+POWERED_DOWN", False), ("", False)],
)  # fmt: skip
def test_only_a_plainly_idle_node_is_idle(state: str, idle: bool) -> None:
    assert slurm.is_idle(state) is idle


def test_idle_nodes_of_mapped_groups_by_instance_id() -> None:
    nodes = slurm.NodeMap(RESOURCE_CONFIG)
    sinfo = [
        "ip-10-1-28-64|idle",
        "ip-10-1-28-64|idle",  # one line per partition
        "ip-10-1-28-65|mixed",
        "ip-10-1-28-66|idle",
        "ip-10-1-28-66|drained",  # idle in one partition, drained: not idle
        "ip-10-1-40-7|idle~",
        "ip-10-1-113-28|idle",  # the controller's group is not mapped
        "ip-10-9-9-9|idle",  # not in the resource file
    ]
    specs = [slurm.GroupSpec.parse("ml-cluster:gpu-a"), slurm.GroupSpec.parse("ml-cluster:gpu-b")]
    assert slurm.idle_nodes(sinfo, nodes, specs) == [
        ("ml-cluster", "gpu-a", "i-0a1", True),
        ("ml-cluster", "gpu-a", "i-0a2", False),  # busy: said (0), so the controller sees it at once
        ("ml-cluster", "gpu-a", "i-0a3", False),
        ("ml-cluster", "gpu-b", "i-0b1", False),
    ]


def test_hyperpod_publishes_backlog_per_group_and_idle_nodes(tmp_path) -> None:
    config = tmp_path / "resource_config.json"
    config.write_text(json.dumps(RESOURCE_CONFIG))
    cw = FakeCloudWatch()
    argv = ["--hyperpod", "ml-cluster:gpu-a=train", "--hyperpod", "ml-cluster:gpu-b=debug",
            "--resource-config", str(config)]  # fmt: skip
    sinfo = ["ip-10-1-28-64|idle", "ip-10-1-40-7|allocated"]
    assert (
        slurm.main(
            argv, squeue=SQUEUE_TRES.splitlines, cloudwatch=cw, sinfo=lambda: sinfo, sagemaker=NO_API, sts=OWN_STS
        )
        == 0
    )
    [call] = cw.calls
    got = {(d["MetricName"], tuple((x["Name"], x["Value"]) for x in d["Dimensions"])): d["Value"]
           for d in call["MetricData"]}  # fmt: skip
    assert call["Namespace"] == OWN_NAMESPACE  # its own, the only one gpufleet reads (issue 41)
    assert got == {
        ("PendingGPUs", (("ClusterName", "ml-cluster"), ("InstanceGroupName", "gpu-a"))): 36.0,
        ("PendingGPUs", (("ClusterName", "ml-cluster"), ("InstanceGroupName", "gpu-b"))): 4.0,
        ("IdleNode", (("ClusterName", "ml-cluster"), ("InstanceGroupName", "gpu-a"), ("InstanceId", "i-0a1"))): 1.0,
        # ip-10-1-40-7 (i-0b1) is allocated: nothing for it (its series costs only idle hours)
    }


def test_no_resource_file_and_no_api_means_no_idle_node_but_the_backlog_still_goes(tmp_path, capsys) -> None:
    cw = FakeCloudWatch()
    argv = ["--hyperpod", "ml-cluster:gpu-a", "--resource-config", str(tmp_path / "absent.json")]
    sinfo = ["ip-10-1-28-64|idle"]
    assert (
        slurm.main(
            argv, squeue=SQUEUE_TRES.splitlines, cloudwatch=cw, sinfo=lambda: sinfo, sagemaker=NO_API, sts=OWN_STS
        )
        == 0
    )
    [call] = cw.calls
    assert [d["MetricName"] for d in call["MetricData"]] == ["PendingGPUs"]
    assert "node ids from the SageMaker API unknown" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["ml-cluster", ":gpu-a", "ml-cluster:"])
def test_a_bad_hyperpod_target_is_one_line_and_nothing_sent(bad: str, capsys) -> None:
    cw = FakeCloudWatch()
    with pytest.raises(SystemExit) as exit_:
        slurm.main(["--hyperpod", bad], squeue=SQUEUE_TRES.splitlines, cloudwatch=cw, sts=OWN_STS)
    assert exit_.value.code == 2 and cw.calls == []
    assert "CLUSTER:GROUP" in capsys.readouterr().err


def test_the_squeue_command_asks_whole_fields() -> None:
    """Width 0 prints the whole value: without it squeue cuts every --Format field at 20 characters
    (src/squeue/opts.c _parse_long_token), and `cpu=4,gres/gpu:a100=1` would lose its count."""
    fmt = next(a for a in slurm.SQUEUE if a.startswith("--Format="))
    fields = fmt.split("=", 1)[1].split(",")
    assert [f.split(":")[0] for f in fields] == [
        "JobID", "NumNodes", "NumTasks", "Partition", "tres-per-job", "tres-per-node", "tres-per-task",
        "State", "Reason"]  # fmt: skip
    assert all(f.split(":")[1].startswith("0") for f in fields)


# ---- demand: job arrays, and jobs that wait on something no node can end ----


@pytest.mark.parametrize(
    ("job_id", "tasks"),
    [("123", 1), ("123_7", 1), ("123_[1-100]", 100), ("123_[1-100%4]", 4), ("123_[1,3,5-7]", 5),
     ("123_[0-9:2]", 5), ("123_[5-1024%4]", 4), ("123_[2%8]", 1), ("123_[1-3,x]", 3), ("123_[...]", 1)],
)  # fmt: skip
def test_a_pending_arrays_line_counts_each_element_up_to_its_throttle(job_id: str, tasks: int) -> None:
    """squeue(1) -r: "Without this option ... pending job array elements will be combined on one line of
    output with the array index values printed using a regular expression" (Slurm shows `1080_[5-1024%4]`
    for a throttled array); the old count took such a line as one job."""
    assert slurm.array_tasks(job_id) == tasks
    line = "%s|1|1|train|N/A|gres/gpu:8|N/A|Resources" % job_id
    totals, _ = slurm.pending_by_group([line], [slurm.GroupSpec.parse("ml-cluster:gpu-a=train")])
    assert totals[("ml-cluster", "gpu-a")] == 8 * tasks


@pytest.mark.parametrize(
    ("reason", "demand"),
    [("Resources", True), ("Priority", True), ("None", True), ("", True),
     ("ReqNodeNotAvail, UnavailableNodes:ip-10-1-28-64", True),
     ("Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions", True),
     ("JobHeldUser", False), ("JobHeldAdmin", False), ("Dependency", False), ("DependencyNeverSatisfied", False),
     ("BeginTime", False), ("JobArrayTaskLimit", False), ("AssocGrpGRES", False), ("QOSMaxGRESPerUser", False),
     ("AccountingPolicy", False), ("PartitionDown", False), ("InvalidAccount", False), ("Licenses", False),
     ("launch failed requeued held", False)],
)  # fmt: skip
def test_only_a_job_waiting_for_nodes_is_demand(reason: str, demand: bool) -> None:
    """Slurm's job_reason_codes.html: a held job (sbatch --hold: JobHeldUser), one waiting on another
    (Dependency) or a time (BeginTime), or on a limit, does not start on a new node; the old count scaled
    the group out for them and the nodes sat idle."""
    line = "200|4|4|train|N/A|gres/gpu:8|N/A|%s" % reason
    totals, _ = slurm.pending_by_group([line], [slurm.GroupSpec.parse("ml-cluster:gpu-a=train")])
    assert totals[("ml-cluster", "gpu-a")] == (32 if demand else 0)
    assert slurm.pending_gpus([line]) == (32 if demand else 0)


def test_squeue_runs_with_whole_array_index_strings() -> None:
    assert "-r" not in slurm.SQUEUE and "--array" not in slurm.SQUEUE  # combined lines keep the throttle
    assert slurm.SQUEUE_ENV == {"SLURM_BITSTR_LEN": "0"}  # not cut at 64 characters (src/squeue/opts.c)


# ---- idle nodes when the resource file names no instance id ----

NO_IDS = {
    "ClusterConfig": RESOURCE_CONFIG["ClusterConfig"],
    "InstanceGroups": [
        {"Name": "gpu-a", "Instances": [{"InstanceName": "gpu-a-1", "CustomerIpAddress": "10.1.28.64"},
                                        {"InstanceName": "gpu-a-2", "CustomerIpAddress": "10.1.28.65"}]},
    ],
}  # fmt: skip
API_NODES = [("i-0a1", "gpu-a", "10.1.28.64"), ("i-0a2", "gpu-a", "10.1.28.65"), ("i-0a9", "gpu-a", "10.1.28.99"),
             ("i-0c1", "controller-machine", "10.1.113.28")]  # fmt: skip
SINFO = ["ip-10-1-28-64|idle", "ip-10-1-28-65|allocated", "ip-10-1-28-99|idle"]  # -99: joined after the file


def _publish(tmp_path, sagemaker, config=NO_IDS, extra=()) -> dict:
    (tmp_path / "rc.json").write_text(json.dumps(config))
    cw = FakeCloudWatch()
    argv = ["--hyperpod", "ml-cluster:gpu-a", "--resource-config", str(tmp_path / "rc.json"), *extra]
    assert (
        slurm.main(argv, squeue=lambda: [], cloudwatch=cw, sinfo=lambda: SINFO, sagemaker=sagemaker, sts=OWN_STS) == 0
    )
    [call] = cw.calls
    return {
        {x["Name"]: x["Value"] for x in d["Dimensions"]}["InstanceId"]: d["Value"]
        for d in call["MetricData"]
        if d["MetricName"] == "IdleNode"
    }


@pytest.mark.parametrize("hostnames", [True, False])
def test_nodes_the_file_names_without_an_id_are_named_by_the_api(tmp_path, hostnames: bool) -> None:
    """AWS's own lifecycle scripts read only Name, InstanceName and CustomerIpAddress from the file: if it
    holds no InstanceId (or a node joined after it was written), the ids come from ListClusterNodes
    (PrivateDnsHostname) or DescribeClusterNode (PrivatePrimaryIp), asked once per node id (cached)."""
    sm = FakeSageMaker(API_NODES, hostnames=hostnames)
    cache = str(tmp_path / "ids.json")
    assert _publish(tmp_path, sm, extra=["--node-cache", cache]) == {"i-0a1": 1.0, "i-0a9": 1.0}  # i-0a2: allocated
    describes = [c for c, _ in sm.calls if c == "DescribeClusterNode"]
    assert len(describes) == (0 if hostnames else len(API_NODES))
    sm.calls.clear()
    assert _publish(tmp_path, sm, extra=["--node-cache", cache]) == {"i-0a1": 1.0, "i-0a9": 1.0}  # i-0a2: allocated
    assert [c for c, _ in sm.calls] == ["ListClusterNodes", "ListClusterNodes"]  # two pages, no describe


def test_a_file_with_ids_asks_no_api_and_an_api_failure_publishes_no_node(tmp_path, capsys) -> None:
    sm = FakeSageMaker(API_NODES)
    with_ids = {"ClusterConfig": RESOURCE_CONFIG["ClusterConfig"], "InstanceGroups": RESOURCE_CONFIG["InstanceGroups"]}
    sinfo_known = _publish(tmp_path, sm, config=with_ids, extra=["--no-api"])
    assert sinfo_known == {"i-0a1": 1.0} and sm.calls == []
    assert _publish(tmp_path, NO_API) == {}  # fail closed: no node can be named, none is said idle
    assert "node ids from the SageMaker API unknown" in capsys.readouterr().err
    assert _publish(tmp_path, NO_API, config=with_ids) == {"i-0a1": 1.0}  # the file's still go
