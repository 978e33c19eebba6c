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


VISIBLE = "ApproximateNumberOfMessages"  # waiting: nobody took them yet
IN_FLIGHT = "ApproximateNumberOfMessagesNotVisible"  # running: a worker took them and has not deleted them


def queue_counts(sqs: SQSClient, queue_url: str) -> tuple[int, int]:
    """(visible, in flight): SQS's approximate counts of the jobs that wait and of those being worked on.
    An answer without both counts, or with counts that are not whole numbers, is unreadable: it must never
    read as "nothing waits, nothing runs"."""
    source = f"queue {queue_url}"
    try:
        names: list[Any] = [VISIBLE, IN_FLIGHT]
        answer = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)
    except AWS_FAILURES as err:
        raise BacklogUnreadable(source, f"GetQueueAttributes failed ({error_code(err)})") from None
    found = answer.get("Attributes") if isinstance(answer, Mapping) else None
    if not isinstance(found, Mapping) or VISIBLE not in found or IN_FLIGHT not in found:
        raise BacklogUnreadable(source, "SQS answered without the message counts")
    counts = []
    for name in (VISIBLE, IN_FLIGHT):
        text = str(found[name]).strip()
        if not text.isdigit():
            raise BacklogUnreadable(source, f"SQS answered {name}={text[:40]!r}, not a whole number")
        counts.append(int(text))
    return counts[0], counts[1]


def latest_values(
    cloudwatch: CloudWatchClient,
    metrics: Sequence[tuple[str, str, Mapping[str, str]]],
    now: datetime,
) -> list[float | None]:
    """The latest Maximum of each (namespace, name, dimensions) within the last few minutes, one call for
    all of them; None where no datum came, NaN where the data were no finite number."""
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
        found = result.get("Values", [])
        values = [float(v) for v in found if math.isfinite(v)]
        if values:  # the newest datum as it is: a negative backlog is the caller's to refuse
            latest[str(result.get("Id"))] = values[0]
        elif found:  # data, none of it a finite number
            latest[str(result.get("Id"))] = math.nan
    return [latest.get(f"m{i}") for i in range(len(metrics))]
