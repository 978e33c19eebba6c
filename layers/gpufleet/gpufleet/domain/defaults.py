"""One source of truth for tag keys, environment variable names and default values."""

from __future__ import annotations

# Tags on ASGs / EKS node groups / alarms.
TAG_MANAGED = "gpufleet:managed"
TAG_MANAGED_VALUE = "true"
# What EKS tags a managed node group's backing ASG with (never gpufleet's own tags).
TAG_EKS_CLUSTER = "eks:cluster-name"
TAG_EKS_NODEGROUP = "eks:nodegroup-name"
TAG_CLUSTER_AUTOSCALER = "k8s.io/cluster-autoscaler/enabled"  # Cluster Autoscaler discovery (EKS adds it too)
TAG_ALARM_TARGET = "gpufleet:target"  # "asg:NAME" or "eks:CLUSTER/NODEGROUP"
TAG_ALARM_DIRECTION = "gpufleet:direction"  # "out" or "in"

# Environment of the deployed functions (read only in handlers / the composition root).
ENV_STATE_TABLE = "GPUFLEET_STATE_TABLE"
ENV_ACCOUNT_ID = "GPUFLEET_ACCOUNT_ID"  # the stack's account: events naming another are refused
ENV_POLICY_PARAMETER = "GPUFLEET_POLICY_PARAMETER"
ENV_POLICY_FILE = "GPUFLEET_POLICY_FILE"
ENV_DRY_RUN = "GPUFLEET_DRY_RUN"
ENV_ALARM_PREFIX = "GPUFLEET_ALARM_PREFIX"
ENV_ENDPOINT_URL = "AWS_ENDPOINT_URL"  # honoured natively by boto3; set by `gpufleet invoke --endpoint`

# Defaults of the fleet policy.
DEFAULT_ALARM_PREFIX = "gpufleet-"
DEFAULT_SCALE_OUT_COOLDOWN_S = 300
DEFAULT_SCALE_IN_COOLDOWN_S = 600
# A new GPU node is capacity on the way until it serves: launch, boot, driver and device plugin take
# minutes (the replay's boot model: 5 min). Within this time after a scale-out, nodes not yet in service
# count against the next scale-out signal instead of launching a second node for the same load.
DEFAULT_WARMUP_S = 300
# Two controllers sizing one group fight silently (Cluster Autoscaler's FAQ: metric-based node-group
# autoscalers must not run on its groups). This many changes gpufleet did not make, within the window,
# while gpufleet also changed the group, and gpufleet stands aside (advises only) for STAND_ASIDE_S.
FIGHT_WINDOW_S = 1800
FIGHT_FOREIGN_CHANGES = 2
STAND_ASIDE_S = 6 * 3600
FOREIGN_KEPT = 10  # the latest foreign changes kept in a group's state (named in the incident)
DEFAULT_TARGET_LOW = 30.0
DEFAULT_TARGET_HIGH = 80.0
DEFAULT_IDLE_GPU_UTILIZATION = 5.0
DEFAULT_IDLE_GPU_MEMORY_PERCENT = 10.0
DEFAULT_METRIC_LOOKBACK_S = 300
DEFAULT_AUDIT_TTL_DAYS = 14

# Safety mechanics.
LEASE_SECONDS = 300  # > the functions' 120 s timeout (tested): a slow apply never loses its lease
IDEMPOTENCY_TTL_S = 3600
POLICY_CACHE_S = 60

# AWS API batch limits.
GET_METRIC_DATA_MAX_QUERIES = 500
DESCRIBE_ASG_MAX_NAMES = 100
# DescribeAutoScalingInstances takes at most 50 InstanceIds (EC2 Auto Scaling API reference).
DESCRIBE_ASG_INSTANCES_MAX_IDS = 50
SET_PROTECTION_MAX_IDS = 50  # SetInstanceProtection takes at most 50 InstanceIds a call
# A busy mark older than this (its `since`) is told once, and still obeyed: a job may run for days, but a
# helper killed with SIGKILL (or a reboot) leaves its mark until a later job on the node leaves.
BUSY_MARK_STALE_S = 86_400
# A change left in progress is finished as it was decided only within one reconcile tick of its decision;
# older, it is decided again on what is read now (its victims may have taken work since).
INTENT_REPLAY_S = 60
LIST_METRICS_MAX_PAGES = 200  # 500 series a page: the guard lists at most 100,000 publishing series

