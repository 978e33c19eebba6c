"""Backlogs of plain ASGs (adapter): an SQS queue of jobs, or a CloudWatch metric a scheduler publishes
(GPUs requested by waiting jobs: the Slurm publisher in ami/, Ray's or a home-made queue's own). One
GetQueueAttributes per queue, one GetMetricData for every metric source of a tick.

A source that cannot be read raises `BacklogUnreadable` (one line, the source named); the caller warns
once per cause and the group falls back to its utilization rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from gpufleet.aws.clients import AWS_FAILURES, error_code

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_sqs import SQSClient

METRIC_WINDOW = timedelta(minutes=5)  # the latest datum within this window counts; older means nothing waits


class BacklogUnreadable(Exception):
    def __init__(self, source: str, why: str) -> None:
        super().__init__(f"{source}: {why}")
        self.source, self.why = source, why


def queue_messages(sqs: SQSClient, queue_url: str, in_flight: bool) -> int:
    """Visible messages (and, when asked, those being worked on) - SQS's approximate counts."""
    names: list[Any] = ["ApproximateNumberOfMessages"]
    if in_flight:
        names.append("ApproximateNumberOfMessagesNotVisible")
    try:
        found = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    except AWS_FAILURES as err:
        raise BacklogUnreadable(f"queue {queue_url}", f"GetQueueAttributes failed ({error_code(err)})") from None
    try:
        return sum(max(0, int(found.get(name, "0"))) for name in names)
    except ValueError:
        raise BacklogUnreadable(f"queue {queue_url}", "SQS answered counts that are not numbers") from None


def latest_values(
    cloudwatch: CloudWatchClient,
    metrics: Sequence[tuple[str, str, Mapping[str, str]]],
    now: datetime,
) -> list[float | None]:
    """The latest Maximum of each (namespace, name, dimensions) within the last few minutes, one call for
    all of them; None where no datum came (nothing published: read as nothing waiting by the caller)."""
    if not metrics:
        return []
    queries: list[Any] = [
        {
            "Id": f"m{i}",
            "MetricStat": {
                "Metric": {
                    "Namespace": namespace,
                    "MetricName": name,
                    "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                },
                "Period": 60,
                "Stat": "Maximum",
            },
            "ReturnData": True,
        }
        for i, (namespace, name, dims) in enumerate(metrics)
    ]
    try:
        answer = cloudwatch.get_metric_data(
            MetricDataQueries=queries, StartTime=now - METRIC_WINDOW, EndTime=now, ScanBy="TimestampDescending"
        )
    except AWS_FAILURES as err:
        raise BacklogUnreadable("metric backlog", f"GetMetricData failed ({error_code(err)})") from None
    latest: dict[str, float] = {}
    for result in answer.get("MetricDataResults", []):
        values = [v for v in result.get("Values", []) if math.isfinite(v)]
        if values:
            latest[str(result.get("Id"))] = max(0.0, float(values[0]))
    return [latest.get(f"m{i}") for i in range(len(metrics))]
