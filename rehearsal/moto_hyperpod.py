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
from typing import Any

from moto.core.responses import ActionResult

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


def install() -> None:
    """UpdateCluster and BatchDeleteClusterNodes answered on moto's SageMaker responses."""
    from moto.sagemaker.responses import SageMakerResponse

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


def create_cluster(sagemaker: Any, name: str, group: str, count: int = 0, tags: dict[str, str] | None = None) -> str:
    """A Slurm-orchestrated cluster with one instance group of ml.p5.48xlarge (8 GPUs) at `count` nodes."""
    answer = sagemaker.create_cluster(
        ClusterName=name,
        InstanceGroups=[
            {
                "InstanceCount": count,
                "InstanceGroupName": group,
                "InstanceType": "ml.p5.48xlarge",
                "LifeCycleConfig": {"SourceS3Uri": "s3://sagemaker-gpufleet-lifecycle/", "OnCreate": "on_create.sh"},
                "ExecutionRole": EXECUTION_ROLE,
                "ThreadsPerCore": 1,
            }
        ],
        Tags=[{"Key": k, "Value": v} for k, v in (tags or {}).items()],
    )
    return str(answer["ClusterArn"])
