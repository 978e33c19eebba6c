"""GPU metrics from CloudWatch, read with batched GetMetricData (<= 500 queries per call)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import fmean
from typing import TYPE_CHECKING, Any

from gpufleet.aws.fleet import chunks
from gpufleet.domain import defaults
from gpufleet.domain.models import GroupRef
from gpufleet_node import schema

if TYPE_CHECKING:
    from mypy_boto3_cloudwatch import CloudWatchClient


@dataclass(frozen=True)
class SeriesQuery:
    """One CloudWatch series: what to ask for and under which key to return it."""

    key: str
    metric: schema.Metric
    dimensions: tuple[tuple[str, str], ...]
    stat: str


def group_dimensions(ref: GroupRef) -> dict[str, str]:
    return ref.metric_dimensions


@dataclass
class GpuMetricsReader:
    cloudwatch: CloudWatchClient
    period_s: int = 60

    def fetch(self, queries: list[SeriesQuery], start: datetime, end: datetime) -> dict[str, list[float]]:
        """Values (newest first) per query key; a series without data maps to []."""
        return {k: [v for _, v in points] for k, points in self.fetch_points(queries, start, end).items()}

    def fetch_points(
        self, queries: list[SeriesQuery], start: datetime, end: datetime
    ) -> dict[str, list[tuple[datetime, float]]]:
        """(timestamp, value) pairs, newest first, per query key; a series without data maps to []."""
        result: dict[str, list[tuple[datetime, float]]] = {q.key: [] for q in queries}
        for batch in chunks(queries, defaults.GET_METRIC_DATA_MAX_QUERIES):
            ids = {f"q{i}": q.key for i, q in enumerate(batch)}
            request = [
                {
                    "Id": qid,
                    "MetricStat": {
                        "Metric": {
                            "Namespace": schema.NAMESPACE,
                            "MetricName": q.metric.name,
                            "Dimensions": [{"Name": k, "Value": v} for k, v in q.dimensions],
                        },
                        "Period": self.period_s,
                        "Stat": q.stat,
                    },
                    "ReturnData": True,
                }
                for qid, q in zip(ids, batch, strict=True)
            ]
            token: str | None = None
            while True:
                args: dict[str, Any] = {
                    "MetricDataQueries": request,
                    "StartTime": start,
                    "EndTime": end,
                    "ScanBy": "TimestampDescending",
                }
                if token:
                    args["NextToken"] = token
                page = self.cloudwatch.get_metric_data(**args)
                for res in page.get("MetricDataResults", []):
                    pairs = zip(res.get("Timestamps", []), res.get("Values", []), strict=False)
                    result[ids[res["Id"]]].extend((t, float(v)) for t, v in pairs)
                token = page.get("NextToken")
                if not token:
                    break
        return result

    def group_utilization(self, groups: Iterable[GroupRef], end: datetime, lookback_s: int) -> dict[str, float | None]:
        """Mean of the per-minute group averages over the lookback window."""
        queries = [
            SeriesQuery(g.key, schema.GPU_UTILIZATION, tuple(group_dimensions(g).items()), "Average") for g in groups
        ]
        values = self.fetch(queries, end - timedelta(seconds=lookback_s), end)
        return {k: (fmean(v) if v else None) for k, v in values.items()}

    def gpus_of(self, instance_id: str) -> list[int]:
        """The GPU indexes of an instance that have series of their own now (ListMetrics on the instance's
        dimension: a GPU has them while in detail, or while a counter of it is non-zero)."""
        found = set()
        kwargs: dict[str, Any] = {
            "Namespace": schema.NAMESPACE,
            "Dimensions": [{"Name": schema.DIM_INSTANCE_ID, "Value": instance_id}],
            "RecentlyActive": "PT3H",
        }
        while True:
            page = self.cloudwatch.list_metrics(**kwargs)
            for m in page.get("Metrics", []):
                dims = {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}
                if set(dims) == set(schema.GPU_DIMENSIONS) and dims[schema.DIM_INSTANCE_ID] == instance_id:
                    found.add(int(dims[schema.DIM_GPU_INDEX]))
            token = page.get("NextToken")
            if not token:
                return sorted(found)
            kwargs["NextToken"] = token

    def instance_gpu(
        self, instance_ids: Iterable[str], end: datetime, lookback_s: int
    ) -> dict[str, tuple[float | None, float | None]]:
        """Per instance: (busiest GPU utilization, fullest GPU memory %) over the lookback window.

        Both use the maximum, so one busy minute or one full GPU keeps the instance off the
        scale-in list."""
        ids = sorted(set(instance_ids))
        queries = []
        for iid in ids:
            dims = ((schema.DIM_INSTANCE_ID, iid),)
            queries.append(SeriesQuery(f"{iid}/util", schema.GPU_UTILIZATION, dims, "Maximum"))
            queries.append(SeriesQuery(f"{iid}/mem", schema.GPU_MEMORY_USED_PERCENT, dims, "Maximum"))
        values = self.fetch(queries, end - timedelta(seconds=lookback_s), end)
        return {
            iid: (
                max(values[f"{iid}/util"]) if values[f"{iid}/util"] else None,
                max(values[f"{iid}/mem"]) if values[f"{iid}/mem"] else None,
            )
            for iid in ids
        }
