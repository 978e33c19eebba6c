"""EMULATED: SageMaker HyperPod's UpdateCluster and BatchDeleteClusterNodes on moto's clusters.

moto has CreateCluster, DescribeCluster, ListClusterNodes and ListTags for HyperPod clusters, but not the
two calls gpufleet sizes an instance group with. These are emulated here (rehearsal.moto_ext installs them
on moto server) after the API reference, and are answered over the normal API:

- UpdateCluster: each instance group's spec must carry InstanceCount, InstanceGroupName and ExecutionRole
  (ValidationException otherwise); a group the cluster lacks is refused (the real API would add it: gpufleet
  never asks that). The group's TargetCount becomes InstanceCount; nodes are added (ids i-<17 hex>) or the
  newest removed at once, so CurrentCount follows at once too.
- BatchDeleteClusterNodes: at most 99 ids (ValidationException above); an id the cluster does not hold is
  answered in Failed with NodeIdNotFound; the others are removed at once and leave their group's count.

What moto (and this emulation) hides, and where gpufleet is guarded for it instead:
- every node is Running at once: no Pending, ShuttingDown, Failure, SystemUpdating or
  DeepHealthCheckInProgress (tests/adapters/aws/test_hyperpod.py reads a fake node list with each state; the
  rehearsal can set one here: POST /_gpufleet/emulation/hyperpod-node-status);
- no delete is ever refused with InvalidNodeStatus or NodeIdInUse (the unit tests' fake client refuses);
- no deep health check blocks UpdateCluster, no cluster is ever Updating; no IAM;
- no Slurm: sinfo's node states and scontrol's drain/resume are emulated apart (rehearsal/slurm_emulation.py),
  and the drains gpufleet asks for live in the state table (aws/slurm_marks.py), which moto's DynamoDB holds.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from moto.core.responses import ActionResult

from gpufleet.domain import defaults
from gpufleet_node import schema

NODE_STATUS_PATH = "/_gpufleet/emulation/hyperpod-node-status"
DELETE_MAX = 99
_REQUIRED = ("InstanceCount", "InstanceGroupName", "ExecutionRole")


def _cluster(backend: Any, name: str) -> Any:
    from moto.sagemaker.exceptions import ValidationError

    cluster = backend.clusters.get(str(name).split("/")[-1])
    if cluster is None:
        raise ValidationError(message=f"Could not find cluster '{name}'.")
    return cluster


def _add_node(backend: Any, cluster: Any, group: dict[str, Any]) -> None:
    from moto.sagemaker.models import ClusterNode

    node_id = "i-" + secrets.token_hex(9)[:17]
    cluster.nodes[node_id] = ClusterNode(
        region_name=backend.region_name,
        account_id=backend.account_id,
        cluster_name=cluster.cluster_name,
        instance_group_name=group["InstanceGroupName"],
        instance_type=group.get("InstanceType", ""),
        life_cycle_config=group.get("LifeCycleConfig", {}),
        execution_role=group["ExecutionRole"],
        node_id=node_id,
        threads_per_core=group.get("ThreadsPerCore"),
    )


def update_cluster(backend: Any, name: str, specs: list[dict[str, Any]]) -> str:
    from moto.sagemaker.exceptions import ValidationError

    cluster = _cluster(backend, name)
    groups = {g["InstanceGroupName"]: g for g in cluster.instance_groups}
    for spec in specs:
        missing = [k for k in _REQUIRED if spec.get(k) is None]
        if missing:
            raise ValidationError(message=f"InstanceGroups: {', '.join(missing)} required [emulated]")
        group = groups.get(spec["InstanceGroupName"])
        if group is None:
            raise ValidationError(message=f"adding instance group {spec['InstanceGroupName']} is not emulated")
        mine = sorted(
            (n for n in cluster.nodes.values() if n.instance_group_name == group["InstanceGroupName"]),
            key=lambda n: n.launch_time,
        )
        count = int(spec["InstanceCount"])
        for _ in range(count - len(mine)):
            _add_node(backend, cluster, {**group, **spec})
        for node in reversed(mine[count:]) if count < len(mine) else ():
            del cluster.nodes[node.instance_id]
        group.update({k: v for k, v in spec.items() if k != "InstanceCount"})
        group["TargetCount"] = group["CurrentCount"] = count
    return str(cluster.arn)


def batch_delete(backend: Any, name: str, node_ids: list[str]) -> dict[str, Any]:
    from moto.sagemaker.exceptions import ValidationError

    if len(node_ids) > DELETE_MAX:
        raise ValidationError(message=f"at most {DELETE_MAX} NodeIds [emulated]")
    cluster = _cluster(backend, name)
    done, failed = [], []
    for node_id in node_ids:
        node = cluster.nodes.pop(node_id, None)
        if node is None:
            failed.append({"Code": "NodeIdNotFound", "Message": f"{node_id} not found [emulated]", "NodeId": node_id})
            continue
        done.append(node_id)
        for group in cluster.instance_groups:
            if group["InstanceGroupName"] == node.instance_group_name:
                group["TargetCount"] = max(0, group["TargetCount"] - 1)
                group["CurrentCount"] = max(0, group["CurrentCount"] - 1)
    return {"Successful": done, "Failed": failed}


def set_node_status(cluster_name: str, node_ids: list[str], status: str) -> int:
    """What a scene needs moto to say of some nodes: Failure, DeepHealthCheckInProgress, ..."""
    from moto.sagemaker.models import sagemaker_backends

    changed = 0
    for _, _, backend in sagemaker_backends.iter_backends():
        cluster = backend.clusters.get(cluster_name)  # type: ignore[attr-defined]
        for node_id in node_ids if cluster else ():
            if node_id in cluster.nodes:
                cluster.nodes[node_id].status = status
                changed += 1
    return changed


_metric_data_lock = threading.Lock()


def _metric_data_by_namespace() -> None:
    """A moto blind spot Slurm's report depends on: moto's GetMetricData drops a query's Namespace as soon
    as it names Dimensions (any namespace's series with those dimensions is read), where CloudWatch keeps
    namespaces apart. A forged `Slurm` datum would read as the controller's own `Slurm/ROLEID:i-...` one.
    Here each namespace's queries are answered over that namespace's data alone; a request that mixes
    metric math with several namespaces is answered as moto does."""
    from moto.cloudwatch.models import CloudWatchBackend

    original = CloudWatchBackend.get_metric_data

    def by_namespace(self: Any, queries: list[dict[str, Any]], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        spaces = sorted({str(q["MetricStat"]["Metric"].get("Namespace")) for q in queries if "MetricStat" in q})
        if not spaces or any("MetricStat" not in q for q in queries):
            return original(self, queries, *args, **kwargs)
        everything = type(self).get_all_metrics
        answers: dict[str, dict[str, Any]] = {}
        with _metric_data_lock:
            try:
                for space in spaces:
                    mine = [q for q in queries if str(q["MetricStat"]["Metric"].get("Namespace")) == space]
                    self.get_all_metrics = lambda space=space: [m for m in everything(self) if m.namespace == space]
                    answers.update({r["id"]: r for r in original(self, mine, *args, **kwargs)})
            finally:
                self.__dict__.pop("get_all_metrics", None)
        return [answers[q["Id"]] for q in queries if q["Id"] in answers]

    CloudWatchBackend.get_metric_data = by_namespace  # type: ignore[method-assign]


def install() -> None:
    """UpdateCluster and BatchDeleteClusterNodes answered on moto's SageMaker responses; GetMetricData
    keeps namespaces apart (_metric_data_by_namespace)."""
    from moto.sagemaker.responses import SageMakerResponse

    _metric_data_by_namespace()

    def _update(self: SageMakerResponse) -> ActionResult:
        arn = update_cluster(self.sagemaker_backend, self._get_param("ClusterName"), self._get_param("InstanceGroups"))
        return ActionResult({"ClusterArn": arn})

    def _delete(self: SageMakerResponse) -> ActionResult:
        answer = batch_delete(self.sagemaker_backend, self._get_param("ClusterName"), self._get_param("NodeIds", []))
        return ActionResult(answer)

    SageMakerResponse.update_cluster = _update  # type: ignore[attr-defined]
    SageMakerResponse.batch_delete_cluster_nodes = _delete  # type: ignore[attr-defined]


# ---- client side: what a test or a scene does to have a HyperPod cluster on moto ----

EXECUTION_ROLE = "arn:aws:iam::123456789012:role/gpufleet-hyperpod-nodes"
CONTROLLER_ROLE = "arn:aws:iam::123456789012:role/gpufleet-hyperpod-controller"
# Slurm's controller: one ml.c5.xlarge node, the group DescribeCluster calls Controller (SlurmConfig.NodeType).
# By default it shares the workers' execution role, as AWS's samples and Terraform modules do.
CONTROLLER_GROUP = "controller-machine"


def _iam(sagemaker: Any) -> Any:
    """An IAM client on the same endpoint (moto server) and credentials as `sagemaker`."""
    import boto3

    return boto3.client("iam", endpoint_url=sagemaker.meta.endpoint_url, region_name=sagemaker.meta.region_name)


def ensure_role(iam: Any, arn: str) -> str:
    """The role named by `arn` on moto (made when missing, trusting sagemaker.amazonaws.com); its RoleId."""
    import json

    from botocore.exceptions import ClientError

    name = arn.rsplit("/", 1)[-1]
    try:
        return str(iam.get_role(RoleName=name)["Role"]["RoleId"])
    except ClientError:
        trust = {
            "Version": "2012-10-17",
            "Statement": [
                {"Effect": "Allow", "Principal": {"Service": "sagemaker.amazonaws.com"}, "Action": "sts:AssumeRole"}
            ],
        }
        return str(iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["RoleId"])


def _group_spec(name: str, count: int, instance_type: str, role: str, node_type: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "InstanceCount": count,
        "InstanceGroupName": name,
        "InstanceType": instance_type,
        "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-gpufleet-lifecycle/", "OnCreate": "on_create.sh"},
        "ExecutionRole": role,
        "ThreadsPerCore": 1,
    }
    if node_type is not None:
        spec["SlurmConfig"] = {"NodeType": node_type}
    return spec


def create_cluster(
    sagemaker: Any,
    name: str,
    group: str,
    count: int = 0,
    tags: dict[str, str] | None = None,
    controller: bool = True,
    controller_role: str = CONTROLLER_ROLE,
    slurm_config: bool = True,
) -> str:
    """A Slurm-orchestrated cluster with one instance group of ml.p5.48xlarge (8 GPUs) at `count` nodes and
    (`controller`) Slurm's controller group CONTROLLER_GROUP of one node (id i-..., as HyperPod's), with
    `controller_role` (default: a role of its own; EXECUTION_ROLE: the workers', shared). `slurm_config`
    False: the controller group carries no SlurmConfig
    (a cluster configured by provisioning_parameters.json: only a cluster tag can name it).
    The execution roles are made on moto's IAM too (GetRole gives their ids)."""
    groups = [_group_spec(group, count, "ml.p5.48xlarge", EXECUTION_ROLE, "Compute" if slurm_config else None)]
    if controller:
        node_type = defaults.HYPERPOD_CONTROLLER_NODE_TYPE if slurm_config else None
        groups.append(_group_spec(CONTROLLER_GROUP, 0, "ml.c5.xlarge", controller_role, node_type))
    iam = _iam(sagemaker)
    for role in {g["ExecutionRole"] for g in groups}:
        ensure_role(iam, role)
    answer = sagemaker.create_cluster(
        ClusterName=name, InstanceGroups=groups, Tags=[{"Key": k, "Value": v} for k, v in (tags or {}).items()]
    )
    if controller:  # through the emulated UpdateCluster: its node gets an EC2-shaped id
        spec = {k: v for k, v in groups[-1].items() if k != "SlurmConfig"}
        sagemaker.update_cluster(ClusterName=name, InstanceGroups=[{**spec, "InstanceCount": 1}])
    return str(answer["ClusterArn"])


def controller_node(sagemaker: Any, cluster: str) -> str:
    """The instance id of the cluster's controller node (CONTROLLER_GROUP's one node)."""
    nodes = sagemaker.list_cluster_nodes(ClusterName=cluster, InstanceGroupNameContains=CONTROLLER_GROUP)
    [node] = [n for n in nodes["ClusterNodeSummaries"] if n["InstanceGroupName"] == CONTROLLER_GROUP]
    return str(node["InstanceId"])


def node_userid(sagemaker: Any, cluster: str, instance_id: str) -> str:
    """The aws:userid the node's own credentials carry, as HyperPod's do: its group's execution role id,
    ':', the session name HyperPod gives every node (defaults.HYPERPOD_SESSION_NAME, not the instance id)."""
    nodes = sagemaker.list_cluster_nodes(ClusterName=cluster)["ClusterNodeSummaries"]
    [group] = [n["InstanceGroupName"] for n in nodes if n["InstanceId"] == instance_id]
    groups = sagemaker.describe_cluster(ClusterName=cluster)["InstanceGroups"]
    [role] = [g["ExecutionRole"] for g in groups if g["InstanceGroupName"] == group]
    return f"{ensure_role(_iam(sagemaker), role)}:{defaults.HYPERPOD_SESSION_NAME}"


def report_namespace(sagemaker: Any, cluster: str) -> str:
    """Where the controller node's publisher writes Slurm's report: Slurm/<its aws:userid>."""
    return schema.slurm_namespace(node_userid(sagemaker, cluster, controller_node(sagemaker, cluster)))
