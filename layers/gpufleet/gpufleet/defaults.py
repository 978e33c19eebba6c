"""One source of truth for tag keys, environment variable names and default values."""

from __future__ import annotations

# Tags on ASGs / EKS node groups / alarms.
TAG_MANAGED = "gpufleet:managed"
TAG_MANAGED_VALUE = "true"
TAG_ALARM_TARGET = "gpufleet:target"  # "asg:NAME" or "eks:CLUSTER/NODEGROUP"
TAG_ALARM_DIRECTION = "gpufleet:direction"  # "out" or "in"

# Environment of the deployed functions (read only in handlers / the composition root).
ENV_STATE_TABLE = "GPUFLEET_STATE_TABLE"
ENV_POLICY_PARAMETER = "GPUFLEET_POLICY_PARAMETER"
ENV_POLICY_FILE = "GPUFLEET_POLICY_FILE"
ENV_DRY_RUN = "GPUFLEET_DRY_RUN"
ENV_ALARM_PREFIX = "GPUFLEET_ALARM_PREFIX"
ENV_ENDPOINT_URL = "AWS_ENDPOINT_URL"  # honoured natively by boto3; set by `gpufleet invoke --endpoint`

# Defaults of the fleet policy.
DEFAULT_ALARM_PREFIX = "gpufleet-"
DEFAULT_SCALE_OUT_COOLDOWN_S = 300
DEFAULT_SCALE_IN_COOLDOWN_S = 600
DEFAULT_TARGET_LOW = 30.0
DEFAULT_TARGET_HIGH = 80.0
DEFAULT_IDLE_GPU_UTILIZATION = 5.0
DEFAULT_IDLE_GPU_MEMORY_PERCENT = 10.0
DEFAULT_METRIC_LOOKBACK_S = 300
DEFAULT_AUDIT_TTL_DAYS = 14

# Safety mechanics.
LEASE_SECONDS = 60
IDEMPOTENCY_TTL_S = 3600
POLICY_CACHE_S = 60

# AWS API batch limits.
GET_METRIC_DATA_MAX_QUERIES = 500
DESCRIBE_ASG_MAX_NAMES = 100
