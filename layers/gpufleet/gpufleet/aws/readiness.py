"""Is a node GPU-ready (adapter): when each instance launched (EC2 DescribeInstances) and whether its
publisher has reported GPUs (any GPUUtilization datum on the instance's own series lately). The demand
reader asks only about nodes it does not know to be ready yet, so the cost stays with the nodes that are
starting (or never start): one DescribeInstances page and one GetMetricData series each a tick, batched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from gpufleet.aws.eks_nodes import described_instances
from gpufleet.aws.metrics import GpuMetricsReader, SeriesQuery
from gpufleet.domain.nodes import NodeReadiness
from gpufleet_node import schema


def launch_times(ec2: Any, instance_ids: Iterable[str]) -> dict[str, datetime]:
    return {
        i["InstanceId"]: i["LaunchTime"]
        for i in described_instances(ec2, "instance-id", instance_ids)
        if isinstance(i.get("LaunchTime"), datetime)
    }


def node_readiness(
    ec2: Any, metrics: GpuMetricsReader, instance_ids: Iterable[str], now: datetime, within: timedelta
) -> Mapping[str, NodeReadiness]:
    """Each instance's launch time, and whether it sent a GPU metric within `within` (one series each:
    the caller asks only about nodes not yet known to be ready)."""
    launched = launch_times(ec2, instance_ids)
    ids = sorted(launched)
    queries = [SeriesQuery(iid, schema.GPU_UTILIZATION, ((schema.DIM_INSTANCE_ID, iid),), "SampleCount") for iid in ids]
    values = metrics.fetch(queries, now - within, now) if queries else {}
    return {iid: NodeReadiness(launched_at=launched[iid], gpus_reported=bool(values.get(iid))) for iid in ids}
