"""The GPU metric schema: the one place that names what the node publisher writes to CloudWatch.

The controller (scaler, OOM guard), the template's alarms and the rehearsal all import these names, so
a rename happens here or nowhere. Must stay importable on Python 3.9 (Amazon Linux 2023's python3).
"""

from typing import Dict, Tuple

NAMESPACE = "GPUFleet"

# ---- A node's own namespace: corroboration a forger cannot write ----
# IAM has no condition key for dimensions, so any node may write any InstanceId into NAMESPACE. The node
# policy also lets each node write NODE_NAMESPACE_PREFIX + its own aws:userid, and nothing else there:
# `cloudwatch:namespace` must equal "GPUFleet/Node/${aws:userid}" (a policy variable in a string
# condition). For an instance profile's credentials aws:userid is "ROLEID:i-..." (the role's unique id,
# then the session name EC2 sets to the instance id; IAM User Guide, policy variables, "Principal key
# values"). A namespace that ends in ":<instance id>" was therefore written by that instance's own
# credentials. The publisher writes a GPU fault there too (only in windows with one: CloudWatch bills a
# series by the hours it receives data), and the OOM guard replaces an instance only when its own
# namespace confirms the fault. CloudWatch namespaces take any ASCII but control characters, ':' included.
NODE_NAMESPACE_PREFIX = NAMESPACE + "/Node/"


def node_namespace(userid: str) -> str:
    """The namespace only the credentials with this aws:userid may write (see above)."""
    return NODE_NAMESPACE_PREFIX + userid


def namespace_instance(namespace: str) -> "str | None":
    """The instance whose own credentials wrote `namespace` ("GPUFleet/Node/ROLEID:i-..." -> "i-..."), or
    None when it is not a node's own namespace of that exact shape (one ':', a non-empty id on each side)."""
    if not namespace.startswith(NODE_NAMESPACE_PREFIX):
        return None
    return userid_instance(namespace[len(NODE_NAMESPACE_PREFIX) :])


def userid_instance(userid: str) -> "str | None":
    """The instance of an instance profile's aws:userid ("ROLEID:i-..." -> "i-..."), or None when it is
    not of that exact shape (one ':', a non-empty id on each side, no '/')."""
    role, sep, session = userid.partition(":")
    if not sep or not role or not session.startswith("i-") or ":" in session or "/" in role + session:
        return None
    return session


# Busy marks (`gpufleet-node busy`): a queue worker that holds a job says so in one DynamoDB item of
# BUSY_TABLE whose key BUSY_KEY is its own aws:userid. The node policy allows PutItem and DeleteItem
# only where `dynamodb:LeadingKeys` equals "${aws:userid}", so a node can mark (and unmark) only itself;
# the scaler turns marks into scale-in protection and never removes a marked node. A fixed name, as the
# usage log group's: the AMI needs no stack output to find it.
BUSY_TABLE = "gpufleet-busy"
BUSY_KEY = "node"


# Dimension names. Per GPU: (InstanceId, GpuIndex); per instance: (InstanceId,); per group: one of
# GROUP_DIMENSIONS_ASG / GROUP_DIMENSIONS_EKS, so that one alarm covers a whole group.
DIM_INSTANCE_ID = "InstanceId"
DIM_GPU_INDEX = "GpuIndex"
DIM_ASG_NAME = "AutoScalingGroupName"
DIM_CLUSTER_NAME = "ClusterName"
DIM_NODEGROUP_NAME = "NodegroupName"
DIM_INSTANCE_GROUP_NAME = "InstanceGroupName"  # a SageMaker HyperPod cluster's instance group

