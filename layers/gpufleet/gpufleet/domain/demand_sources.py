"""The demand sources' names, written once: the policy's keys (`demand: {kubernetes: ...}`), the traits
table's `demand_sources`, and the keys the readers are registered under (`scaling.demand_source.READERS`).
A new source is one name here, one model in `policy.fleet`, and one reader registered."""

from __future__ import annotations

from enum import StrEnum


class SourceName(StrEnum):
    """Where a group's waiting work is read, by the policy's word for it (in the order they are read)."""

    KUBERNETES = "kubernetes"  # pods waiting in an EKS cluster
    SQS = "sqs"  # messages waiting in an SQS queue
    METRIC = "metric"  # GPUs waiting jobs request, as a scheduler publishes them to CloudWatch
