"""What the pods' numbers need from EC2 and EKS: which instance a Kubernetes node is, and what a managed
node group's nodes offer a pod (GPUs, labels, taints), in the Kubernetes terms the pure packing uses.

Nodes are mapped through EC2, not the Kubernetes API: the scaler's access entry has AmazonEKSViewPolicy,
which covers pods but not nodes (cluster-scoped). On EKS a node's name is its instance's private DNS name
(ip-10-0-1-7.ec2.internal, or i-0abc....ec2.internal with resource-name hostnames), so one
DescribeInstances filtered on `private-dns-name` (paged, 200 names a filter) maps them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.domain.errors import one_line
from gpufleet.scaling.demand import NodeShape

if TYPE_CHECKING:
    from mypy_boto3_eks import EKSClient

FILTER_VALUES_MAX = 200  # EC2's limit on one filter's values
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]  # a terminated one has no DNS name
# EKS's taint effects -> the Kubernetes names pods tolerate.
TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
ARCHITECTURES = {"x86_64": "amd64", "arm64": "arm64"}  # EC2's names -> kubernetes.io/arch
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
CAPACITY_TYPE_LABEL = "eks.amazonaws.com/capacityType"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ARCH_LABEL = "kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"

# Instance type -> (GPUs, kubernetes.io/arch); instance types do not change, so a container keeps them.
_TYPES: dict[str, tuple[int, str]] = {}


class ShapeUnknown(ValueError):
    """A node group whose node shape cannot be told; one line naming it and why."""

    def __init__(self, cluster: str, nodegroup: str, why: str) -> None:
        super().__init__(one_line(f"node group {cluster}/{nodegroup}: {why}"))


def instances_by_node_name(ec2: Any, node_names: Iterable[str]) -> dict[str, str]:
    """Kubernetes node name (EC2 private DNS name) -> instance id, for the names EC2 knows; the others (a
    node gone, or one named otherwise by a custom AMI) are left out."""
    names = sorted(set(node_names))
    found: dict[str, str] = {}
    for start in range(0, len(names), FILTER_VALUES_MAX):
        filters = [
            {"Name": "private-dns-name", "Values": names[start : start + FILTER_VALUES_MAX]},
            {"Name": "instance-state-name", "Values": LIVE_STATES},
        ]
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    if instance.get("PrivateDnsName"):
                        found[instance["PrivateDnsName"]] = instance["InstanceId"]
    return found


def instance_types(ec2: Any, names: Iterable[str]) -> dict[str, tuple[int, str]]:
    """Instance type -> (GPUs per instance from GpuInfo, kubernetes.io/arch), asking EC2 only for the types
    this container has not seen. A type without GpuInfo has 0 GPUs. GPUs are the logical count where EC2
    gives one: a fractional-GPU type (g6f.large: Count 0, one eighth of an L4) shows the node one GPU."""
    wanted = sorted(set(names) - set(_TYPES))
    if wanted:
        pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted)
        for page in pages:
            for item in page.get("InstanceTypes", []):
                devices = item.get("GpuInfo", {}).get("Gpus", [])
                gpus = sum(int(g.get("LogicalGpuCount", g.get("Count", 0))) for g in devices)
                archs = item.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
                arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), "")
                _TYPES[item["InstanceType"]] = (gpus, arch)
    return {n: _TYPES[n] for n in names if n in _TYPES}


def _labels(nodegroup: Mapping[str, Any], types: dict[str, tuple[int, str]]) -> tuple[tuple[str, str], ...]:
    """The node group's own labels and those EKS and the kubelet put on every node of it (the instance
    type only when the group has one, the arch when all its types agree)."""
    labels = {str(k): str(v) for k, v in (nodegroup.get("labels") or {}).items()}
    labels[NODEGROUP_LABEL] = nodegroup["nodegroupName"]
    if nodegroup.get("capacityType"):
        labels[CAPACITY_TYPE_LABEL] = nodegroup["capacityType"]
    labels[OS_LABEL] = "windows" if str(nodegroup.get("amiType", "")).startswith("WINDOWS") else "linux"
    if len(types) == 1:
        labels[INSTANCE_TYPE_LABEL] = next(iter(types))
    archs = {arch for _, arch in types.values()}
    if len(archs) == 1 and "" not in archs:
        labels[ARCH_LABEL] = archs.pop()
    return tuple(sorted(labels.items()))


def node_shape(eks: EKSClient, ec2: Any, cluster: str, nodegroup: str) -> NodeShape:
    """What a node of the managed node group offers a pod: GPUs (the fewest of its instance types, so a
    pod said to fit fits whichever type launches), labels and taints, from DescribeNodegroup and
    DescribeInstanceTypes. ShapeUnknown when that cannot be told."""
    try:
        found = eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)["nodegroup"]
        types = found.get("instanceTypes") or []
        if not types:
            raise ShapeUnknown(cluster, nodegroup, "no instanceTypes (set in its launch template): GPUs unknown")
        gpus = instance_types(ec2, types)
    except AWS_FAILURES as err:
        raise ShapeUnknown(cluster, nodegroup, f"cannot describe it ({error_code(err)})") from None
    fewest = min((gpus.get(t, (0, ""))[0] for t in types), default=0)
    if fewest <= 0:
        raise ShapeUnknown(cluster, nodegroup, f"instance types {', '.join(types)}: not all have GPUs")
    taints = tuple(
        (
            str(t.get("key", "")),
            str(t.get("value") or ""),
            TAINT_EFFECTS.get(str(t.get("effect")), str(t.get("effect"))),
        )
        for t in found.get("taints") or []
    )
    return NodeShape(gpus=fewest, labels=_labels(found, gpus), taints=taints)