# Notifications (issue 3).
ENV_NOTIFY_QUEUE_URL = "GPUFLEET_NOTIFY_QUEUE_URL"
ENV_NOTIFY_DLQ_URL = "GPUFLEET_NOTIFY_DLQ_URL"
ENV_NOTIFY_TOPIC_ARN = "GPUFLEET_NOTIFY_TOPIC_ARN"
ENV_SLACK_SECRET = "GPUFLEET_SLACK_SECRET_ARN"  # the secret's ARN, never its value
ENV_SLACK_API_URL = "GPUFLEET_SLACK_API_URL"  # bot mode against a Slack-compatible test server
ENV_SLACK_TIMEOUT_S = "GPUFLEET_SLACK_TIMEOUT_S"
SLACK_TIMEOUT_S = 10
NOTIFY_GROUP_WAIT_S = 30
NOTIFY_GROUP_INTERVAL_S = 300
NOTIFY_REPEAT_INTERVAL_S = 4 * 3600
NOTIFY_FLAP_MAX_FLIPS = 4
NOTIFY_FLAP_WINDOW_S = 3600
SECRET_CACHE_S = 300
# spot_watch's sweep tells about a reservation a managed group launches into this long before it ends
# (EC2's own Capacity Block warning comes 40 minutes before; instances go from 30 minutes before).
RESERVATION_END_WARNING_S = 3600

# DynamoDB batch items left unprocessed (throttling): retried with full-jitter backoff, then an error.
BATCH_ATTEMPTS = 8
BATCH_BACKOFF_BASE_S = 0.05
BATCH_BACKOFF_CAP_S = 2.0
BATCH_WAIT_MAX_S = 5.0  # waiting in all, inside the controllers' timeouts (60 s and more)
TERMINATION_BATCH_WAIT_MAX_S = 0.3  # the termination policy answers within 2 s: it barely waits

# Demand sources (issue 28).
# A backlog count past this is read as this many: no queue or scheduler of one fleet holds more, and every
# number from outside must give a bounded answer (a metric of 1e20 asks for max, not for memory).
MAX_BACKLOG_ITEMS = 1_000_000
# A new node is room for waiting work only once it can serve GPUs. Past this it is an incident and no
# longer counts (Cluster Autoscaler's max-node-provision-time is 15 minutes too).
DEFAULT_GPU_READY_TIMEOUT_S = 900
# Pods below this priority ask for no node (Cluster Autoscaler's expendable-pods-priority-cutoff: -10).
DEFAULT_EXPENDABLE_PRIORITY = -10

# What one node can put into a GPU series (issue 29: a node's forged datum must not outweigh its group).
# The node publisher's defaults (layers/node/gpufleet_node/config.py): one NVML sample per GPU per second
# (`sample_interval_s: 1`) into windows of 60 s (`window_s: 60`), each sample in the GPU's, the instance's
# and the group's series once. A fleet sampling faster, or with `high_resolution: true` (its 10 s datums
# land in the same series: twice the samples), reads as over the bound and holds, told (docs/scaler.md).
NODE_SAMPLES_PER_GPU_S = 1.0
NODE_PUBLISH_WINDOW_S = 60
# A publisher's windows start on the epoch's minute (gpufleet_node.aggregate.window_start) and its datums
# carry the window's start, so each 60 s window lands whole in one of GetMetricData's 60 s periods: a
# member puts at most GPUs x 60 x samples-per-GPU-second into any one minute. The rounds run on the
# monotonic clock and the windows on the wall clock: a wall clock stepped back by up to a second (NTP)
# fits one extra round into a window, 1/60 = 1.7 %; 2 % covers it.
NODE_MINUTE_JITTER = 0.02
METRIC_PERIOD_S = 60  # the period the scaler reads GPU series with (GetMetricData Period)
# The one statistic an alarm on a node-writable GPU series may act with: a mean weighed by samples, which
# the sample bound holds down. Maximum, Minimum, percentiles and trimmed statistics follow one datum.
ALARM_TRUSTED_STAT = "Average"
PERCENT_MIN = 0.0  # a percent series (GPUUtilization, GPUMemoryUsedPercent) holds nothing outside 0-100
PERCENT_MAX = 100.0
# The most GPUs one current EC2 GPU instance type has (p5.48xlarge, p4d.24xlarge, g6e.48xlarge: 8), and
# the slack for a max size lowered within the lookback: a group series past that many members' samples
# is a flood no departed member explains.
MAX_GPUS_PER_INSTANCE = 8
CEILING_MAX_SIZE_FACTOR = 2
# An in-band hold's group series is checked once every this many minutes (the acting ticks always are):
# a flood that holds a group in the band is found within this time, at a tenth of the check's cost.
SERIES_AUDIT_EVERY_MIN = 10
# The OOM guard screens host memory (each group's HostMemoryUsedPercent Maximum) on its first run in a
# container, then on each run HOST_SCREEN_EVERY_MIN minutes or more after that container's last screen
# (less HOST_SCREEN_SLACK_S: runs of a rate schedule are seconds early or late), and on every run while
# it holds a host at risk. Not on a fixed minute grid: EventBridge Scheduler starts a rate schedule when
# it is created, so rate(5 minutes) may run at :02, :07, ... and never on a multiple of 5. Each read
# covers the whole 15-minute trend window, so no point is lost, only up to 4 minutes of notice; at
# rate(1 minute) it saves 4 of 5 reads per group ($0.03 per node-month at 10 nodes a group, which keeps
# the telemetry bench within $2.00: bench/README.md).
HOST_SCREEN_EVERY_MIN = 5
HOST_SCREEN_SLACK_S = 30
# A node's own host memory is read this far back (the same metrics billed: GetMetricData is priced per
# metric, not per point): a host held at risk whose series went silent in the trend window is told with
# its last reading ("no reading since 99 %": gone, thrashing or its publisher OOM-killed), not as "back to
# normal" (guard/core.py forecast_host).
HOST_SILENT_LOOKBACK_MIN = 60

