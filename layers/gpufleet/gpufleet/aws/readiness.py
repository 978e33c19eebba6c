"""Is a node GPU-ready (adapter): when each instance launched (EC2 DescribeInstances) and whether its
publisher has reported GPUs (any GPUUtilization datum on the instance's own series lately). The demand
reader asks only about nodes it does not know to be ready yet, so the cost stays with the nodes that are
starting (or never start): one DescribeInstances page and one GetMetricData series each a tick, batched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from gpufleet.aws.metrics import GpuMetricsReader, SeriesQuery
from gpufleet.scaling.demand_share import NodeReadiness
from gpufleet_node import schema

IDS_PER_CALL = 200  # DescribeInstances' filter values


def launch_times(ec2: Any, instance_ids: Iterable[str]) -> dict[str, datetime]:
    ids = sorted(set(instance_ids))
    found: dict[str, datetime] = {}
    for start in range(0, len(ids), IDS_PER_CALL):
        filters = [{"Name": "instance-id", "Values": ids[start : start + IDS_PER_CALL]}]
        for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    if isinstance(instance.get("LaunchTime"), datetime):
                        found[instance["InstanceId"]] = instance["LaunchTime"]
    return found


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
