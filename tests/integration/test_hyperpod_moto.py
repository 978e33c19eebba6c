"""A HyperPod Slurm cluster's instance group sized by the scaler on moto server (UpdateCluster and
BatchDeleteClusterNodes [emulated]: rehearsal.moto_hyperpod). The cluster has Slurm's controller group
(one node, SlurmConfig.NodeType Controller, an execution role of its own): the controller node's publisher
writes Slurm's report into its own namespace, Slurm/<role id>:SageMaker (HyperPod names every node's
session SageMaker), the only one the scaler reads. The Slurm backlog scales the group 0 -> 2; with the backlog gone, the
node Slurm has called idle for five minutes is removed by id and the one it has not (a job took it in the
latest minute: the publisher stopped saying idle) is kept, however idle its GPUs read.

Forgeries (issue 41): a report written anywhere else - plain `Slurm` (any role with PutMetricData there: a
CloudWatch agent's), or a worker's own `Slurm/<worker role id>:SageMaker` - never removes a node and never
sizes the group; the data ignored is told once. A controller role shared with the workers (what AWS's
samples do) gives them the controller's aws:userid: no report of such a cluster is trusted."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest

from gpufleet.aws.hyperpod import update_spec
from gpufleet.aws.slurm_marks import SlurmMarker
from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet_node import schema
from rehearsal import fleet, moto_hyperpod
from tests.integration.conftest import TABLE, Fleet, decisions, tick

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 23, 8, 12, 30, tzinfo=UTC)
DIMS = {"ClusterName": "slurm-a", "InstanceGroupName": "gpu-workers"}
KEY = "hyperpod:slurm-a/gpu-workers"
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
# The same group with its backlog in a namespace of its own (`Jobs`, read as named: no Slurm report), so
# what Slurm's word does to a scale-in is seen whatever reads the Slurm backlog.
JOBS = "Jobs"
NO_DEMAND = POLICY.replace("namespace: Slurm", f"namespace: {JOBS}")
ATTRITION = NO_DEMAND.replace("    max: 4\n", "    max: 4\n    consolidate: attrition\n    drain_max_share: 100\n")


@pytest.fixture
def hyperpod(aws: str, tmp_path: Path) -> Fleet:
    return hyperpod_fleet(aws, tmp_path)


def hyperpod_fleet(aws: str, tmp_path: Path) -> Fleet:
    """slurm-a's gpu-workers at 0 of max 4, sized by Slurm's backlog (POLICY), on moto server."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    moto_hyperpod.create_cluster(boto3.client("sagemaker"), "slurm-a", "gpu-workers", tags=fleet.MANAGED_TAG)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")


def _put(cw: Any, name: str, dims: dict[str, str], value: float, at: datetime, namespace: str) -> None:
    cw.put_metric_data(
        Namespace=namespace,
        MetricData=[
            {
                "MetricName": name,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                "Value": value,
                "Timestamp": at,
            }
        ],
    )


def _own(sm: Any) -> str:
    """The controller node's own namespace: where its publisher writes."""
    return moto_hyperpod.report_namespace(sm, "slurm-a")


def _group(sm: Any) -> dict[str, Any]:
    [group] = [
        g
        for g in sm.describe_cluster(ClusterName="slurm-a")["InstanceGroups"]
        if g["InstanceGroupName"] == "gpu-workers"
    ]
    return dict(group)


def _nodes(sm: Any) -> list[str]:
    """The worker group's nodes (the controller node is not one of them)."""
    listed = sm.list_cluster_nodes(ClusterName="slurm-a")["ClusterNodeSummaries"]
    return sorted(n["InstanceId"] for n in listed if n["InstanceGroupName"] == "gpu-workers")


def _grow(sm: Any, count: int) -> list[str]:
    """The worker group at `count` nodes (UpdateCluster [emulated], as a scale-out would)."""
    sm.update_cluster(ClusterName="slurm-a", InstanceGroups=[update_spec(_group(sm), count)])
    return _nodes(sm)


def _tick(f: Fleet, at: datetime, n: int) -> dict[str, Any]:
    _put(f.clients.cloudwatch, defaults.HYPERPOD_PENDING_METRIC, DIMS, 0, at - timedelta(minutes=1), JOBS)
    scaler = f.scaler()
    assert scaler.ctx.fleet.hyperpod is not None
    scaler.ctx.fleet.hyperpod.now = lambda: at  # the simulated clock the idle window is read on
    [d] = [d for d in decisions(scaler.handle(tick(f"hp-{n}", at), at)) if d["group"] == KEY]
    return d