GPU_DIMENSIONS = (DIM_INSTANCE_ID, DIM_GPU_INDEX)
INSTANCE_DIMENSIONS = (DIM_INSTANCE_ID,)
GROUP_DIMENSIONS_ASG = (DIM_ASG_NAME,)
GROUP_DIMENSIONS_EKS = (DIM_CLUSTER_NAME, DIM_NODEGROUP_NAME)
GROUP_DIMENSIONS_HYPERPOD = (DIM_CLUSTER_NAME, DIM_INSTANCE_GROUP_NAME)


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
# In a node's own namespace only (NODE_NAMESPACE_PREFIX): one series per GPU and fault, dimensions
# WITNESS_DIMENSIONS, the fault being the shared counter's name (HEALTH_EVENT_METRICS). A name of its own,
# so the own namespace is never read as, or summed with, the shared series.
DIM_FAULT = "Fault"
WITNESS_DIMENSIONS = (DIM_INSTANCE_ID, DIM_GPU_INDEX, DIM_FAULT)
GPU_FAULT_REPORTED = Metric(
    "GPUFaultReported",
    "Count",
    "A GPU fault counted in the window, written with the instance's own credentials",
    COUNTER,
)
GPU_HEALTH_EVENTS = Metric(
    "GPUHealthEvents",
    "Count",
    "Health summary of an instance or group: critical XIDs (CRITICAL_XIDS) + new double-bit ECC errors + new "
    "uncorrectable remapped rows + samples of a lost GPU in the window. Sent only when non-zero (every mode), "
    "so one series per instance screens its health and costs nothing while the GPUs are healthy",
    COUNTER,
)

# ---- The host (host.py): memory, swap and disk, read from /proc/meminfo and statvfs without root ----
# A host that runs out of memory kills the GPU job as surely as the GPU does. Statistics over the window's
# samples: the Maximum is the fullest moment (the OOM guard screens the group's Maximum), the Average the
# dashboard line.
HOST_MEMORY_USED_PERCENT = Metric(
    "HostMemoryUsedPercent",
    "Percent",
    "Host memory in use, percent of MemTotal: (MemTotal - MemAvailable) / MemTotal, as free(1) counts it",
)
HOST_SWAP_USED_PERCENT = Metric(
    "HostSwapUsedPercent", "Percent", "Swap in use, percent of SwapTotal (sent only by a node that has swap)"
)
HOST_DISK_USED_PERCENT = Metric(
    "HostDiskUsedPercent",
    "Percent",
    "The fullest of the root and data filesystems, percent used as df(1) counts it: "
    "(blocks - bfree) / (blocks - bfree + bavail)",
)
# EFA (efa.py): bytes moved over all the node's EFA devices in the window, summed. Per device, with the
# retransmit and timeout counters, on the Prometheus endpoint; in CloudWatch only under `detail: full`.
HOST_EFA_RX_BYTES = Metric("HostEfaRxBytes", "Bytes", "Bytes received by the node's EFA devices", COUNTER)
HOST_EFA_TX_BYTES = Metric("HostEfaTxBytes", "Bytes", "Bytes sent by the node's EFA devices", COUNTER)
HOST_METRICS: Tuple[Metric, ...] = (HOST_MEMORY_USED_PERCENT, HOST_SWAP_USED_PERCENT, HOST_DISK_USED_PERCENT)
EFA_METRICS: Tuple[Metric, ...] = (HOST_EFA_RX_BYTES, HOST_EFA_TX_BYTES)

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
    GPU_HEALTH_EVENTS,
    *HOST_METRICS,
    *EFA_METRICS,
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
    GPU_HEALTH_EVENTS,
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

# ---- How much detail a node sends (`detail` in /etc/gpufleet/publisher.json) ----
# CloudWatch bills a custom metric ($0.30 a month in the first tier) for every hour in which it receives
# data, and the controller's routine decisions read per-instance and per-group aggregates only. So the
# default, `adaptive`, keeps a few aggregates always on and sends a GPU's own series only while they
# matter; `full` (every metric per GPU) and `essential` (what the controller reads, per GPU) stay available.
DETAIL_ADAPTIVE = "adaptive"
DETAIL_ESSENTIAL = "essential"
DETAIL_FULL = "full"
DETAIL_MODES: Tuple[str, ...] = (DETAIL_ADAPTIVE, DETAIL_ESSENTIAL, DETAIL_FULL)
DEFAULT_DETAIL = DETAIL_ADAPTIVE