# ---- SageMaker HyperPod (Slurm orchestrator) instance groups: aws/hyperpod.py, docs/hyperpod.md ----
# The contract with the Slurm backlog publisher on the cluster's controller node (ami/slurm_pending_gpus.py
# --hyperpod CLUSTER:GROUP): each minute it puts HYPERPOD_IDLE_METRIC = 1 into HYPERPOD_IDLE_NAMESPACE
# with dimensions {ClusterName, InstanceGroupName, InstanceId} for every node Slurm reports IDLE (no
# allocation, no DRAIN/DOWN/COMPLETING/... flag), and 0 for each other node of a mapped group it can name
# (its instance id from HyperPod's resource file, else from ListClusterNodes/DescribeClusterNode with the
# controller node's role: the dimensions stay the instance id either way). The scaler removes a node
# only if HYPERPOD_IDLE_MINUTES whole minutes before the current one all say idle, the newest of them
# present, one older missing minute forgiven (cron jitter, ingestion delay: HYPERPOD_IDLE_MISSING_OK), and
# no datum (the current minute's too) says anything but 1 (domain.slurm_report.idle_nodes).
HYPERPOD_IDLE_NAMESPACE = "Slurm"  # the backlog publisher's namespace (its PendingGPUs lives there too)
HYPERPOD_IDLE_METRIC = "IdleNode"
# With it, for a node Slurm shows `drained` with a gpufleet reason and no job (the drain gpufleet asked for has
# landed): HYPERPOD_DRAINED_METRIC = 1, same dimensions. A node gpufleet asked to drain is removable only
# when the newest landed report says so (domain.slurm_report.drained_nodes): the clock is never trusted for it.
HYPERPOD_DRAINED_METRIC = "DrainedNode"
HYPERPOD_IDLE_MINUTES = 5
HYPERPOD_IDLE_MISSING_OK = 1
HYPERPOD_PENDING_METRIC = "PendingGPUs"  # the backlog the same publisher puts, per instance group
# BatchDeleteClusterNodes takes at most 99 node ids a call (more "contact Support": the API reference).
HYPERPOD_DELETE_MAX_NODES = 99
LIST_CLUSTER_NODES_MAX_RESULTS = 100  # ListClusterNodes MaxResults (its API maximum)
# HyperPod instance groups have no max size: the policy rule's `max` bounds them (policy_checks requires
# it); the observation carries this ceiling so only the rule's max ever binds.
HYPERPOD_NO_MAX = 100_000
# What one node may be said to offer (a node-template resources tag, demand.kubernetes.allocatable): more, or
# an infinite quantity ('1e400'), is no node's and fails its group's shape in one line.
NODE_GPUS_MAX = 1024.0  # nvidia.com/gpu, shares included (as demand.gpus_per_node)
NODE_RESOURCE_MAX = float(2**60)  # any other resource: 1 EiB of memory or storage, 2**60 cores or pods