def _report(
    cw: Any, namespace: str, at: datetime, idle: dict[str, int], drained: tuple[str, ...] = (), pending: float = 0
) -> None:
    """One publisher run's whole report into `namespace`: the backlog, then IdleNode for each idle node
    (`idle`: node -> the newest minute back it is idle up to, 0: the current one), DrainedNode for `drained`,
    for every minute of the window up to the current one."""
    current = at.replace(second=0)
    for minute in range(0, defaults.HYPERPOD_IDLE_MINUTES + 1):
        when = current - timedelta(minutes=minute)
        _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, pending, when, namespace)
        for node, newest in idle.items():
            if minute >= newest:
                _put(cw, defaults.HYPERPOD_IDLE_METRIC, {**DIMS, schema.DIM_INSTANCE_ID: node}, 1, when, namespace)
        for node in drained:
            _put(cw, defaults.HYPERPOD_DRAINED_METRIC, {**DIMS, schema.DIM_INSTANCE_ID: node}, 1, when, namespace)


def _forge(cw: Any, sm: Any, at: datetime, nodes: list[str], drained: tuple[str, ...] = (), pending: float = 0) -> None:
    """The forger's report that every node is idle (and `drained` drained), written where its roles let it:
    plain `Slurm` (CloudWatchAgentServerPolicy, no Deny) and a worker's own namespace (its own role's)."""
    worker = schema.slurm_namespace(moto_hyperpod.node_userid(sm, "slurm-a", nodes[0]))
    for namespace in (defaults.HYPERPOD_IDLE_NAMESPACE, worker):
        _report(cw, namespace, at, dict.fromkeys(nodes, 0), drained, pending)


def test_backlog_scales_out_then_only_the_node_slurm_calls_idle_is_removed(hyperpod: Fleet) -> None:
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 16, T0 - timedelta(minutes=1), _own(sm))
    out = _tick(hyperpod, T0, 1)
    assert out["action"] == "scale-out" and out["outcome"] == "applied", out
    assert (_group(sm)["TargetCount"], len(_nodes(sm))) == (2, 2)

    t1 = T0 + timedelta(minutes=30)
    idle, busy = _nodes(sm)
    _report(cw, _own(sm), t1 - timedelta(minutes=1), {idle: 0, busy: 1})  # a job took `busy` a minute ago
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
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 16, T0 - timedelta(minutes=1), _own(sm))
    assert _tick(hyperpod, T0, 1)["action"] == "scale-out"
    nodes = _nodes(sm)
    reads: list[int] = []
    real = HyperPodFleet._idle

    def counted(self: HyperPodFleet, running: Any, now: Any = None, asked: Any = None) -> Any:
        reads.append(1)
        return real(self, running, now, asked)

    monkeypatch.setattr(HyperPodFleet, "_idle", counted)
    t1 = T0 + timedelta(minutes=30)
    _put(cw, defaults.HYPERPOD_PENDING_METRIC, DIMS, 0, t1 - timedelta(minutes=1), _own(sm))
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
    hyperpod.policy_path.write_text(NO_DEMAND)
    idle, busy = _grow(sm, 2)
    t1 = T0 + timedelta(minutes=30)
    _report(cw, _own(sm), t1, {idle: 0, busy: 1})
    for node in (idle, busy):
        hyperpod.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    out = _tick(hyperpod, t1, 2)
    assert out["action"] == "scale-in" and out["victims"] == [idle], out
    assert _nodes(sm) == [busy]


# ---- issue 41: forged reports ----