# Adaptive, always on per instance: utilization as a distribution over all GPUs and samples (min/max/
# percentiles answer "all idle?" and "busiest GPU"), memory used percent as statistics over all GPUs
# (Maximum = the fullest GPU: the scaler's idle check, the OOM guard's screening) and NVMLUp.
ADAPTIVE_INSTANCE_METRICS: Tuple[Metric, ...] = (GPU_UTILIZATION, GPU_MEMORY_USED_PERCENT, NVML_UP)
# Adaptive, always on per group; one series for all the group's nodes (the scaler and its alarms read the
# Average: any node may write here, and one datum sets a Maximum; the OOM guard screens on the Maximum of
# GPUMemoryUsedPercent and confirms on the instances' own series before acting).
ADAPTIVE_GROUP_METRICS: Tuple[Metric, ...] = (GPU_UTILIZATION, GPU_MEMORY_USED_PERCENT)
# Event counters: in adaptive mode sent only when non-zero (a quiet GPU costs nothing; alarms on them
# must treat missing data as not breaching). Per GPU and per instance; the GPU lost, XID and health
# summary also per group. Power-cap throttling is the normal state of a busy GPU, not an event: it is
# part of a GPU's detail instead.
GPU_EVENT_COUNTERS: Tuple[Metric, ...] = (
    GPU_XID_ERRORS,
    GPU_ECC_DOUBLE_BIT,
    GPU_REMAPPED_ROWS_UNCORRECTABLE,
    GPU_LOST,
    GPU_THROTTLE_HW_SLOWDOWN,
    GPU_THROTTLE_THERMAL,
)
EVENT_COUNTERS: Tuple[Metric, ...] = (GPU_HEALTH_EVENTS, *GPU_EVENT_COUNTERS)
ADAPTIVE_GROUP_EVENTS: Tuple[Metric, ...] = (GPU_HEALTH_EVENTS, GPU_XID_ERRORS, GPU_LOST)
# What counts as a health event (summed into GPUHealthEvents; puts the GPU into detail for an hour).
# XIDs count only when their code is in CRITICAL_XIDS: 13, 31, 43 and the like are usually the job's own
# bug; GPUXidErrors still counts every XID NVML reports as critical.
HEALTH_EVENT_METRICS: Tuple[Metric, ...] = (
    GPU_XID_ERRORS,
    GPU_ECC_DOUBLE_BIT,
    GPU_REMAPPED_ROWS_UNCORRECTABLE,
    GPU_LOST,
)
# A GPU's own series in adaptive mode, sent only while the GPU is "in detail": its memory is above the
# threshold, it had a health event within DETAIL_HEALTH_HOLD_S, or detail is switched on for the
# instance (`detail_gpus: always` or the instance tag TAG_DETAIL=on). These are what the OOM guard's
# per-GPU forecast and on-call need: percent, MiB, size, the largest process.
DETAIL_GPU_METRICS: Tuple[Metric, ...] = (
    GPU_UTILIZATION,
    GPU_MEMORY_USED_PERCENT,
    GPU_MEMORY_USED,
    GPU_MEMORY_TOTAL,
    GPU_TOP_PROCESS_MEMORY,
    GPU_PROCESS_COUNT,
    GPU_THROTTLE_POWER_CAP,
)
# Memory threshold with hysteresis: a GPU enters detail in the window whose maximum reaches 70 % used and
# leaves it after a window that stayed below 60 %. Why 70: the OOM guard warns at 90 % (or full within
# 30 min) and fits its trend over a 15-minute window of one-minute points (at least 5). From 70 % to 90 %
# a GPU leaking r %/min spends 20/r minutes: up to 1.3 %/min that is the guard's whole 15-minute window of
# per-GPU points before the 90 % warning, up to 4 %/min still its 5 minimum points; typical leaks (cache
# growth, fragmentation) are well below 1 %/min. Faster ones are caught on the instance's Maximum, which is
# always on, so the trend itself is never missing - detail only names the GPU. Why 60: a job that hovers
# around 70 % would otherwise switch its series on and off every few minutes; CloudWatch bills by the
# hour, so a GPU that stays in detail costs no more than one that flaps.
DETAIL_MEMORY_ON_PERCENT = 70.0
DETAIL_MEMORY_OFF_PERCENT = 60.0
# After a health event, the GPU's series stay on for an hour: the guard's health lookback and time for
# on-call to look at the GPU's memory and utilization around the event.
DETAIL_HEALTH_HOLD_S = 3600
# Detail switched on for one instance (or, with PropagateAtLaunch, a whole ASG): the instance tag
# gpufleet:detail=on, read like the group tags (instance metadata tags or ec2:DescribeTags).
TAG_DETAIL = "gpufleet:detail"
TAG_DETAIL_ON_VALUES: Tuple[str, ...] = ("on", "true", "always", "1")


