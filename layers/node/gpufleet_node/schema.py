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


# How a window of 1 Hz samples becomes one datum:
DISTRIBUTION = "distribution"  # integer 0-100 samples -> Values/Counts (exact percentiles in CloudWatch)
STATISTICS = "statistics"  # float samples -> StatisticValues (SampleCount, Sum, Minimum, Maximum)
COUNTER = "counter"  # events counted over the window -> one Value (Sum)


class Metric:
    """A metric the publisher emits: its CloudWatch name, unit, how samples aggregate, and its meaning."""

    __slots__ = ("aggregation", "description", "name", "unit")

    def __init__(self, name: str, unit: str, description: str, aggregation: str = STATISTICS) -> None:
        self.name = name
        self.unit = unit
        self.description = description
        self.aggregation = aggregation

    def __repr__(self) -> str:
        return "Metric(%r, %r)" % (self.name, self.unit)


GPU_UTILIZATION = Metric(
    "GPUUtilization", "Percent", "Percent of time a kernel ran on the GPU (NVML utilization.gpu)", DISTRIBUTION
)
GPU_MEMORY_CONTROLLER_BUSY = Metric(
    "GPUMemoryControllerBusy",
    "Percent",
    "Percent of time device memory was read or written (what gpumon.py calls 'Memory Usage')",
    DISTRIBUTION,
)
GPU_MEMORY_USED_PERCENT = Metric(
    "GPUMemoryUsedPercent",
    "Percent",
    "Framebuffer memory occupied, percent of total (not memory-controller activity)",
)
GPU_MEMORY_USED = Metric("GPUMemoryUsed", "Megabytes", "Framebuffer memory occupied (driver-reserved excluded)")
GPU_MEMORY_FREE = Metric("GPUMemoryFree", "Megabytes", "Framebuffer memory free")
GPU_MEMORY_TOTAL = Metric("GPUMemoryTotal", "Megabytes", "Framebuffer memory size")
GPU_TOP_PROCESS_MEMORY = Metric("GPUTopProcessMemory", "Megabytes", "Memory of the GPU's largest compute process")
GPU_PROCESS_COUNT = Metric("GPUProcessCount", "Count", "Compute processes on the GPU")
GPU_POWER_DRAW = Metric("GPUPowerDrawWatts", "None", "Board power draw in watts")
GPU_POWER_PERCENT = Metric("GPUPowerPercentOfLimit", "Percent", "Power draw, percent of the enforced power limit")
GPU_TEMPERATURE = Metric("GPUTemperatureCelsius", "None", "GPU core temperature in degrees Celsius")
GPU_MEMORY_TEMPERATURE = Metric("GPUMemoryTemperatureCelsius", "None", "HBM/GDDR temperature in degrees Celsius")
GPU_THROTTLE_HW_SLOWDOWN = Metric(
    "GPUThrottleHardwareSlowdown", "Count", "Samples with hardware slowdown (clocks cut by the board)", COUNTER
)
GPU_THROTTLE_THERMAL = Metric("GPUThrottleThermal", "Count", "Samples with thermal slowdown (HW or SW)", COUNTER)
GPU_THROTTLE_POWER_CAP = Metric("GPUThrottlePowerCap", "Count", "Samples with clocks held by the power cap", COUNTER)
GPU_XID_ERRORS = Metric("GPUXidErrors", "Count", "XID critical errors reported by NVML events", COUNTER)
GPU_ECC_DOUBLE_BIT = Metric("GPUEccDoubleBitErrors", "Count", "New uncorrectable (double-bit) ECC errors", COUNTER)
GPU_REMAPPED_ROWS_UNCORRECTABLE = Metric(
    "GPURemappedRowsUncorrectable", "Count", "New rows remapped after uncorrectable errors", COUNTER
)
GPU_LOST = Metric("GPULost", "Count", "1 if NVML reported the GPU lost (fell off the bus) in the window", COUNTER)
NVML_UP = Metric("NVMLUp", "Count", "1 while NVML answers on the instance, 0 when it does not", COUNTER)

ALL_METRICS: Tuple[Metric, ...] = (
    GPU_UTILIZATION,
    GPU_MEMORY_CONTROLLER_BUSY,
    GPU_MEMORY_USED_PERCENT,
    GPU_MEMORY_USED,
    GPU_MEMORY_FREE,
    GPU_MEMORY_TOTAL,
    GPU_TOP_PROCESS_MEMORY,
    GPU_PROCESS_COUNT,
    GPU_POWER_DRAW,
    GPU_POWER_PERCENT,
    GPU_TEMPERATURE,
    GPU_MEMORY_TEMPERATURE,
    GPU_THROTTLE_HW_SLOWDOWN,
    GPU_THROTTLE_THERMAL,
    GPU_THROTTLE_POWER_CAP,
    GPU_XID_ERRORS,
    GPU_ECC_DOUBLE_BIT,
    GPU_REMAPPED_ROWS_UNCORRECTABLE,
    GPU_LOST,
    NVML_UP,
)
METRICS_BY_NAME: Dict[str, Metric] = {m.name: m for m in ALL_METRICS}

# Also published per instance {InstanceId} (all of its GPUs' samples: Maximum = the busiest GPU) and per
# group, so one alarm covers an ASG or node group and the scaler can pick idle instances.
INSTANCE_METRICS: Tuple[Metric, ...] = (
    GPU_UTILIZATION,
    GPU_MEMORY_USED_PERCENT,
    GPU_XID_ERRORS,
    GPU_ECC_DOUBLE_BIT,
    GPU_REMAPPED_ROWS_UNCORRECTABLE,
    GPU_LOST,
    NVML_UP,
)
GROUP_METRICS: Tuple[Metric, ...] = (GPU_UTILIZATION, GPU_MEMORY_USED_PERCENT, GPU_XID_ERRORS, GPU_LOST)
# The optional 10 s high-resolution subset (StorageResolution 1).
HIGH_RESOLUTION_METRICS: Tuple[Metric, ...] = (GPU_UTILIZATION, GPU_MEMORY_USED_PERCENT)

# `detail: essential` in the publisher config keeps only what the controller reads (scaling, OOM
# forecasts, health) - about 11 series per GPU instead of 20 - since CloudWatch bills every series.
ESSENTIAL_METRICS: Tuple[Metric, ...] = (
    GPU_UTILIZATION,
    GPU_MEMORY_USED_PERCENT,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_TOP_PROCESS_MEMORY,
    GPU_XID_ERRORS,
    GPU_ECC_DOUBLE_BIT,
    GPU_REMAPPED_ROWS_UNCORRECTABLE,
    GPU_LOST,
    NVML_UP,
)

# XID codes that mean the GPU or its node needs attention (NVIDIA's XID catalogue): 48 double-bit ECC,
# 63/64 row remapping, 74 NVLink, 79 fallen off the bus, 92 high single-bit ECC rate, 94/95 contained /
# uncontained ECC errors. The OOM guard's health check defaults to these; the policy can change them.
CRITICAL_XIDS: Tuple[int, ...] = (48, 63, 64, 74, 79, 92, 94, 95)


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