def test_a_forged_idle_report_for_a_node_whose_job_is_staging_removes_nothing(
    hyperpod: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A job is staging on `staging` (its GPUs read idle, Slurm has it allocated: the controller's report
    says nothing of it). A forger puts IdleNode=1 for it every minute, with the report's marker, in plain
    `Slurm` and in a worker's own namespace: neither is read, the node stays; the ignored data is told once.
    Before: the plain `Slurm` forgery deleted it (BatchDeleteClusterNodes)."""
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    hyperpod.policy_path.write_text(NO_DEMAND)
    idle, staging = _grow(sm, 2)
    t1 = T0 + timedelta(minutes=30)
    _report(cw, _own(sm), t1, {idle: 0})  # the controller: only `idle` is idle
    _forge(cw, sm, t1, [staging, idle])
    for node in (idle, staging):
        hyperpod.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    with caplog.at_level(logging.WARNING):
        out = _tick(hyperpod, t1, 1)
    assert out["action"] == "scale-in" and out["victims"] == [idle], out
    assert _nodes(sm) == [staging]
    told = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
    worker = schema.slurm_namespace(moto_hyperpod.node_userid(sm, "slurm-a", staging))
    assert sorted(line.split("namespace ")[1].split(" ")[0] for line in told) == sorted(["Slurm", worker]), told


def test_a_forged_idle_and_drained_report_for_a_draining_node_removes_nothing(hyperpod: Fleet) -> None:
    """Consolidation by attrition: gpufleet asked Slurm to drain `draining` long ago; its job still runs (the
    controller reports it neither idle nor drained). A forger's IdleNode + DrainedNode for it, in plain
    `Slurm` and a worker's own namespace, remove nothing. Before: the plain `Slurm` forgery deleted it."""
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    hyperpod.policy_path.write_text(ATTRITION)
    draining, other = _grow(sm, 2)
    t1 = T0 + timedelta(minutes=30)
    marker = SlurmMarker(hyperpod.clients.dynamodb, TABLE, now=lambda: T0)
    group = SimpleNamespace(ref=GroupRef(kind=GroupKind.HYPERPOD, cluster="slurm-a", name="gpu-workers"))
    marker.close(group, [draining], "surplus")  # type: ignore[arg-type]
    _report(cw, _own(sm), t1, {})  # the controller: no node idle (`other` runs a job too)
    _forge(cw, sm, t1, [draining], drained=(draining,))
    for node in (draining, other):
        hyperpod.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    out = _tick(hyperpod, t1, 1)
    assert out["action"] != "scale-in" or draining not in out["victims"], out
    assert _nodes(sm) == sorted([draining, other])


def test_with_the_controllers_publisher_down_a_forged_report_removes_nothing(hyperpod: Fleet) -> None:
    """The controller's publisher stopped (its namespace has nothing): a forged report of both nodes idle,
    in plain `Slurm` and a worker's own namespace, is no report: the group is closed for scale-in as stale,
    saying where it looked. Before: the forgery deleted both nodes."""
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    hyperpod.policy_path.write_text(NO_DEMAND)
    nodes = _grow(sm, 2)
    t1 = T0 + timedelta(minutes=30)
    _forge(cw, sm, t1, nodes)
    for node in nodes:
        hyperpod.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    out = _tick(hyperpod, t1, 1)
    assert out["action"] != "scale-in", out
    assert _nodes(sm) == nodes and _group(sm)["TargetCount"] == 2


def test_a_forged_backlog_beside_the_controllers_zero_scales_nothing(hyperpod: Fleet) -> None:
    """The controller says 0 GPUs wait; a forger says 1e6 in plain `Slurm` and a worker's own namespace.
    The group stays at 1. Before: the plain `Slurm` datum scaled it 1 -> 4 ml.p5.48xlarge (its max)."""
    sm, cw = boto3.client("sagemaker"), hyperpod.clients.cloudwatch
    nodes = _grow(sm, 1)
    _report(cw, _own(sm), T0, {})
    _forge(cw, sm, T0, nodes, pending=1e6)
    for node in nodes:
        hyperpod.put_instance_gpu(node, 95.0, 80.0, T0 - timedelta(minutes=2))
    out = _tick(hyperpod, T0, 1)
    assert out["action"] != "scale-out", out
    assert _group(sm)["TargetCount"] == 1


def test_a_cluster_whose_controller_cannot_be_told_trusts_no_report(aws: str, tmp_path: Path) -> None:
    """A cluster configured by provisioning_parameters.json: no instance group carries SlurmConfig, so
    DescribeCluster does not say which is the controller. Without the cluster tag naming it, no report is
    trusted (a report in the controller's namespace included): nothing is removed, and the decision says
    why. With the tag, the controller's report is read."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    sm = boto3.client("sagemaker")
    arn = moto_hyperpod.create_cluster(sm, "slurm-a", "gpu-workers", tags=fleet.MANAGED_TAG, slurm_config=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text(NO_DEMAND)
    f = Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")
    idle, other = _grow(sm, 2)
    t1 = T0 + timedelta(minutes=30)
    _report(clients.cloudwatch, _own(sm), t1, {idle: 0})
    for node in (idle, other):
        f.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    held = _tick(f, t1, 1)
    assert held["action"] != "scale-in" and _nodes(sm) == [idle, other], held
    sm.add_tags(
        ResourceArn=arn, Tags=[{"Key": defaults.HYPERPOD_CONTROLLER_GROUP_TAG, "Value": moto_hyperpod.CONTROLLER_GROUP}]
    )
    out = _tick(f, t1, 2)
    assert out["action"] == "scale-in" and out["victims"] == [idle], out


def test_a_controller_role_shared_with_the_workers_trusts_no_report(aws: str, tmp_path: Path) -> None:
    """One execution role for the controller and worker groups: every node's credentials carry the same
    aws:userid (<role id>:SageMaker), so a worker could write the controller's namespace itself. Its idle
    report is not trusted: nothing is removed, and the scaler says why (once, in its log)."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    sm = boto3.client("sagemaker")
    moto_hyperpod.create_cluster(
        sm, "slurm-a", "gpu-workers", tags=fleet.MANAGED_TAG, controller_role=moto_hyperpod.EXECUTION_ROLE
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(NO_DEMAND)
    f = Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg="")
    idle, other = _grow(sm, 2)
    t1 = T0 + timedelta(minutes=30)
    _report(clients.cloudwatch, _own(sm), t1, {idle: 0, other: 0})  # written by a worker: the same namespace
    for node in (idle, other):
        f.put_instance_gpu(node, 0.0, 0.0, t1 - timedelta(minutes=2))
    held = _tick(f, t1, 1)
    assert held["action"] != "scale-in" and _nodes(sm) == [idle, other], held
    hyperpod = f.scaler().ctx.fleet.hyperpod
    assert hyperpod is not None
    source = hyperpod.sources.source("slurm-a", t1)
    assert source.namespace is None and "is shared with gpu-workers" in source.why, source
