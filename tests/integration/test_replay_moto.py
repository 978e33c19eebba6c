"""`gpufleet replay` end to end: a group's CloudWatch history read from moto server (seeded), a v2023
pod list through the CLI, and (when the shared trace is present) a sample of the 31-day DLRM trace."""

from __future__ import annotations

import json
import os
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.domain.models import GroupRef
from gpufleet_node import schema
from gpufleet_tools.cli import main
from gpufleet_tools.replay.model import ReplayRequest
from gpufleet_tools.replay.service import MAX_POINTS_PER_CALL, history_report
from rehearsal import fleet
from tests.integration.conftest import count_calls

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DLRM = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2025-dlrm-instances.csv"
REMOVED = "i-0badc0ffee0000001"
DAYS = 2
V2023 = """\
name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,1000,1024,1,1000,,LS,Running,0,,0
p1,1000,1024,4,1000,,BE,Succeeded,600,7800,600
p2,1000,1024,1,500,,BE,Succeeded,900,4500,960
p3,1000,1024,8,1000,,BE,Succeeded,1200,9000,1300
p4,1000,1024,0,0,,BE,Succeeded,1200,9000,1300
"""


def _datum(name: str, dims: dict[str, str], at: datetime, value: float) -> dict[str, Any]:
    return {
        "MetricName": name,
        "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
        "Timestamp": at,
        "Value": value,
        "Unit": "Percent",
    }


def _seed(clients: fleet.Clients, start: datetime, instances: list[str]) -> None:
    """Two days, one datapoint a minute: two nodes busy all along; the removed one busy until it was
    removed at the end of day 1 (by the group, while busy); the second current one idle on day 2."""
    gpu: list[dict[str, Any]] = []
    count: list[dict[str, Any]] = []
    busy, idle_later = instances
    for t in range(DAYS * 1440):
        at = start + timedelta(minutes=t)
        day2 = t >= 1440
        per = {busy: 80.0, idle_later: 0.0 if day2 else 70.0, **({} if day2 else {REMOVED: 60.0})}
        for iid, u in per.items():
            gpu.append(_datum(schema.GPU_UTILIZATION.name, {schema.DIM_INSTANCE_ID: iid}, at, u))
            gpu.append(_datum(schema.GPU_MEMORY_USED_PERCENT.name, {schema.DIM_INSTANCE_ID: iid}, at, u / 2))
        group = {schema.DIM_ASG_NAME: "train"}
        mean = sum(per.values()) / len(per)
        gpu.append(_datum(schema.GPU_UTILIZATION.name, group, at, mean))
        gpu.append(_datum(schema.GPU_MEMORY_USED_PERCENT.name, group, at, mean / 2))
        count.append(
            {**_datum("GroupInServiceInstances", {"AutoScalingGroupName": "train"}, at, len(per)), "Unit": "None"}
        )
    for i in range(0, len(gpu), 1000):
        clients.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=gpu[i : i + 1000])
    for i in range(0, len(count), 1000):
        clients.cloudwatch.put_metric_data(Namespace="AWS/AutoScaling", MetricData=count[i : i + 1000])


def _inject_removal(endpoint: str, at: datetime) -> None:
    """[emulated EC2 Auto Scaling] the activity AWS records when the group terminates an instance."""
    activity = {
        "ActivityId": "replay-removal",
        "AutoScalingGroupName": "train",
        "Description": f"Terminating EC2 instance: {REMOVED}",
        "Cause": f"At {at:%Y-%m-%dT%H:%M:%SZ} a user request explicitly set group desired capacity changing the "
        "desired capacity from 3 to 2.",
        "StartTime": at.isoformat(),
        "EndTime": at.isoformat(),
        "StatusCode": "Successful",
        "Progress": 100,
    }
    req = urllib.request.Request(
        f"{endpoint}/_gpufleet/emulation/scaling-activities", data=json.dumps([activity]).encode(), method="POST"
    )
    with urllib.request.urlopen(req, timeout=10):
        pass


