"""GPU metrics from CloudWatch, read with batched GetMetricData (<= 500 queries per call).

Any node may write any series of the GPUFleet namespace (docs/scaler.md, "Forged metrics"): the group
average read every tick is checked (`group_checks`, `member_checks`, `scaling.metric_trust`) only on a tick
where it would make the scaler act, so the check costs GetMetricData metrics on those ticks alone."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from statistics import fmean
from typing import TYPE_CHECKING, Any

from gpufleet.aws.clients import chunks
from gpufleet.domain import defaults
from gpufleet.domain.models import GroupRef, SeriesStats
from gpufleet.domain.series import combine
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
    namespace: str = schema.NAMESPACE  # a node's own GPUFleet/Node/<aws:userid> for the guard's witness


def group_dimensions(ref: GroupRef) -> dict[str, str]:
    return ref.metric_dimensions


# What a series is checked with before it drives scaling: its samples, their sum, its extremes.
TRUST_STATS = ("SampleCount", "Sum", "Maximum", "Minimum")
GpusPerType = Callable[[Sequence[str]], Mapping[str, int]]


def ec2_gpus(ec2: Any) -> GpusPerType:
    """Instance type -> GPUs, from DescribeInstanceTypes (kept per container by `eks_nodes`)."""

    def gpus(types: Sequence[str]) -> Mapping[str, int]:
        from gpufleet.aws.eks_nodes import instance_types

        return {name: t.gpus for name, t in instance_types(ec2, types).items()}

    return gpus


class MetricsIncomplete(RuntimeError):
    """GetMetricData answered a result it did not complete (a strict read)."""


def _complete(result: Mapping[str, Any]) -> None:
    status = result.get("StatusCode", "Complete")
    if status not in ("Complete", "PartialData"):  # PartialData: more pages follow (NextToken)
        raise MetricsIncomplete(f"GetMetricData answered {status} for {result.get('Id')}")
    if len(result.get("Values", [])) != len(result.get("Timestamps", [])):
        raise MetricsIncomplete(f"GetMetricData answered values without their timestamps for {result.get('Id')}")


@dataclass
class GpuMetricsReader:
    cloudwatch: CloudWatchClient
    period_s: int = 60
    # GPUs per instance type, for the bound on what a group's members can publish; None: unknown (a
    # series that would drive scaling then holds, told).
    gpus_per_type: GpusPerType | None = None

    def fetch(self, queries: list[SeriesQuery], start: datetime, end: datetime) -> dict[str, list[float]]:
        """Values (newest first) per query key; a series without data maps to []."""
        return {k: [v for _, v in points] for k, points in self.fetch_points(queries, start, end).items()}

    def fetch_points(
        self, queries: list[SeriesQuery], start: datetime, end: datetime, strict: bool = False
    ) -> dict[str, list[tuple[datetime, float]]]:
        """(timestamp, value) pairs, newest first, per query key; a series without data maps to [].
        `strict`: a result GetMetricData did not complete (InternalError, Forbidden) or values without
        their timestamps raise MetricsIncomplete instead of reading as no data (a read that must fail
        closed: which HyperPod nodes Slurm calls idle)."""
        result: dict[str, list[tuple[datetime, float]]] = {q.key: [] for q in queries}
        for batch in chunks(queries, defaults.GET_METRIC_DATA_MAX_QUERIES):
            ids = {f"q{i}": q.key for i, q in enumerate(batch)}
            request = [
                {
                    "Id": qid,
                    "MetricStat": {
                        "Metric": {
                            "Namespace": q.namespace,
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
                    if strict:
                        _complete(res)
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

    def series_stats(
        self, series: Mapping[str, tuple[schema.Metric, dict[str, str]]], end: datetime, lookback_s: int
    ) -> dict[str, SeriesStats]:
        """Each named series (key -> metric, dimensions) over the lookback as one summary: TRUST_STATS,
        one batched read (4 metrics requested per series). Its per-period SampleCounts give the busiest
        minute too (`metric_trust.minute_bound`): nothing more is requested for it."""
        queries = [
            SeriesQuery(f"{key}|{stat}", metric, tuple(dims.items()), stat)
            for key, (metric, dims) in series.items()
            for stat in TRUST_STATS
        ]
        values = self.fetch(queries, end - timedelta(seconds=lookback_s), end) if queries else {}
        return {key: combine(key, {st: values[f"{key}|{st}"] for st in TRUST_STATS}) for key in series}

    def group_checks(
        self, groups: Mapping[str, tuple[GroupRef, schema.Metric]], end: datetime, lookback_s: int
    ) -> dict[str, SeriesStats]:
        """Per group key: its group series of `metric` over the lookback, summarised for the bound check."""
        named = {key: (metric, group_dimensions(ref)) for key, (ref, metric) in groups.items()}
        found = self.series_stats(named, end, lookback_s)
        return {key: found[key].model_copy(update={"name": f"group {key} {groups[key][1].name}"}) for key in groups}

    def member_checks(
        self, instance_ids: Iterable[str], metric: schema.Metric, end: datetime, lookback_s: int
    ) -> dict[str, SeriesStats]:
        """Per instance: its own series of `metric` (dimension InstanceId, always published) summarised."""
        named = {iid: (metric, {schema.DIM_INSTANCE_ID: iid}) for iid in sorted(set(instance_ids))}
        found = self.series_stats(named, end, lookback_s)
        return {iid: s.model_copy(update={"name": f"instance {iid} {metric.name}"}) for iid, s in found.items()}

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
        scale-in list. Not checked for forgery: beside an honest publisher a forged datum can only raise
        a node's figure, which keeps that node in service. A node that publishes nothing itself (its
        publisher down) has no figure and is never idle; a forger could give it one: the residual risk
        named in docs/scaler.md."""
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
