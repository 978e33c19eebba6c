"""What the pods' numbers need from EC2 and EKS: which instance a Kubernetes node is, and what a managed
node group's nodes offer a pod (GPUs, allocatable resources, labels, taints, zones), in the Kubernetes terms
the pure fit uses (the arithmetic, with its sources, is in `gpufleet.aws.eks_shape`).

Nodes are mapped through EC2, not the Kubernetes API: the scaler's access entry has AmazonEKSViewPolicy,
which covers pods but not nodes (cluster-scoped). On EKS a node's name is its instance's private DNS name
(ip-10-0-1-7.ec2.internal, or i-0abc....ec2.internal with resource-name hostnames), so one
DescribeInstances filtered on `private-dns-name` (paged, 200 names a filter) maps them all.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.aws.eks_shape import GPU_LABELS, NVIDIA_GPU, InstanceType, allocatable, instance_type, shape_labels
from gpufleet.domain import defaults
from gpufleet.domain.errors import one_line
from gpufleet.domain.nodes import REGION_LABEL, ZONE_LABEL, NodeShape
from gpufleet.domain.quantity import parse_quantity

if TYPE_CHECKING:
    from mypy_boto3_eks import EKSClient

FILTER_VALUES_MAX = 200  # EC2's limit on one filter's values
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]  # a terminated one has no DNS name
# EKS's taint effects -> the Kubernetes names pods tolerate.
TAINT_EFFECTS = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
CAPACITY_TYPE_LABEL = "eks.amazonaws.com/capacityType"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
ARCH_LABEL = "kubernetes.io/arch"
OS_LABEL = "kubernetes.io/os"

# Instance types and subnets do not change: a container keeps what EC2 said of them.
_TYPES: dict[str, InstanceType] = {}
_SUBNET_ZONES: dict[str, str] = {}


class ShapeUnknown(ValueError):
    """A node group whose node shape cannot be told; one line naming it and why (`what`: how a
    self-managed group is named instead, "ASG NAME")."""

    def __init__(self, cluster: str, nodegroup: str, why: str, what: str | None = None) -> None:
        super().__init__(one_line(f"{what or f'node group {cluster}/{nodegroup}'}: {why}"))


def described_instances(ec2: Any, name: str, values: Iterable[str], *also: Mapping[str, Any]) -> Iterator[Any]:
    """Every instance DescribeInstances finds with filter `name` in `values` (and the filters `also`),
    paged, the values in chunks of the 200 one filter takes."""
    wanted = sorted(set(values))
    for start in range(0, len(wanted), FILTER_VALUES_MAX):
        filters = [{"Name": name, "Values": wanted[start : start + FILTER_VALUES_MAX]}, *also]
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                yield from reservation.get("Instances", [])


def instances_by_node_name(ec2: Any, node_names: Iterable[str]) -> dict[str, str]:
    """Kubernetes node name (EC2 private DNS name) -> instance id, for the names EC2 knows; the others (a
    node gone, or one named otherwise by a custom AMI) are left out."""
    live = {"Name": "instance-state-name", "Values": LIVE_STATES}
    return {
        i["PrivateDnsName"]: i["InstanceId"]
        for i in described_instances(ec2, "private-dns-name", node_names, live)
        if i.get("PrivateDnsName")
    }


def instance_types(ec2: Any, names: Iterable[str]) -> dict[str, InstanceType]:
    """Instance type -> what EC2 says of it (GPUs, arch, vCPUs, memory, network, GPU model), asking EC2
    only for the types this container has not seen."""
    names = list(names)
    wanted = sorted(set(names) - set(_TYPES))
    if wanted:
        pages = ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=wanted)
        for page in pages:
            for item in page.get("InstanceTypes", []):
                _TYPES[item["InstanceType"]] = instance_type(item)
    return {n: _TYPES[n] for n in names if n in _TYPES}


def fewest_gpus(ec2: Any, names: Sequence[str]) -> float | None:
    """The fewest GPUs any of these instance types has: a group's GPUs per node when every type it
    launches is known to EC2 and has GPUs; None otherwise (unknown, GPU-less, or EC2 unreadable)."""
    try:
        described = instance_types(ec2, names)
    except AWS_FAILURES:
        return None
    if not names or any(n not in described for n in names):
        return None
    fewest = min(described[n].gpus for n in names)
    return float(fewest) if fewest > 0 else None


def subnet_zones(ec2: Any, subnets: Sequence[str]) -> tuple[str, ...]:
    """The availability zones of a node group's subnets (DescribeSubnets, kept per container); () when
    EC2 cannot say (a pod that selects a zone is then told, not guessed)."""
    wanted = sorted(set(subnets) - set(_SUBNET_ZONES))
    if wanted:
        try:
            for s in ec2.describe_subnets(SubnetIds=wanted).get("Subnets", []):
                if s.get("SubnetId") and s.get("AvailabilityZone"):
                    _SUBNET_ZONES[s["SubnetId"]] = s["AvailabilityZone"]
        except AWS_FAILURES:
            return ()
    if any(s not in _SUBNET_ZONES for s in subnets):
        return ()
    return tuple(sorted({_SUBNET_ZONES[s] for s in subnets}))


def type_labels(
    types: Mapping[str, InstanceType], zones: Sequence[str], region: str, os_name: str = "linux"
) -> dict[str, str]:
    """The labels the kubelet and GPU feature discovery put on every node of a group that launches
    `types` (the instance type only when the group has one; the arch and GPU labels when all its types
    agree; the zone when the group has one zone). Shared by managed node groups and self-managed ASGs."""
    labels = {OS_LABEL: os_name}
    if len(types) == 1:
        labels[INSTANCE_TYPE_LABEL] = next(iter(types))
    archs = {t.arch for t in types.values()}
    if len(archs) == 1 and "" not in archs:
        labels[ARCH_LABEL] = archs.pop()
    per_type = [shape_labels(t) for t in types.values()]
    for key in GPU_LABELS:
        values = {p.get(key) for p in per_type}
        if len(values) == 1 and None not in values:
            labels[key] = str(values.pop())
    if len(zones) == 1:
        labels[ZONE_LABEL] = zones[0]
    if region:
        labels[REGION_LABEL] = region
    return labels


def _labels(
    nodegroup: Mapping[str, Any], types: Mapping[str, InstanceType], zones: Sequence[str], region: str
) -> tuple[tuple[str, str], ...]:
    """The node group's own labels and those EKS, the kubelet and GPU feature discovery put on every node
    of it (`type_labels`)."""
    labels = {str(k): str(v) for k, v in (nodegroup.get("labels") or {}).items()}
    labels[NODEGROUP_LABEL] = nodegroup["nodegroupName"]
    if nodegroup.get("capacityType"):
        labels[CAPACITY_TYPE_LABEL] = nodegroup["capacityType"]
    windows = str(nodegroup.get("amiType", "")).startswith("WINDOWS")
    labels.update(type_labels(types, zones, region, "windows" if windows else "linux"))
    return tuple(sorted(labels.items()))


def node_shape(
    eks: EKSClient,
    ec2: Any,
    cluster: str,
    nodegroup: str,
    zones: Sequence[str] | None = None,
    overrides: Mapping[str, str] | None = None,
) -> NodeShape:
    """What a node of the managed node group offers a pod: GPUs and allocatable resources (the least of
    its instance types, so a pod said to fit fits whichever type launches), labels, taints and zones, from
    DescribeNodegroup, DescribeInstanceTypes and DescribeSubnets (unless `zones` is given). `overrides`
    (policy `demand.kubernetes.allocatable`, quantities) replaces the computed allocatable resource by
    resource, for AMIs that reserve otherwise. ShapeUnknown when that cannot be told."""
    try:
        found = eks.describe_nodegroup(clusterName=cluster, nodegroupName=nodegroup)["nodegroup"]
        types = found.get("instanceTypes") or []
        if not types:
            raise ShapeUnknown(cluster, nodegroup, "no instanceTypes (set in its launch template): GPUs unknown")
        described = instance_types(ec2, types)
    except AWS_FAILURES as err:
        raise ShapeUnknown(cluster, nodegroup, f"cannot describe it ({error_code(err)})") from None
    fewest = min((described[t].gpus if t in described else 0 for t in types), default=0)
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
    if zones is None:
        zones = subnet_zones(ec2, [str(s) for s in found.get("subnets") or []])
    disk = found.get("diskSize") if not found.get("launchTemplate") else None
    offered = least([allocatable(described[t], disk) for t in types])
    given, why = checked_overrides(overrides)
    if why:
        raise ShapeUnknown(cluster, nodegroup, why)
    offered.update(given)
    region = str(getattr(getattr(ec2, "meta", None), "region_name", "") or "")
    return NodeShape(
        gpus=fewest,
        labels=_labels(found, described, tuple(zones), region),
        taints=taints,
        allocatable=offered,
        zones=tuple(sorted(set(zones))),
        name="/".join(types),
    )


def quantity_problem(resource: str, amount: float) -> str | None:
    """Why a node cannot offer this much of a resource (infinite, or past `defaults.NODE_GPUS_MAX` GPUs or
    `defaults.NODE_RESOURCE_MAX` of anything else), or None: the pure fit's arithmetic stays finite."""
    limit = defaults.NODE_GPUS_MAX if resource == NVIDIA_GPU else defaults.NODE_RESOURCE_MAX
    if math.isfinite(amount) and 0 <= amount <= limit:
        return None
    return f"{resource} {amount:g} is more than a node offers (at most {limit:g})"


def checked_overrides(overrides: Mapping[str, str] | None) -> tuple[dict[str, float], str]:
    """Policy `demand.kubernetes.allocatable` as numbers, or ({}, why) when one is more than a node offers."""
    raw = {str(k): v for k, v in (overrides or {}).items()}
    given = {k: parse_quantity(v) for k, v in raw.items()}
    for name, amount in sorted(given.items()):
        why = quantity_problem(name, amount)
        if why:
            return {}, f"demand.kubernetes.allocatable {name}={raw[name]!r}: {why}"
    return given, ""


def least(offers: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per resource, the least any of the types offers (a resource one type lacks is offered by none)."""
    keys = set.intersection(*(set(o) for o in offers)) if offers else set()
    return {k: min(o[k] for o in offers) for k in sorted(keys)}
