"""Demand-driven scaling end to end: `gpufleet invoke scaler` (a real subprocess) on moto server, the
cluster's pods served by a Kubernetes API on loopback [emulated] in the API's own format. Unschedulable GPU
pods scale an EKS node group out from 0 in one step with a reason that names them; a node with a running
GPU pod is never a victim, however idle its GPU metrics read; a cluster that refuses the scaler is one
WARNING and the utilization rules."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpufleet.domain.defaults import DRAIN_LABEL
from rehearsal import fleet
from rehearsal.kube_api import KubeApi, kube_api, pod
from tests.integration.conftest import TABLE, Fleet
from tests.integration.test_invoke_events import gpufleet

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TICK = ROOT / "events" / "scaler" / "scheduler-reconcile.json"
TOKEN = "gpufleet-local-token"
POLICY = """
defaults: {scale_out_cooldown_s: 300, scale_in_cooldown_s: 300}
groups:
  - {name: train-gpu, cluster: ml, kind: eks-nodegroup, min: 0, max: 6, demand: {kubernetes: {}}}
"""
ON_TRAIN = {"eks.amazonaws.com/nodegroup": "train-gpu"}


@pytest.fixture
def api() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as served:
        yield served


@pytest.fixture
def train(aws: str, tmp_path: Path) -> Fleet:
    """ml/train-gpu: an EKS managed node group of g5.12xlarge (4 GPUs), at 0 of max 6, tagged."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    backing = fleet.create_nodegroup(
        clients, "ml", "train-gpu", min_size=0, max_size=6, desired=0, tags=fleet.MANAGED_TAG
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg=backing)


