"""The crash-point harness's HyperPod scenario: a Slurm cluster's instance group of three 8-GPU nodes,
nothing waiting, two nodes Slurm calls idle and one a job holds (its GPUs read idle too). One reconcile
tick removes exactly the two idle nodes by id (BatchDeleteClusterNodes [emulated]), whatever call fails:
a retry finishes the delete (a node already gone is done) and never repeats or widens it."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import boto3

from gpufleet.domain import defaults
from gpufleet_node import schema
from rehearsal import moto_hyperpod
from tests.crash.scenarios import _ScalerWorld

GROUP = "hyperpod:slurm-a/gpu-workers"
DIMS = {"ClusterName": "slurm-a", "InstanceGroupName": "gpu-workers"}
POLICY = """
discovery: {asg: false, eks: false}
defaults: {scale_in_cooldown_s: 300, idle: {gpu_utilization: 5, memory_percent: 10}}
groups:
  - kind: hyperpod
    cluster: slurm-a
    name: gpu-workers
    min: 0
    max: 4
    demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}
"""


class HyperPodScaleIn(_ScalerWorld):
    later_minutes = (6, 20)

    def __init__(self, tmp: Path, now: datetime) -> None:
        super().__init__(POLICY, tmp, asg=False)
        self.sm = boto3.client("sagemaker")
        moto_hyperpod.create_cluster(self.sm, "slurm-a", "gpu-workers", tags={defaults.TAG_MANAGED: "true"})
        [group] = self.sm.describe_cluster(ClusterName="slurm-a")["InstanceGroups"]
        spec = {k: group[k] for k in ("InstanceGroupName", "InstanceType", "LifeCycleConfig", "ExecutionRole")}
        self.sm.update_cluster(ClusterName="slurm-a", InstanceGroups=[{**spec, "InstanceCount": 3}])
        ids = self.nodes()
        self.busy, self.idle = ids[0], ids[1:]
        # The publishers keep publishing through the retries and the later ticks (up to 25 min after): one
        # PutMetricData per namespace (setup calls cost the sweep's time on every one of its runs).
        minutes = [now + timedelta(minutes=m) for m in range(-6, 26)]
        slurm = [self._datum(defaults.HYPERPOD_PENDING_METRIC, DIMS, 0, at) for at in minutes]
        slurm += [
            self._datum(defaults.HYPERPOD_IDLE_METRIC, {**DIMS, "InstanceId": i}, 1, at)
            for i in self.idle
            for at in minutes
        ]
        gpus = [  # every node's GPUs read idle: only Slurm's word keeps the busy one
            self._datum(metric.name, {schema.DIM_INSTANCE_ID: iid}, value, at)
            for iid in ids
            for at in minutes
            for metric, value in ((schema.GPU_UTILIZATION, 0), (schema.GPU_MEMORY_USED_PERCENT, 1))
        ]
        self.clients.cloudwatch.put_metric_data(Namespace=defaults.HYPERPOD_IDLE_NAMESPACE, MetricData=slurm)
        self.clients.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=gpus)

    @staticmethod
    def _datum(name: str, dims: dict[str, str], value: float, at: datetime) -> dict[str, Any]:
        return {
            "MetricName": name,
            "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
            "Value": value,
            "Timestamp": at,
        }

    def nodes(self) -> list[str]:
        return sorted(
            n["InstanceId"] for n in self.sm.list_cluster_nodes(ClusterName="slurm-a")["ClusterNodeSummaries"]
        )

    def deliver(self, now: datetime) -> None:
        self.later(now)

    def later(self, now: datetime) -> None:
        assert self.scaler.ctx.fleet.hyperpod is not None
        self.scaler.ctx.fleet.hyperpod.now = lambda: now  # the tick's clock, for the idle window
        tick = {"gpufleet": "reconcile", "execution_id": f"hp-{now:%H%M}", "scheduled_time": now.isoformat()}
        self.scaler.handle(tick, now)

    def violations(self) -> list[str]:
        problems = self.change_told_and_audited(GROUP)
        [group] = self.sm.describe_cluster(ClusterName="slurm-a")["InstanceGroups"]
        if self.nodes() != [self.busy] or group["TargetCount"] != 1:
            problems.append(
                f"expected exactly the two idle nodes removed: left {self.nodes()}, count {group['TargetCount']}"
            )
        return problems
