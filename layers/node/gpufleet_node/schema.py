"""The GPU metric schema: the one place that names what the node publisher writes to CloudWatch.

The controller (scaler, OOM guard), the template's alarms and the rehearsal all import these names, so
a rename happens here or nowhere. Must stay importable on Python 3.9 (Amazon Linux 2023's python3).
"""

from typing import Dict, Tuple

NAMESPACE = "GPUFleet"

# Dimension names. Per GPU: (InstanceId, GpuIndex); per instance: (InstanceId,); per group: one of
# GROUP_DIMENSIONS_ASG / GROUP_DIMENSIONS_EKS, so that one alarm covers a whole group.
DIM_INSTANCE_ID = "InstanceId"
DIM_GPU_INDEX = "GpuIndex"
DIM_ASG_NAME = "AutoScalingGroupName"
DIM_CLUSTER_NAME = "ClusterName"
DIM_NODEGROUP_NAME = "NodegroupName"

GPU_DIMENSIONS = (DIM_INSTANCE_ID, DIM_GPU_INDEX)
INSTANCE_DIMENSIONS = (DIM_INSTANCE_ID,)
GROUP_DIMENSIONS_ASG = (DIM_ASG_NAME,)
GROUP_DIMENSIONS_EKS = (DIM_CLUSTER_NAME, DIM_NODEGROUP_NAME)


class Metric:
    """A metric the publisher emits: its CloudWatch name, unit and a one-line meaning."""

    __slots__ = ("description", "name", "unit")

    def __init__(self, name: str, unit: str, description: str) -> None:
        self.name = name
        self.unit = unit
        self.description = description

    def __repr__(self) -> str:
        return "Metric(%r, %r)" % (self.name, self.unit)


GPU_UTILIZATION = Metric("GPUUtilization", "Percent", "Percent of time a kernel ran on the GPU (NVML utilization.gpu)")
GPU_MEMORY_USED_PERCENT = Metric(
    "GPUMemoryUsedPercent",
    "Percent",
    "Framebuffer memory occupied, percent of total (not memory-controller activity)",
)
GPU_MEMORY_USED = Metric("GPUMemoryUsed", "Megabytes", "Framebuffer memory occupied")
GPU_MEMORY_TOTAL = Metric("GPUMemoryTotal", "Megabytes", "Framebuffer memory size")

ALL_METRICS: Tuple[Metric, ...] = (
    GPU_UTILIZATION,
    GPU_MEMORY_USED_PERCENT,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
)
METRICS_BY_NAME: Dict[str, Metric] = {m.name: m for m in ALL_METRICS}


def group_dimensions(
    asg_name: "str | None" = None,
    cluster_name: "str | None" = None,
    nodegroup_name: "str | None" = None,
) -> Dict[str, str]:
    """Dimensions that aggregate one ASG or one EKS managed node group."""
    if cluster_name and nodegroup_name:
        return {DIM_CLUSTER_NAME: cluster_name, DIM_NODEGROUP_NAME: nodegroup_name}
    if asg_name:
        return {DIM_ASG_NAME: asg_name}
    raise ValueError("a group is an ASG name or a (cluster, node group) pair")
