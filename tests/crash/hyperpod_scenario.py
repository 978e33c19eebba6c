"""The crash-point harness's HyperPod scenario: a Slurm cluster's instance group of three 8-GPU nodes,
nothing waiting, two nodes Slurm calls idle and one a job holds (its GPUs read idle too). One reconcile
tick removes exactly the two idle nodes by id (BatchDeleteClusterNodes [emulated]), whatever call fails:
a retry finishes the delete (a node already gone is done) and never repeats or widens it."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from gpufleet.aws.slurm_marks import SlurmMarker, marks_key
from gpufleet.domain import defaults
from gpufleet.domain.models import MarkChannel
from gpufleet_node import schema
from rehearsal import calls as recorded
from rehearsal import moto_hyperpod
from tests.crash.harness import client
from tests.crash.scenarios import TABLE, _ScalerWorld

GROUP = "hyperpod:slurm-a/gpu-workers"
DRAINED = defaults.HYPERPOD_DRAINED_METRIC
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

    def __init__(self, tmp: Path, now: datetime, policy: str = POLICY) -> None:
        super().__init__(policy, tmp, asg=False)
        self.sm = client("sagemaker")
        moto_hyperpod.create_cluster(self.sm, "slurm-a", "gpu-workers", tags={defaults.TAG_MANAGED: "true"})
        [group] = [
            g
            for g in self.sm.describe_cluster(ClusterName="slurm-a")["InstanceGroups"]
            if g["InstanceGroupName"] == "gpu-workers"
        ]
        spec = {k: group[k] for k in ("InstanceGroupName", "InstanceType", "LifeCycleConfig", "ExecutionRole")}
        # Slurm's report lives in the controller node's own namespace, the only one the scaler reads (issue 41).
        self.report_namespace = moto_hyperpod.report_namespace(self.sm, "slurm-a")
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
        self.clients.cloudwatch.put_metric_data(Namespace=self.report_namespace, MetricData=slurm)
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
            n["InstanceId"]
            for n in self.sm.list_cluster_nodes(ClusterName="slurm-a")["ClusterNodeSummaries"]
            if n["InstanceGroupName"] == "gpu-workers"  # not the controller node
        )

    def deliver(self, now: datetime) -> None:
        self.later(now)

    def later(self, now: datetime) -> None:
        assert self.scaler.ctx.fleet.hyperpod is not None
        self.scaler.ctx.fleet.hyperpod.now = lambda: now  # the tick's clock, for the idle window
        slurm = self.scaler.ctx.executor.actuator.markers.get(MarkChannel.SLURM)
        if isinstance(slurm, SlurmMarker):
            slurm.now = lambda: now  # when a drain is asked, on the same clock
        tick = {"gpufleet": "reconcile", "execution_id": f"hp-{now:%H%M}", "scheduled_time": now.isoformat()}
        self.scaler.handle(tick, now)

    def violations(self) -> list[str]:
        problems = self.change_told_and_audited(GROUP)
        [group] = [
            g
            for g in self.sm.describe_cluster(ClusterName="slurm-a")["InstanceGroups"]
            if g["InstanceGroupName"] == "gpu-workers"
        ]
        if self.nodes() != [self.busy] or group["TargetCount"] != 1:
            problems.append(
                f"expected exactly the two idle nodes removed: left {self.nodes()}, count {group['TargetCount']}"
            )
        return problems


class HyperPodAttrition(HyperPodScaleIn):
    """The same cluster with `consolidate: attrition`: the first tick asks Slurm to drain the two idle nodes
    (the marks item in the state table, which the controller applies), a later tick removes them once the
    drain has landed (Slurm's report says drained by gpufleet). Whatever call fails, the drains are asked once
    each, the busy node is never drained or removed, no drain is left on a node that stays, and no mark is
    left for a node that is gone."""

    # A failed close rests the marks MARKS_REST_S (10 min): the tick at 11 asks again, the tick at 20 removes.
    later_minutes = (defaults.MARKS_REST_S // 60 + 1, 20)

    def __init__(self, tmp: Path, now: datetime) -> None:
        attrition = POLICY.replace("    max: 4\n", "    max: 4\n    consolidate: attrition\n    drain_max_share: 100\n")
        super().__init__(tmp, now, attrition)
        self.until = now + timedelta(minutes=25)
        self.drained: set[str] = set()

    def later(self, now: datetime) -> None:
        """The controller's publisher, as far as the tick can tell: a drain asked at T is applied by the run
        after T and reported (DrainedNode, the idle nodes having no job) from the run after that on."""
        with recorded.unrecorded():  # the emulated publisher's calls are no crash points
            item = self.clients.dynamodb.get_item(TableName=TABLE, Key=marks_key("slurm-a")).get("Item", {})
        asked = {
            iid: datetime.fromisoformat(item[f"node#{iid}"]["M"]["at"]["S"])
            for iid in self.idle
            if f"node#{iid}" in item and iid not in self.drained
        }
        data = []
        for iid, at in asked.items():
            first = at.replace(second=0, microsecond=0) + timedelta(minutes=2)
            minutes = int((self.until - first).total_seconds() // 60) + 1
            dims = {**DIMS, "InstanceId": iid}
            data += [self._datum(DRAINED, dims, 1, first + timedelta(minutes=m)) for m in range(minutes)]
            self.drained.add(iid)
        if data:
            with recorded.unrecorded():
                self.clients.cloudwatch.put_metric_data(Namespace=self.report_namespace, MetricData=data)
        super().later(now)

    def violations(self) -> list[str]:
        problems = super().violations()
        item = self.clients.dynamodb.get_item(TableName=TABLE, Key=marks_key("slurm-a")).get("Item", {})
        if f"node#{self.busy}" in item:
            problems.append(f"the busy node {self.busy} was asked to drain")
        left = sorted(k for k in item if k.startswith("node#") and k.removeprefix("node#") not in self.nodes())
        if left:  # the item is one 400 KB DynamoDB item: a mark nobody removes stays forever
            problems.append(f"marks of deleted nodes left in the marks item: {left}")
        return problems
