"""What a group's nodes are to the scaler: the shape a pod is fitted against (GPUs, labels, taints,
allocatable, zones), the well-known topology labels, and what is known of a new node's start. Read by
the adapters (which build them) and the scaling core (which weighs them)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpufleet.domain.models import Frozen

ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"


class NodeShape(Frozen):
    """What a group's nodes offer a pod: GPUs, labels, taints, allocatable resources and zones (from
    DescribeNodegroup, DescribeInstanceTypes and the EKS AMI's reservations for EKS; GPUs per instance for
    a plain ASG, which checks nothing else)."""

    gpus: float = Field(gt=0)
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    # Resource -> what a pod may request on a fresh node (cpu in cores, bytes, counts); empty: not known.
    allocatable: dict[str, float] = Field(default_factory=dict)
    zones: tuple[str, ...] = ()  # the group's availability zones, where known
    name: str = ""  # what a person calls the node: its instance type(s)


class NodeReadiness(Frozen):
    """What is known of one node's start: when it launched and whether its publisher has reported GPUs."""

    launched_at: datetime | None = None
    gpus_reported: bool = False
