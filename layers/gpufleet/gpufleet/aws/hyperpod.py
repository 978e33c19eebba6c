"""SageMaker HyperPod clusters orchestrated by Slurm: each instance group is a gpufleet group
(`hyperpod:CLUSTER/GROUP`). Read with DescribeCluster and ListClusterNodes; grown or shrunk to a count with
UpdateCluster; idle nodes removed by id with BatchDeleteClusterNodes. docs/hyperpod.md says what it does
and does not do.

Which nodes run a Slurm job is Slurm's to say, not the node's: the backlog publisher on the cluster's
controller node puts `IdleNode` = 1 each minute for every node Slurm reports IDLE (defaults.HYPERPOD_IDLE_*),
into a namespace only the scheduler's role may write. A node is a candidate for removal only if every
recent minute said idle; anything else, or an unreadable answer, keeps it (fail closed). API facts relied
on (SageMaker API reference, botocore's sagemaker model):
- ClusterInstanceStatus (ListClusterNodes' InstanceStatus.Status): Running | Failure | Pending |
  ShuttingDown | SystemUpdating | DeepHealthCheckInProgress | NotFound | DetachInProgress | AttachInProgress;
- UpdateCluster takes the instance groups to change ("Specify the instance groups to update"; removing
  one is InstanceGroupsToDelete, so a group left out is left as it is); each spec needs InstanceCount,
  InstanceGroupName and ExecutionRole (InstanceType and LifeCycleConfig too in older API versions), and
  the reference does not promise that a field left out keeps its value: the spec is copied whole from
  DescribeCluster, only the count changed;
- BatchDeleteClusterNodes: at most 99 node ids a call; answers Successful and Failed (NodeIdNotFound |
  InvalidNodeStatus | NodeIdInUse); the deleted nodes leave the group's count.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.domain import defaults
from gpufleet.domain.models import Action, Decision, GroupKind, GroupObservation, GroupRef, InstanceObservation
from gpufleet_node import schema

# HyperPod's node states as the other kinds' lifecycle words: (lifecycle_state, healthy). Only InService
# nodes are capacity or victims; a node HyperPod is checking, patching or has found broken is neither.
NODE_STATES: dict[str, tuple[str, bool]] = {
    "Running": ("InService", True),
    "Pending": ("Pending", True),
    "AttachInProgress": ("Pending", True),
    "ShuttingDown": ("Terminating", True),
    "DetachInProgress": ("Terminating", True),
    "NotFound": ("Terminated", True),
    "Failure": ("Failure", False),
    "SystemUpdating": ("SystemUpdating", False),
    "DeepHealthCheckInProgress": ("DeepHealthCheckInProgress", False),
}
# What of DescribeCluster's instance group UpdateCluster accepts under the same name (the spec is sent
# whole: a field left out is a field changed), and what it accepts under another.
SPEC_FIELDS = (
    "InstanceGroupName",
    "InstanceType",
    "InstanceRequirements",
    "LifeCycleConfig",
    "ExecutionRole",
    "ThreadsPerCore",
    "InstanceStorageConfigs",
    "OnStartDeepHealthChecks",
    "TrainingPlanArn",
    "OverrideVpcConfig",
    "ScheduledUpdateConfig",
    "SlurmConfig",
    "CapacityRequirements",
    "NetworkInterface",
)
SPEC_RENAMED = {"MinCount": "MinInstanceCount", "DesiredImageId": "ImageId"}
GONE = "NodeIdNotFound"  # a delete retried after the node went: done, not failed
# The OOM guard's answer for a HyperPod node with a failed GPU: no ASG holds it, and HyperPod has its own
# recovery (health checks, automatic node recovery; BatchReplaceClusterNodes by hand). Told, never acted on.
HYPERPOD_NOT_REPLACED = (
    "told only: a HyperPod node is replaced by HyperPod's own node recovery, not by gpufleet "
    "(by hand: aws sagemaker batch-replace-cluster-nodes)"
)


class LazyClient:
    """A boto3 client made on first use: the SageMaker model is large, and a fleet without HyperPod
    groups should not pay for loading it at every cold start."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = self._make()
        return getattr(self._client, name)