# ---- consolidation by attrition (docs/consolidation.md) ----
# A node gpufleet cordoned carries this annotation (when and why). Only a node with it is ever uncordoned by
# gpufleet: a node someone else cordoned is left alone.
DRAIN_ANNOTATION = "gpufleet.io/drained"
# ...and this label ("true"), so the nodes gpufleet closed are found by one cheap listing
# (`GET /api/v1/nodes?labelSelector=gpufleet.io/drained`) on clusters where no group consolidates (to reopen them).
DRAIN_LABEL = "gpufleet.io/drained"
# The Kubernetes group the scaler's EKS access entry puts it in (template.yaml ScalerEksAccess*), bound by
# deploy/kubernetes/gpufleet-node-marks.yaml to a ClusterRole of the same name: nodes get, list, patch only.
NODE_MARKS_GROUP = "gpufleet-node-marks"
# Gangs (jobs whose pods start together: docs/queued-jobs.md). A gang's nodes are asked in one change; when
# some of them have not launched this long after that change (EC2 capacity), the nodes that came and sit
# idle, and those never launched, are given back: Cluster Autoscaler's max-node-provision-time is 15 min,
# a GPU node boots in 5-10 min, so 10 min is a launch that is not coming. Then gangs rest as long before
# their nodes are asked again (Cluster Autoscaler backs a failed node group off 5 min, doubling to 30).
GANG_LAUNCH_TIMEOUT_S = 600
GANG_REST_S = 600
# The Kubernetes group whose ClusterRole reads queued jobs (Kueue, Volcano): deploy/kubernetes/gpufleet-queued-jobs.yaml
QUEUED_JOBS_GROUP = "gpufleet-queued-jobs"
# Slurm: the reason gpufleet gives `scontrol update state=drain`; only a node drained with it is resumed.
SLURM_DRAIN_REASON_PREFIX = "gpufleet:"
# At most this share of a group's serving nodes drains at once (policy `drain_max_share`, percent).
DEFAULT_DRAIN_MAX_SHARE_PCT = 50
# The state table item the controller-side Slurm publisher reads the drains gpufleet asks for from.
SLURM_MARKS_KEY_PREFIX = "slurm-marks#"
# No longer read by the scaler (a drained node is removable only on Slurm's DrainedNode word, never on the
# clock: domain.slurm_report.drained_nodes); kept only while rehearsal/hyperpod_scene.py still cites it. Remove both.
SLURM_DRAIN_SETTLE_S = 180
# After node marks fail (RBAC missing, API refusing), this long nothing drains or reopens and waiting work
# gets a launch instead of a drained node's room: one failure is told, not retried every minute.
MARKS_REST_S = 600
# A drain gpufleet asked of Slurm that the report does not show this many minutes later is told (once).
HYPERPOD_DRAIN_LATE_MIN = 5
# Queued jobs per tenant (kubernetes/queued.py, docs/queued-jobs.md "Tenants"): one namespace's Kueue
# Workloads or Volcano PodGroups count as at most this many gangs and stand for at most this many pods
# (a gang past it is cut whole, told once per namespace with the numbers); one ClusterQueue or Volcano
# Queue for at most QUEUED_PODS_PER_QUEUE, the cluster for at most QUEUED_PODS (past a shared cap the
# namespaces holding the most are cut first, so one tenant's objects cut only its own demand). 10,000
# pods is 1,250 nodes of 8 GPUs: more than any one team's gang; 100,000 is the pod listing's own bound.
QUEUED_JOBS_PER_NAMESPACE = 1_000
QUEUED_PODS_PER_NAMESPACE = 10_000
QUEUED_PODS_PER_QUEUE = 25_000
QUEUED_PODS = 100_000
# A queued listing's page that is too big to hold (client.MAX_BODY) is asked again with half the limit,
# down to this many objects a page; a page of one object still too big leaves that system unreadable.
KUBE_MIN_PAGE = 1
# ---- HyperPod: whose Slurm report is read (docs/hyperpod.md "Whose report is read") ----
# Slurm's report is read only from the controller node's own namespace, schema.slurm_namespace("ROLEID:i-...").
# The controller node is the one node of the instance group DescribeCluster calls Slurm's controller
# (InstanceGroups[].SlurmConfig.NodeType == HYPERPOD_CONTROLLER_NODE_TYPE), else of the group the cluster's
# HYPERPOD_CONTROLLER_GROUP_TAG names (clusters whose Slurm config is the lifecycle scripts'
# provisioning_parameters.json `controller_group`, which no API returns). Neither, or not exactly one node:
# no report is trusted (nothing of the cluster is removed, its backlog unreadable), told once.
HYPERPOD_CONTROLLER_NODE_TYPE = "Controller"
HYPERPOD_CONTROLLER_GROUP_TAG = "gpufleet:slurm-controller-group"
# The session name of a HyperPod node's execution-role credentials: `aws sts get-caller-identity` on a
# cluster node answers "assumed-role/<role>/SageMaker", UserId "<role id>:SageMaker" (not the instance id,
# as an EC2 instance profile's). So "Slurm/${aws:userid}" is one namespace per execution role, and every
# node of every group with that role can write it: the report is trusted only from a controller group
# whose execution role no other group of the cluster shares.
HYPERPOD_SESSION_NAME = "SageMaker"
# How often (at most, per cluster and warm container) the scaler lists which Slurm namespaces hold the
# cluster's report (one ListMetrics, only when a scale-in is weighed), to tell once of data it ignores.
HYPERPOD_FOREIGN_REPORT_CHECK_S = 3600
# ListMetrics' RecentlyActive: only series that received data in the past three hours (its only value).
HYPERPOD_FOREIGN_REPORT_RECENT = "PT3H"