# Host series in `detail: adaptive` (the default). Always on, per GROUP only: one series per metric that
# every node of the group writes, so its Maximum is the fullest node (the OOM guard's screen, the
# dashboard's line) and a node pays 1/N of it. Swap only from nodes that have swap (SwapTotal > 0; the EKS
# AMIs and the DLAMI run without). A node's OWN host series (InstanceId) are sent only while that node is
# under pressure, each with hysteresis like a GPU's detail: memory from a window whose maximum reaches 70 %
# until one stays below 60 % (the same reasoning as DETAIL_MEMORY_ON_PERCENT: the guard warns at 90 % or
# full within 30 min, and a leak between 70 % and 90 % leaves it the trend); disk from 80 % until below
# 75 % (disks fill slowly: a narrower band flaps less than memory would); swap from 10 % until below 5 %
# (a little swap in use is normal where swap exists). A node outside every group has no group series:
# its own are still sent only under pressure. `full` and `essential` send the instance series always.
# Why not always per instance: three series per node are 2,160 series-hours, $0.89 a node-month, nearly
# half the telemetry budget; the group's two cost $0.06 at 10 nodes (bench/README.md, "Telemetry cost").
ADAPTIVE_HOST_GROUP_METRICS: Tuple[Metric, ...] = HOST_METRICS
HOST_DETAIL_THRESHOLDS: Dict[str, Tuple[float, float]] = {  # metric -> (on at or above, off below)
    HOST_MEMORY_USED_PERCENT.name: (70.0, 60.0),
    HOST_DISK_USED_PERCENT.name: (80.0, 75.0),
    HOST_SWAP_USED_PERCENT.name: (10.0, 5.0),
}
# Filesystems whose fullness counts (the fullest one is sent). "/" always; the rest where they exist, each
# device counted once (a path on the root filesystem is the root filesystem): the container runtimes'
# image stores (EKS AMI: /var/lib/containerd on the root volume; Docker), the kubelet's pods and
# emptyDirs, the DLAMI's instance-store NVMe (/opt/dlami/nvme) and HyperPod's secondary EBS volume
# (/opt/sagemaker, AWS SageMaker API ClusterEbsVolumeConfig). Shared filesystems (FSx, EFS, NFS) are not
# the host's and are left out; `host_filesystems` in the publisher config replaces the list.
DEFAULT_HOST_FILESYSTEMS: Tuple[str, ...] = (
    "/",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/kubelet",
    "/opt/dlami/nvme",
    "/opt/sagemaker",
)


def group_dimensions(
    asg_name: "str | None" = None,
    cluster_name: "str | None" = None,
    nodegroup_name: "str | None" = None,
    instance_group_name: "str | None" = None,
) -> Dict[str, str]:
    """Dimensions that aggregate one ASG, one EKS managed node group or one HyperPod instance group."""
    if cluster_name and nodegroup_name:
        return {DIM_CLUSTER_NAME: cluster_name, DIM_NODEGROUP_NAME: nodegroup_name}
    if cluster_name and instance_group_name:
        return {DIM_CLUSTER_NAME: cluster_name, DIM_INSTANCE_GROUP_NAME: instance_group_name}
    if asg_name:
        return {DIM_ASG_NAME: asg_name}
    raise ValueError("a group is an ASG name, a (cluster, node group) or a (cluster, instance group) pair")