class DeleteRefused(RuntimeError):
    """BatchDeleteClusterNodes refused some nodes: the intent is kept and the next invocation retries
    the ones still there (scaling.execution.remaining)."""


def ec2_type(instance_type: str | None) -> str | None:
    """`ml.p5.48xlarge` -> `p5.48xlarge`: the EC2 name DescribeInstanceTypes knows (GPUs per node)."""
    if not instance_type:
        return None
    return instance_type.removeprefix("ml.")


def node_observation(node: dict[str, Any], runs_gpu_work: bool) -> InstanceObservation:
    status = str(node.get("InstanceStatus", {}).get("Status", ""))
    lifecycle, healthy = NODE_STATES.get(status, (status or "Unknown", False))
    return InstanceObservation(
        instance_id=node["InstanceId"],
        lifecycle_state=lifecycle,
        instance_type=ec2_type(node.get("InstanceType")),
        healthy=healthy,
        runs_gpu_work=runs_gpu_work,
    )


def update_spec(group: dict[str, Any], count: int) -> dict[str, Any]:
    """The instance group's spec for UpdateCluster: everything DescribeCluster said, the count changed."""
    spec = {k: group[k] for k in SPEC_FIELDS if group.get(k) is not None}
    spec.update({new: group[old] for old, new in SPEC_RENAMED.items() if group.get(old) is not None})
    spec["InstanceCount"] = count
    return spec


def idle_nodes(minutes: dict[str, list[float]]) -> set[str]:
    """Nodes whose recent minutes all said idle: at least HYPERPOD_IDLE_MINUTES less the missing minute
    forgiven, each datum 1 (anything else - a 0, a NaN - is not Slurm's idle and keeps the node)."""
    need = defaults.HYPERPOD_IDLE_MINUTES - defaults.HYPERPOD_IDLE_MISSING_OK
    return {iid for iid, values in minutes.items() if len(values) >= need and all(v == 1.0 for v in values)}


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