def tick(f: Fleet, url: str, token: str = TOKEN) -> tuple[dict[str, Any], str]:
    """One reconcile tick through `gpufleet invoke`; the train-gpu decision and what the function logged."""
    endpoints = json.dumps({"ml": {"url": url, "token": token}})
    proc = gpufleet(
        "invoke", "scaler", "--event", str(TICK), "--endpoint", f.endpoint, "--policy", str(f.policy_path),
        "--table", TABLE, extra_env={"GPUFLEET_KUBE_ENDPOINTS": endpoints},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    found = [d for r in result["results"] for d in r["decisions"] if d["group"] == "eks:ml/train-gpu"]
    assert len(found) == 1, result
    return found[0], proc.stderr


def nodegroup_desired(f: Fleet) -> int:
    ng = f.clients.eks.describe_nodegroup(clusterName="ml", nodegroupName="train-gpu")["nodegroup"]
    return int(ng["scalingConfig"]["desiredSize"])


def test_unschedulable_gpu_pods_scale_a_node_group_out_from_zero_in_one_step(
    train: Fleet, api: tuple[KubeApi, str]
) -> None:
    kube, url = api
    since = (datetime.now(UTC) - timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube.add(
        pod("train-a-0", "team-a", gpus=4, since=since, node_selector=ON_TRAIN),
        pod("train-b-0", "team-a", gpus=4, since=since, node_selector=ON_TRAIN),
        pod("eval-0", "team-b", gpus=2, since=since),
        pod("etl-0", "team-b", gpus=0, since=since),  # waits for CPUs, not GPUs: nobody's GPU demand
        pod("other-0", "team-b", gpus=1, since=since, node_selector={"eks.amazonaws.com/nodegroup": "cpu"}),
    )
    d, _ = tick(train, url)
    assert (d["action"], d["outcome"], d["current"], d["desired"]) == ("scale-out", "applied", 0, 3)
    assert d["trigger"] == "demand:cluster ml"
    assert re.fullmatch(
        r"3 pods \(2x4 GPUs, 1x2\) unschedulable for [45] min: scale out 0 -> 3 \(4 GPUs per node\)", d["reason"]
    ), d["reason"]
    assert nodegroup_desired(train) == 3
    # One listing each; the nodes only as gpufleet labelled them closed (no group consolidates: cheap); one
    # GET per queueing system, which answers 404 where its CRDs are not installed (nothing more is asked).
    assert [r["path"] for r in kube.requests] == [
        "/api/v1/pods",
        "/apis/apps/v1/daemonsets",
        "/api/v1/nodes",
        "/apis/kueue.x-k8s.io/v1beta1/workloads",
        "/apis/kueue.x-k8s.io/v1beta2/workloads",
        "/apis/scheduling.volcano.sh/v1beta1/podgroups",
    ]
    assert kube.requests[2]["query"]["labelSelector"] == DRAIN_LABEL


def test_a_node_running_a_gpu_pod_is_never_a_victim(train: Fleet, api: tuple[KubeApi, str]) -> None:
    """Both nodes read idle (a pod loading weights uses no GPU yet); nothing waits. The idle nodes are
    released, except the one the cluster says runs a GPU pod."""
    kube, url = api
    train.clients.eks.update_nodegroup_config(
        clusterName="ml", nodegroupName="train-gpu", scalingConfig={"minSize": 0, "maxSize": 6, "desiredSize": 2}
    )
    fleet.sync_nodegroup_asgs(train.clients)
    loading, empty = train.instances(train.backing_asg)
    reservations = train.clients.ec2.describe_instances(InstanceIds=[loading])["Reservations"]
    node_name = reservations[0]["Instances"][0]["PrivateDnsName"]
    kube.add(pod("serve-0", "team-b", gpus=4))
    kube.bind("team-b", "serve-0", node_name)
    now = datetime.now(UTC)
    for minute in range(1, 6):
        for instance in (loading, empty):
            train.put_instance_gpu(instance, 0, 1, now - timedelta(minutes=minute))
    d, _ = tick(train, url)
    assert (d["action"], d["outcome"], d["victims"]) == ("scale-in", "applied", [empty]), d["reason"]
    assert "passed over 1 running work" in d["reason"]
    assert train.instances(train.backing_asg) == [loading]


def test_a_cluster_that_refuses_the_scaler_falls_back_to_utilization(train: Fleet, api: tuple[KubeApi, str]) -> None:
    kube, url = api
    kube.add(pod("train-a-0", "team-a", gpus=4, node_selector=ON_TRAIN))
    d, logs = tick(train, url, token="not-an-access-entry")
    assert (d["action"], d["desired"]) == ("hold", 0)
    assert d["trigger"].startswith("utilization-band")  # the utilization rules, as without a source
    warnings = [line for line in logs.splitlines() if "demand source unreadable" in line]
    assert len(warnings) == 1 and "cluster ml" in warnings[0] and "not-an-access-entry" not in logs
    assert nodegroup_desired(train) == 0


def test_a_job_queue_and_a_scheduler_metric_scale_plain_asgs(aws: str, tmp_path: Path) -> None:
    """In-process (so the IAM conformance test sees the calls): an SQS queue of 4-GPU jobs and a Slurm-style
    backlog metric (GPUs requested by pending jobs) each scale their ASG from 0 in one step."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    for name in ("jobs", "slurm"):
        fleet.create_asg(clients, name, min_size=0, max_size=8, desired=0, tags=fleet.MANAGED_TAG)
    sqs = boto3.client("sqs")
    queue = sqs.create_queue(QueueName="train-jobs")["QueueUrl"]
    for i in range(5):
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": i}))
    now = datetime.now(UTC)
    clients.cloudwatch.put_metric_data(
        Namespace="Slurm",
        MetricData=[
            {
                "MetricName": "PendingGPUs",
                "Dimensions": [{"Name": "AutoScalingGroupName", "Value": "slurm"}],
                "Value": 12,
                "Timestamp": now - timedelta(minutes=1),
            }
        ],
    )
    policy = f"""
groups:
  - {{name: jobs, kind: asg, demand: {{sqs: {{queue_url: "{queue}", gpus_per_message: 4}}, gpus_per_node: 8}}}}
  - {{name: slurm, kind: asg, demand: {{metric: {{namespace: Slurm, metric_name: PendingGPUs}}, gpus_per_node: 8}}}}
"""
    f = Fleet(clients=clients, policy_path=tmp_path / "policy.yaml", endpoint=aws, backing_asg="")
    scaler = f.scaler(policy=policy)
    tick_event = json.loads(TICK.read_text())
    result = scaler.handle(tick_event, now)
    by_group = {d["group"]: d for r in result["results"] for d in r["decisions"]}
    jobs, slurm = by_group["asg:jobs"], by_group["asg:slurm"]
    assert (jobs["action"], jobs["desired"]) == ("scale-out", 3)
    assert jobs["reason"] == "5 messages (5x4 GPUs) waiting: scale out 0 -> 3 (8 GPUs per node)"
    assert (slurm["action"], slurm["desired"]) == ("scale-out", 2)
    assert slurm["reason"] == "12 GPU(s) requested by waiting jobs: scale out 0 -> 2 (8 GPUs per node)"
    assert (f.desired("jobs"), f.desired("slurm")) == (3, 2)


def test_doctor_reads_each_demand_source_as_the_scaler_would(
    aws: str,
    tmp_path: Path,
    api: tuple[KubeApi, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cluster answers (through GPUFLEET_KUBE_ENDPOINTS, as for the scaler); a queue that does not exist is
    an error; a metric nobody publishes is a warning. moto has no EKS access entries API [blind spot]: doctor
    says it could not read them instead of passing the cluster."""
    from gpufleet_tools.cli import main

    kube, url = api
    kube.add(pod("train-a-0", "team-a", gpus=4, node_selector=ON_TRAIN))
    monkeypatch.setenv("GPUFLEET_KUBE_ENDPOINTS", json.dumps({"ml": {"url": url, "token": TOKEN}}))
    clients = fleet.Clients.create()
    fleet.create_nodegroup(clients, "ml", "train-gpu", min_size=0, max_size=6, desired=0, tags=fleet.MANAGED_TAG)
    for name in ("jobs", "slurm"):
        fleet.create_asg(clients, name, min_size=0, max_size=8, desired=0, tags=fleet.MANAGED_TAG)
    missing = "https://sqs.us-east-1.amazonaws.com/123456789012/no-such-queue"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        POLICY
        + f"""  - {{name: jobs, kind: asg, demand: {{sqs: {{queue_url: "{missing}"}}, gpus_per_node: 8}}}}
  - {{name: slurm, kind: asg, demand: {{metric: {{namespace: Slurm, metric_name: PendingGPUs}}, gpus_per_node: 8}}}}
"""
    )
    code = main(["doctor", "--policy", str(policy), "--endpoint", aws])
    lines = [line for line in capsys.readouterr().out.splitlines() if "demand source" in line]
    by_group = {line.split()[1].rstrip(":"): line for line in lines}
    assert code == 2, lines
    assert by_group["eks:ml/train-gpu"].startswith("ok")
    assert (
        "the API answers: 1 pod(s) waiting for GPUs now, with the token GPUFLEET_KUBE_ENDPOINTS gives"
        in by_group["eks:ml/train-gpu"]
    )
    assert by_group["asg:jobs"].startswith("error") and "GetQueueAttributes failed" in by_group["asg:jobs"]
    assert by_group["asg:slurm"].startswith("warning") and "no datum in the last 5 minutes" in by_group["asg:slurm"]


def test_an_adopted_backing_asg_is_never_a_group_of_its_own(train: Fleet) -> None:
    """gpufleet tags a node group's ASG gpufleet:managed when it first scales in through it (adoption);
    from then on discovery by tag found that ASG too and held or sized it a second time every tick."""
    train.clients.autoscaling.create_or_update_tags(
        Tags=[
            {
                "ResourceId": train.backing_asg,
                "ResourceType": "auto-scaling-group",
                "Key": "gpufleet:managed",
                "Value": "true",
                "PropagateAtLaunch": False,
            }
        ]
    )
    scaler = train.scaler(policy=POLICY)
    found = [obs.ref.key for obs, _ in scaler.ctx.managed(scaler.ctx.load_policy())]
    assert found == ["eks:ml/train-gpu"]