def test_history_from_cloudwatch_in_batched_day_sized_reads(aws: str) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "train", min_size=1, max_size=10, desired=2, tags=fleet.MANAGED_TAG)
    group = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["train"])["AutoScalingGroups"][0]
    instances = sorted(i["InstanceId"] for i in group["Instances"])
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    start = end - timedelta(days=DAYS)
    _seed(clients, start, instances)
    _inject_removal(aws, start + timedelta(days=1))
    calls = count_calls(clients.cloudwatch)
    api = {"cloudwatch": clients.cloudwatch, "autoscaling": clients.autoscaling, "eks": clients.eks}
    request = ReplayRequest(from_cloudwatch="asg:train", days=DAYS, workload="batch")
    report, label = history_report(GroupRef.parse_key("asg:train"), end, api, request)
    # 2 group series + the in-service count + 2 x 3 instance series = 9 series, one batch; 2 days of
    # one-minute points = 2 calls of <= 1,440 points per series.
    assert calls["cloudwatch:GetMetricData"] == DAYS * 1440 // MAX_POINTS_PER_CALL
    assert label == "recommended (batch)"
    assert report.actual_node_hours == pytest.approx((3 * 1440 + 2 * 1440) / 60, rel=0.01)
    assert report.actual_changes >= 1
    assert report.busy_nodes_removed_by_group == 1  # the removed instance was busy when it went
    assert report.idle_node_hours == pytest.approx(24 - 5 / 60, abs=0.2)  # the second node, idle on day 2
    assert report.idle_node_hours_reclaimed > 20  # gpufleet would have removed it soon after it went idle
    assert report.gpufleet_scale_ins >= 1


def test_cli_replays_a_v2023_pod_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "pods.csv"
    trace.write_text(V2023)
    out = tmp_path / "out"
    assert main(["replay", "--trace", str(trace), "--out", str(out), "--no-progress", "--gpus-per-node", "8"]) == 0
    doc = json.loads((out / "report.json").read_text())
    assert [r["name"] for r in doc["runs"]] == [
        "gpufleet",
        "oracle",
        "static-peak",
        "asg-target-tracking",
        "cluster-autoscaler",
    ]
    assert (out / "capacity.png").stat().st_size > 10_000
    assert "| gpufleet |" in capsys.readouterr().out
    assert doc["pods"] == 4  # the CPU-only pod is not replayed


def test_cli_refuses_both_or_neither_source(tmp_path: Path) -> None:
    assert main(["replay", "--out", str(tmp_path)]) == 2
    assert main(["replay", "--trace", "x.csv", "--from-cloudwatch", "asg:x", "--out", str(tmp_path)]) == 2


DLRM_EVERY = 10  # the test replays one pod in 10 over all 31 days (15 s); `make bench` replays all 7,386


@pytest.mark.skipif(not DLRM.exists(), reason="the shared DLRM trace is not next to this checkout")
def test_the_dlrm_trace_replays_all_its_days_with_every_baseline(tmp_path: Path) -> None:
    header, *rows = DLRM.read_text().splitlines()
    trace = tmp_path / "dlrm-sample.csv"
    trace.write_text("\n".join([header, *rows[::DLRM_EVERY]]) + "\n")
    out = tmp_path / "dlrm"
    assert main(["replay", "--trace", str(trace), "--out", str(out), "--no-progress"]) == 0
    doc = json.loads((out / "report.json").read_text())
    runs = {r["name"]: r for r in doc["runs"]}
    # about a tenth of the whole trace's 7,386 replayed pods (rows without a GPU or a start are not replayed)
    assert 0.95 * 7386 / DLRM_EVERY <= doc["pods"] <= 1.05 * 7386 / DLRM_EVERY
    assert doc["minutes"] > 31 * 1440 - 60
    assert runs["gpufleet"]["pods_disrupted"] == 0
    assert runs["gpufleet"]["node_hours"] <= 1.2 * runs["oracle"]["node_hours"]
    assert runs["gpufleet"]["cost_usd"] < runs["static-peak"]["cost_usd"]
    assert os.path.getsize(out / "report.md") > 0