@dataclass
class HyperPodFleet:
    """Reads and changes HyperPod instance groups named by policy rules (no tag discovery: each group
    is named, with its cluster and a max)."""

    sagemaker: Any
    cloudwatch: Any
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    namespace: str = defaults.HYPERPOD_IDLE_NAMESPACE

    # ---- reading ----

    def observe(self, refs: Iterable[GroupRef]) -> list[GroupObservation]:
        """The named groups that exist, with their nodes and which of those Slurm does not call idle. A
        cluster that is gone, or orchestrated by EKS (not this adapter's), is skipped."""
        by_cluster: dict[str, list[str]] = {}
        for ref in refs:
            if ref.kind is GroupKind.HYPERPOD and ref.cluster:
                by_cluster.setdefault(ref.cluster, []).append(ref.name)
        found: list[tuple[GroupRef, dict[str, Any], dict[str, str], list[dict[str, Any]]]] = []
        for cluster_name, names in sorted(by_cluster.items()):
            cluster = self._cluster(cluster_name)
            if cluster is None or "Eks" in (cluster.get("Orchestrator") or {}):
                continue
            tags = self._tags(cluster["ClusterArn"])
            groups = {g["InstanceGroupName"]: g for g in cluster.get("InstanceGroups", [])}
            for name in sorted(set(names)):
                if name in groups:
                    ref = GroupRef(kind=GroupKind.HYPERPOD, cluster=cluster_name, name=name)
                    found.append((ref, groups[name], tags, self._nodes(cluster_name, name)))
        running = [(ref, n["InstanceId"]) for ref, _, _, nodes in found for n in nodes if _running(n)]
        idle, closed = self._idle(running)
        return [_observation(ref, group, tags, nodes, idle, closed) for ref, group, tags, nodes in found]

    def _cluster(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.sagemaker.describe_cluster(ClusterName=name))
        except (
            ClientError
        ) as exc:  # SageMaker answers a missing cluster with ResourceNotFound (moto: ValidationException)
            if error_code(exc) in ("ResourceNotFound", "ResourceNotFoundException", "ValidationException"):
                return None
            raise

    def _tags(self, arn: str) -> dict[str, str]:
        tags: dict[str, str] = {}
        token: str | None = None
        while True:
            page = self.sagemaker.list_tags(ResourceArn=arn, **({"NextToken": token} if token else {}))
            tags.update({t["Key"]: t.get("Value", "") for t in page.get("Tags", [])})
            token = page.get("NextToken")
            if not token:
                return tags

    def _nodes(self, cluster: str, group: str) -> list[dict[str, Any]]:
        """Every node of the group (all pages). The filter is a substring match: the exact name is kept."""
        nodes: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            args: dict[str, Any] = {
                "ClusterName": cluster,
                "InstanceGroupNameContains": group,
                "MaxResults": defaults.LIST_CLUSTER_NODES_MAX_RESULTS,
            }
            if token:
                args["NextToken"] = token
            page = self.sagemaker.list_cluster_nodes(**args)
            nodes.extend(n for n in page.get("ClusterNodeSummaries", []) if n.get("InstanceGroupName") == group)
            token = page.get("NextToken")
            if not token:
                return nodes

    def _idle(self, running: Sequence[tuple[GroupRef, str]]) -> tuple[set[str], str | None]:
        """The Running nodes Slurm has called idle every recent minute, or why that cannot be told (then
        none is). One GetMetricData query per node (Minimum, 60 s): each datum is one minute that said
        idle, so the count of data and their values answer both questions at one metric's price."""
        if not running:
            return set(), None
        end = self.now().replace(second=0, microsecond=0)  # whole minutes, the current one left out
        start = end - timedelta(minutes=defaults.HYPERPOD_IDLE_MINUTES)
        minutes: dict[str, list[float]] = {iid: [] for _, iid in running}
        try:
            for batch in _chunks(list(running), defaults.GET_METRIC_DATA_MAX_QUERIES):
                self._read_batch(batch, start, end, minutes)
        except AWS_FAILURES as exc:
            return set(), f"GetMetricData failed ({error_code(exc)}): which nodes Slurm calls idle is unknown"
        except _Incomplete as exc:
            return set(), str(exc)
        return idle_nodes(minutes), None

    def _read_batch(
        self, batch: Sequence[tuple[GroupRef, str]], start: datetime, end: datetime, into: dict[str, list[float]]
    ) -> None:
        ids = {f"n{i}": iid for i, (_, iid) in enumerate(batch)}
        queries = [
            {
                "Id": qid,
                "MetricStat": {
                    "Metric": {
                        "Namespace": self.namespace,
                        "MetricName": defaults.HYPERPOD_IDLE_METRIC,
                        "Dimensions": [
                            {"Name": k, "Value": v}
                            for k, v in {**ref.metric_dimensions, schema.DIM_INSTANCE_ID: iid}.items()
                        ],
                    },
                    "Period": 60,
                    "Stat": "Minimum",
                },
                "ReturnData": True,
            }
            for qid, (ref, iid) in zip(ids, batch, strict=True)
        ]
        token: str | None = None
        while True:
            args: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": start, "EndTime": end}
            if token:
                args["NextToken"] = token
            page = self.cloudwatch.get_metric_data(**args)
            for res in page.get("MetricDataResults", []):
                if res.get("StatusCode", "Complete") not in ("Complete", "PartialData"):
                    raise _Incomplete(f"GetMetricData answered {res.get('StatusCode')} for the Slurm idle report")
                into[ids[res["Id"]]].extend(float(v) for v in res.get("Values", []))
            token = page.get("NextToken")
            if not token:
                return

    # ---- changing ----

    def apply(self, decision: Decision, obs: GroupObservation) -> str:
        """Set the group's count (UpdateCluster), or remove the chosen idle nodes by id. Safe to repeat:
        a count already reached is not asked again, a node already gone is done."""
        ref = obs.ref
        if decision.action in (Action.SCALE_OUT, Action.SET_DESIRED):
            return self.set_count(ref, decision.desired)
        if decision.action is Action.SCALE_IN:
            return self.delete_nodes(decision, obs)
        return "nothing to apply"

    def set_count(self, ref: GroupRef, count: int) -> str:
        cluster = self._cluster(ref.cluster or "")
        groups = {g["InstanceGroupName"]: g for g in (cluster or {}).get("InstanceGroups", [])}
        group = groups.get(ref.name)
        if group is None:
            raise LookupError(f"{ref.key}: the cluster or its instance group is gone")
        if group.get("TargetCount") == count:
            return f"UpdateCluster {ref.key}: InstanceCount already {count}"
        self.sagemaker.update_cluster(ClusterName=ref.cluster, InstanceGroups=[update_spec(group, count)])
        return f"UpdateCluster {ref.key} InstanceCount = {count}"

    def delete_nodes(self, decision: Decision, obs: GroupObservation) -> str:
        """The victims that are still InService and still idle by this observation (a retry after a job
        landed on one keeps it), in calls of at most 99; raises DeleteRefused when SageMaker refused any."""
        now_idle = {i.instance_id for i in obs.instances if i.in_service and not i.runs_gpu_work}
        victims = [v for v in decision.victims if v in now_idle]
        kept = [v for v in decision.victims if v not in now_idle]
        if obs.scale_in_closed is not None:
            victims, kept = [], list(decision.victims)
        done: list[str] = []
        refused: list[str] = []
        for batch in _chunks(victims, defaults.HYPERPOD_DELETE_MAX_NODES):
            answer = self.sagemaker.batch_delete_cluster_nodes(ClusterName=obs.ref.cluster, NodeIds=list(batch))
            done.extend(answer.get("Successful", []))
            for failed in answer.get("Failed", []):
                if failed.get("Code") == GONE:
                    done.append(failed["NodeId"])
                else:
                    refused.append(f"{failed['NodeId']} ({failed.get('Code')}: {failed.get('Message', '')})")
        text = f"BatchDeleteClusterNodes {obs.ref.key} {', '.join(done)}" if done else "victims already gone"
        if kept:
            text += f"; kept {', '.join(kept)} (no longer idle by Slurm, or not in service)"
        if refused:
            raise DeleteRefused(f"{text}; refused {', '.join(refused)}")
        return text


class _Incomplete(RuntimeError):
    pass


def _running(node: dict[str, Any]) -> bool:
    return bool(node.get("InstanceStatus", {}).get("Status") == "Running")


def _observation(
    ref: GroupRef,
    group: dict[str, Any],
    tags: dict[str, str],
    nodes: list[dict[str, Any]],
    idle: set[str],
    closed: str | None,
) -> GroupObservation:
    """A node Slurm has not called idle runs work (never a victim); with the report unreadable, every
    node does and the group is closed for scale-in (the core says why)."""
    instances = tuple(node_observation(n, closed is not None or n["InstanceId"] not in idle) for n in nodes)
    instance_type = ec2_type(group.get("InstanceType"))
    floor = int(group.get("MinCount") or 0)
    return GroupObservation(
        ref=ref,
        min_size=floor,
        max_size=max(defaults.HYPERPOD_NO_MAX, floor),
        desired=int(group.get("TargetCount", group.get("CurrentCount", 0)) or 0),
        instances=instances,
        tags=tags,
        instance_types=(instance_type,) if instance_type else (),
        scale_in_closed=closed,
    )
