"""A HyperPod Slurm cluster's instance group sized by the scaler on moto server (UpdateCluster and
BatchDeleteClusterNodes [emulated]: rehearsal.moto_hyperpod): the Slurm backlog scales it 0 -> 2; with the
backlog gone, the node Slurm has called idle for five minutes is removed by id and the one it has not
(a job took it in the latest minute: the publisher stopped saying idle) is kept, however idle its GPUs
read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import pytest

from gpufleet.domain import defaults
from gpufleet_node import schema
from rehearsal import fleet, moto_hyperpod
from tests.integration.conftest import TABLE, Fleet, decisions, tick

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 23, 8, 12, 30, tzinfo=UTC)
DIMS = {"ClusterName": "slurm-a", "InstanceGroupName": "gpu-workers"}
POLICY = """
defaults: {scale_out_cooldown_s: 300, scale_in_cooldown_s: 300}
groups:
  - kind: hyperpod
    cluster: slurm-a
    name: gpu-workers
    min: 0
    max: 4
    demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}}  # 8 GPUs per node: its type ml.p5.48xlarge says
"""


@pytest.fixture
def hyperpod(aws: str, tmp_path: Path) -> Fleet:
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    moto_hyperpod.create_cluster(boto3.client("sagemaker"), "slurm-a", "gpu-workers", tags=fleet.MANAGED_TAG)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")


def _put(cw: Any, name: str, dims: dict[str, str], value: float, at: datetime) -> None:
    cw.put_metric_data(
        Namespace=defaults.HYPERPOD_IDLE_NAMESPACE,
        MetricData=[
            {
                "MetricName": name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Value": value,
                "Timestamp": at,
            }
        ],
    )


def _group(sm: Any) -> dict[str, Any]:
    [group] = sm.describe_cluster(ClusterName="slurm-a")["InstanceGroups"]
    return dict(group)


def _nodes(sm: Any) -> list[str]:
    return sorted(n["InstanceId"] for n in sm.list_cluster_nodes(ClusterName="slurm-a")["ClusterNodeSummaries"])


def _tick(f: Fleet, at: datetime, n: int) -> dict[str, Any]:
    scaler = f.scaler()
    assert scaler.ctx.fleet.hyperpod is not None
    scaler.ctx.fleet.hyperpod.now = lambda: at  # the simulated clock the idle window is read on
    [d] = [d for d in decisions(scaler.handle(tick(f"hp-{n}", at), at)) if d["group"] == "hyperpod:slurm-a/gpu-workers"]
    return d


def test_backlog_scales_out_then_only_the_node_slurm_calls_idle_is_removed(hyperpod: Fleet) -> None:
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 16, T0 - timedelta(minutes=1))
    out = _tick(hyperpod, T0, 1)
    assert out["action"] == "scale-out" and out["outcome"] == "applied", out
    assert (_group(sm)["TargetCount"], len(_nodes(sm))) == (2, 2)

    t1 = T0 + timedelta(minutes=30)
    idle, busy = _nodes(sm)
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 0, t1 - timedelta(minutes=1))
    for minute in range(1, defaults.HYPERPOD_IDLE_MINUTES + 1):
        _put(
            cw, defaults.HYPERPOD_IDLE_METRIC, {**DIMS, schema.DIM_INSTANCE_ID: idle}, 1, t1 - timedelta(minutes=minute)
        )
    for minute in range(2, defaults.HYPERPOD_IDLE_MINUTES + 1):  # idle until a job took it in the latest minute
        _put(
            cw, defaults.HYPERPOD_IDLE_METRIC, {**DIMS, schema.DIM_INSTANCE_ID: busy}, 1, t1 - timedelta(minutes=minute)
        )
    for node in (idle, busy):  # both nodes' GPUs read idle: only Slurm's word tells them apart
        hyperpod.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    scaled_in = _tick(hyperpod, t1, 2)
    assert scaled_in["action"] == "scale-in" and scaled_in["outcome"] == "applied", scaled_in
    assert scaled_in["victims"] == [idle] and "BatchDeleteClusterNodes" in scaled_in["detail"]
    assert _nodes(sm) == [busy] and _group(sm)["TargetCount"] == 1


def test_max_lowered_below_the_count_removes_no_busy_node_and_reads_no_report(
    hyperpod: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lower max (a window's max alike) is no lower InstanceCount: HyperPod would choose which nodes go.
    Both nodes run jobs and their GPUs read busy: the decision holds and says why, UpdateCluster is not
    called again, and Slurm's report is not read (no node's GPUs read idle: none could be a victim)."""
    from gpufleet.aws.hyperpod import HyperPodFleet

    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 16, T0 - timedelta(minutes=1))
    assert _tick(hyperpod, T0, 1)["action"] == "scale-out"
    nodes = _nodes(sm)
    reads: list[int] = []
    real = HyperPodFleet._idle
    monkeypatch.setattr(
        HyperPodFleet, "_idle", lambda self, running, now=None: (reads.append(1), real(self, running, now))[1]
    )
    t1 = T0 + timedelta(minutes=30)
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 0, t1 - timedelta(minutes=1))
    for node in nodes:
        hyperpod.put_instance_gpu(node, 95.0, 80.0, t1 - timedelta(minutes=2))
    hyperpod.policy_path.write_text(POLICY.replace("max: 4", "max: 1"))
    held = _tick(hyperpod, t1, 2)
    assert held["action"] == "hold" and "above max 1" in held["reason"] and "no instance is idle" in held["reason"]
    assert _nodes(sm) == nodes and _group(sm)["TargetCount"] == 2 and reads == []


def test_a_node_the_latest_landed_report_calls_busy_is_kept(hyperpod: Fleet) -> None:
    """The publisher sends nothing for a node a job holds: the current minute's report (its PendingGPUs
    datum, sent in the same call) landed with IdleNode for one node only, so the other is busy now,
    however idle its older minutes and its GPUs (a job still staging) read."""
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 16, T0 - timedelta(minutes=1))
    assert _tick(hyperpod, T0, 1)["action"] == "scale-out"
    idle, busy = _nodes(sm)
    t1 = T0 + timedelta(minutes=30)
    current = t1.replace(second=0)
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 0, current)
    for node, newest in ((idle, 0), (busy, 1)):
        for minute in range(newest, defaults.HYPERPOD_IDLE_MINUTES + 1):
            dims = {**DIMS, schema.DIM_INSTANCE_ID: node}
            _put(cw, defaults.HYPERPOD_IDLE_METRIC, dims, 1, current - timedelta(minutes=minute))
        hyperpod.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    out = _tick(hyperpod, t1, 2)
    assert out["action"] == "scale-in" and out["victims"] == [idle], out
    assert _nodes(sm) == [busy]