# ---- Who used the GPUs: per-workload usage records (`attribution` in the publisher config) ----
# Not one metric series per pod (CloudWatch bills each series by the hour): each node writes one compact
# JSON record per usage window to a CloudWatch Logs group, and `gpufleet report` reads them back. A few
# fleet-wide series per team (dimension DIM_TEAM only, so every node of the fleet shares them) feed the
# CloudWatch dashboard's per-team view.
USAGE_LOG_GROUP = "/gpufleet/usage"
USAGE_RECORD_VERSION = 1
USAGE_RECORD_MAX_BYTES = 200_000  # CloudWatch Logs takes events up to 256 KB: bigger records are split
USAGE_WINDOW_S = 300  # one record per node every 5 minutes: ~8,640 records per node-month
# ... sent in one PutLogEvents per USAGE_FLUSH_S: three records a call instead of one. A report sees a
# node's last quarter hour up to 15 minutes late; the node-month saves 5,760 calls ($0.06), which pays
# for the host series (ADAPTIVE_HOST_GROUP_METRICS).
USAGE_FLUSH_S = 900
# A GPU counts as idle in a sample when its utilization is at or below this (a process that only holds
# memory, a notebook between cells, a pod that requested a GPU it never touches).
IDLE_UTIL_PERCENT = 5.0
DIM_TEAM = "Team"
TEAM_GPU_HOURS_ALLOCATED = Metric(
    "TeamGPUHoursAllocated",
    "Count",
    "GPU-hours allocated to the team's workloads (a pod's GPUs, a job's processes)",
    COUNTER,
)
TEAM_GPU_HOURS_BUSY = Metric(
    "TeamGPUHoursBusy", "Count", "GPU-hours the team's workloads kept busy (utilization-weighted)", COUNTER
)
TEAM_METRICS: Tuple[Metric, ...] = (TEAM_GPU_HOURS_ALLOCATED, TEAM_GPU_HOURS_BUSY)
TEAM_UNALLOCATED = "__unallocated__"  # GPUs no workload held (OpenCost calls its like __idle__)
TEAM_UNKNOWN = "__unknown__"  # a process whose owner could not be read (no permission, gone, MIG)

# One usage record (JSON, one log event; short keys because a fleet writes millions of them):
#   v      USAGE_RECORD_VERSION
#   start  window start, ISO 8601 UTC ("2026-11-23T10:05:00Z"); s: window length in seconds
#   node   instance id; type: instance type; group: "asg:NAME" | "eks:CLUSTER/NODEGROUP" | null
#   gpus   GPUs on the node
#   w      workloads by a short reference: {"0": Workload.to_record(), ...} (see workload.py)
#   u      usage rows, one per (GPU, workload) seen in the window:
#          [gpu index, workload ref or null (unallocated), seconds held, busy GPU-seconds
#           (utilization-weighted), idle seconds (utilization <= IDLE_UTIL_PERCENT), peak memory MiB]
#   gone   what could not be known in the window, e.g. {"allocations": "kubelet socket not found"}
USAGE_ROW_FIELDS: Tuple[str, ...] = ("gpu", "workload", "held_s", "busy_s", "idle_s", "peak_mib")

# ---- Slurm's report on a HyperPod cluster: the controller node's own namespace ----
# Slurm's word on a HyperPod cluster (IdleNode, DrainedNode, PendingGPUs: which nodes may go, how many
# come) is read only from SLURM_NAMESPACE_PREFIX + the controller node's own aws:userid,
# "Slurm/ROLEID:SageMaker" (the controller group's execution role id, then the session name HyperPod gives
# every node: one namespace per execution role, so the scaler trusts it only from a controller role no
# other group shares). IAM lets a principal write "Slurm/${aws:userid}" and denies every other Slurm namespace
# in every role gpufleet ships (ami/hyperpod/*.json, template.yaml's node policy), so a write elsewhere - plain
# "Slurm", another role's - is never read. ami/slurm_pending_gpus.py keeps the same literal (it imports
# nothing of gpufleet's); tests/node/test_slurm_report_namespace.py checks that they agree.
SLURM_NAMESPACE = "Slurm"
SLURM_NAMESPACE_PREFIX = SLURM_NAMESPACE + "/"


def slurm_namespace(userid: str) -> str:
    """The Slurm report namespace only the credentials with this aws:userid may write."""
    return SLURM_NAMESPACE_PREFIX + userid
