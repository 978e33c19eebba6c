"""`gpufleet replay`'s glue: read the trace or the group's CloudWatch history, run the pure replay with a
progress bar (tqdm), write report.json / report.md / capacity.png (plot.py, matplotlib) and print the table.

CloudWatch history is read with batched GetMetricData: at most 500 series per call and at most 1,440
one-minute datapoints per series per call (CloudWatch's limit), so a long range is split into days.
"""

from __future__ import annotations

import json
import random
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet.policy.fleet import FleetPolicy, parse_policy
from gpufleet_node import schema
from gpufleet_tools.replay.core import Experiment, group_settings
from gpufleet_tools.replay.history import (
    History,
    HistoryReport,
    InstanceSeries,
    history_md,
    replay_history,
    unreplayable,
)
from gpufleet_tools.replay.model import ReplayOptions, ReplayRequest, Trace
from gpufleet_tools.replay.plot import plot
from gpufleet_tools.replay.policy import Workload, recommended_policy, workload_of
from gpufleet_tools.replay.report import Comparison, compare, report_json, report_md
from gpufleet_tools.replay.traces import bursty_trace, parse_trace, to_v2023_csv, training_trace

MAX_POINTS_PER_CALL = 1440  # CloudWatch: datapoints per series per GetMetricData call
SYNTHETIC = {"synthetic:bursty": bursty_trace, "synthetic:training": training_trace}
ALL_EXPERIMENTS = (
    Experiment(utilization_only=True),
    Experiment(utilization_only=True, proportional_step=True),
    Experiment(proportional_step=True),
    Experiment(booting_counted=True),
    Experiment(consolidation_off=True),
    Experiment(proportional_step=True, booting_counted=True),
)


def load_trace(spec: str, seed: int, days: int) -> Trace:
    """A trace file in either Alibaba format, or `synthetic:bursty` / `synthetic:training` (seeded)."""
    if spec in SYNTHETIC:
        return SYNTHETIC[spec](random.Random(seed), days=days)
    with open(spec, newline="") as f:
        return parse_trace(f, Path(spec).name)


def load_policy(path: str | None, workload: Workload) -> tuple[FleetPolicy, str]:
    """The policy file given, else the recommended policy (docs/replay.md) for the workload."""
    if path:
        return parse_policy(Path(path).read_text(), path), path
    return recommended_policy(workload), f"recommended ({workload})"


def _progress(total: int, enabled: bool) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A tqdm bar over simulated minutes (all runs), on stderr; nothing when disabled."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=total, unit="min", unit_scale=True, desc="replay", file=sys.stderr, leave=False)
    return bar.update, bar.close


def run_comparison(
    trace: Trace, policy: FleetPolicy, options: ReplayOptions, experiments: Sequence[Experiment], show: bool
) -> Comparison:
    update, close = _progress(trace.horizon * (4 + len(experiments)), show)
    try:
        return compare(trace, policy, options, random.Random(options.seed), experiments=experiments, progress=update)
    finally:
        close()


def write_outputs(c: Comparison, out: Path, policy_label: str, trace: Trace) -> str:
    """report.json, report.md, capacity.png (and the synthetic trace as a v2023 CSV, to replay again)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = report_json(c)
    doc["policy"] = policy_label
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")
    md = report_md(c).replace("\n\n", f"\n\nPolicy: {policy_label}.\n\n", 1)
    (out / "report.md").write_text(md)
    plot(c, out / "capacity.png")
    if trace.source.startswith("synthetic"):
        name = trace.source.split(",")[0].replace(" ", "-")
        (out / f"{name}.csv").write_text(to_v2023_csv(trace))
    return md


def replay_trace(request: ReplayRequest, trace_spec: str) -> int:
    trace = load_trace(trace_spec, request.options.seed, request.days)
    workload = Workload(request.workload) if request.workload else workload_of(trace.format)
    policy, label = load_policy(request.policy, workload)
    experiments = ALL_EXPERIMENTS if request.experiments else ()
    c = run_comparison(trace, policy, request.options, experiments, show=request.progress)
    md = write_outputs(c, Path(request.out), label, trace)
    print(md, end="")
    print(f"\nwritten: {request.out}/report.json, report.md, capacity.png")
    return 0


# ---- CloudWatch history ----


@dataclass(frozen=True)
class Series:
    key: str
    namespace: str
    metric: str
    dimensions: tuple[tuple[str, str], ...]
    stat: str


def _spans(start: datetime, end: datetime) -> Iterator[tuple[datetime, datetime]]:
    step = timedelta(minutes=MAX_POINTS_PER_CALL)
    while start < end:
        yield start, min(end, start + step)
        start += step


def fetch_minutes(
    cloudwatch: Any, series: Sequence[Series], start: datetime, end: datetime
) -> dict[str, dict[int, float]]:
    """Per series key: {minute index from start: value}. <= 500 series and <= 1,440 minutes per call."""
    out: dict[str, dict[int, float]] = {s.key: {} for s in series}
    for i in range(0, len(series), defaults.GET_METRIC_DATA_MAX_QUERIES):
        batch = series[i : i + defaults.GET_METRIC_DATA_MAX_QUERIES]
        queries = [
            {
                "Id": f"q{k}",
                "MetricStat": {
                    "Metric": {
                        "Namespace": s.namespace,
                        "MetricName": s.metric,
                        "Dimensions": [{"Name": n, "Value": v} for n, v in s.dimensions],
                    },
                    "Period": 60,
                    "Stat": s.stat,
                },
                "ReturnData": True,
            }
            for k, s in enumerate(batch)
        ]
        for lo, hi in _spans(start, end):
            token: str | None = None
            while True:
                kw: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": lo, "EndTime": hi}
                if token:
                    kw["NextToken"] = token
                page = cloudwatch.get_metric_data(**kw)
                for res in page.get("MetricDataResults", []):
                    values = out[batch[int(res["Id"][1:])].key]
                    for ts, v in zip(res.get("Timestamps", []), res.get("Values", []), strict=False):
                        values[int((ts - start).total_seconds() // 60)] = float(v)
                token = page.get("NextToken")
                if not token:
                    break
    return out


def group_asg(ref: GroupRef, autoscaling: Any, eks: Any) -> dict[str, Any] | None:
    """The ASG holding the group's instances (an EKS node group's own ASG), or None."""
    name = ref.name
    if ref.kind is GroupKind.EKS_NODEGROUP:
        try:
            ng = eks.describe_nodegroup(clusterName=ref.cluster, nodegroupName=ref.name)["nodegroup"]
        except eks.exceptions.ResourceNotFoundException:
            return None
        asgs = ng.get("resources", {}).get("autoScalingGroups", [])
        if not asgs:
            return None
        name = asgs[0]["name"]
    found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])["AutoScalingGroups"]
    return found[0] if found else None


def members(asg: dict[str, Any], autoscaling: Any) -> list[str]:
    """Instances that were in the group: the current ones plus every id its scaling activities name."""
    ids = {i["InstanceId"] for i in asg.get("Instances", [])}
    kwargs: dict[str, Any] = {"AutoScalingGroupName": asg["AutoScalingGroupName"]}
    while True:
        page = autoscaling.describe_scaling_activities(**kwargs)
        for a in page.get("Activities", []):
            ids.update(re.findall(r"\bi-[0-9a-f]+\b", f"{a.get('Description', '')} {a.get('Cause', '')}"))
        if not page.get("NextToken"):
            return sorted(ids)
        kwargs["NextToken"] = page["NextToken"]


def read_history(ref: GroupRef, days: int, end: datetime, clients: dict[str, Any]) -> History:
    """The group's minutes from CloudWatch: GPU utilization and memory (GPUFleet group series), in-service
    count (AWS/AutoScaling GroupInServiceInstances, else instances reporting), each instance's series."""
    end = end.replace(second=0, microsecond=0)
    start = end - timedelta(days=days)
    asg = group_asg(ref, clients["autoscaling"], clients["eks"])
    ids = members(asg, clients["autoscaling"]) if asg else []
    dims = tuple(_group_dims(ref).items())
    series = [
        Series("util", schema.NAMESPACE, schema.GPU_UTILIZATION.name, dims, "Average"),
        Series("mem", schema.NAMESPACE, schema.GPU_MEMORY_USED_PERCENT.name, dims, "Average"),
    ]
    if asg:
        asg_dims = (("AutoScalingGroupName", asg["AutoScalingGroupName"]),)
        series.append(Series("count", "AWS/AutoScaling", "GroupInServiceInstances", asg_dims, "Average"))
    for iid in ids:
        inst = ((schema.DIM_INSTANCE_ID, iid),)
        series.append(Series(f"{iid}/util", schema.NAMESPACE, schema.GPU_UTILIZATION.name, inst, "Maximum"))
        series.append(Series(f"{iid}/mem", schema.NAMESPACE, schema.GPU_MEMORY_USED_PERCENT.name, inst, "Maximum"))
    got = fetch_minutes(clients["cloudwatch"], series, start, end)
    minutes = days * 1440
    instances = tuple(
        InstanceSeries(
            instance_id=iid,
            utilization=tuple(got[f"{iid}/util"].get(t) for t in range(minutes)),
            memory=tuple(got[f"{iid}/mem"].get(t) for t in range(minutes)),
        )
        for iid in ids
        if got[f"{iid}/util"] or got[f"{iid}/mem"]
    )
    counts = got.get("count", {})
    in_service: tuple[int | None, ...] = (
        tuple(round(counts[t]) if t in counts else None for t in range(minutes))
        if counts
        else tuple(sum(1 for s in instances if s.utilization[t] is not None) or None for t in range(minutes))
    )
    return History(
        group=ref,
        start=start,
        gpu_utilization=tuple(got["util"].get(t) for t in range(minutes)),
        in_service=in_service,
        instances=instances,
        min_size=int(asg["MinSize"]) if asg else 0,
        max_size=int(asg["MaxSize"]) if asg else 1000,
        missing=_missing(ref, asg, got, ids),
    )


def _missing(
    ref: GroupRef, asg: dict[str, Any] | None, got: dict[str, dict[int, float]], ids: list[str]
) -> tuple[str, ...]:
    """What had nothing in the window, each with what it leaves empty in the report."""
    dims = ", ".join(f"{k}={v}" for k, v in _group_dims(ref).items())
    util, mem = schema.GPU_UTILIZATION.name, schema.GPU_MEMORY_USED_PERCENT.name
    out = []
    if asg is None:
        out.append(f"no Auto Scaling group for {ref.key} in this account and region (bounds 0..1000 assumed)")
    if not got["util"]:
        out.append(f"no {schema.NAMESPACE} {util} {{{dims}}} datapoints (the group's GPU utilization)")
    if asg and not got.get("count"):
        out.append(
            "no AWS/AutoScaling GroupInServiceInstances datapoints (the group's metrics collection is off?): "
            "its size is counted from the instances reporting"
        )
    if not any(got[f"{iid}/util"] or got[f"{iid}/mem"] for iid in ids):
        out.append(
            f"no per-instance {schema.NAMESPACE} {util} or {mem} datapoints: idle node-hours, reclaimed "
            "node-hours and busy nodes removed are 0"
        )
    return tuple(out)


class NoHistory(ValueError):
    """The window holds nothing the replay can use: refused, rather than a table of zeros."""


def _group_dims(ref: GroupRef) -> dict[str, str]:
    return ref.metric_dimensions


def history_report(
    ref: GroupRef, end: datetime, clients: dict[str, Any], request: ReplayRequest
) -> tuple[HistoryReport, str]:
    """Read the history and replay it under the policy given (default: the batch recommendation)."""
    history = read_history(ref, request.days, end, clients)
    if lacking := unreplayable(history):
        raise NoHistory(
            f"nothing to replay for {ref.key} in the last {request.days} day(s): {'; '.join(history.missing)}; "
            f"without the group's {' and '.join(lacking)} every number would be 0. Check that the node publisher "
            "runs on its nodes and publishes to this account and region (docs/node-publisher.md), or try a "
            "longer --days"
        )
    policy, label = load_policy(request.policy, Workload(request.workload or Workload.BATCH))
    lookback = max(1, policy.metric_lookback_s // 60)
    o = request.options
    report = replay_history(history, group_settings(policy), lookback, o.gpus_per_node, o.boot_minutes)
    return report, label


def replay_cloudwatch(request: ReplayRequest, group: str) -> int:
    """The group's history replayed; what stops the reading (credentials, region, an endpoint that does not
    answer, a refusal) is one line saying what to do, and what the window lacked is said, not left as 0s."""
    from gpufleet_tools.session import aws_trouble, clients, use_endpoint

    ref = GroupRef.parse_key(group)
    if request.endpoint:
        use_endpoint(request.endpoint)  # moto: a region and its fake credentials, as `gpufleet invoke` gets them
    try:
        api = clients(("cloudwatch", "autoscaling", "eks"), request.endpoint)
        report, label = history_report(ref, datetime.now(UTC), api, request)
    except Exception as exc:  # NoHistory too: neither AWS trouble nor a refusal, so raised on
        why = aws_trouble(exc, request.endpoint) or _refused(exc)
        if why is None:
            raise
        print(f"error: {why}", file=sys.stderr)
        return 2
    for missing in report.missing:
        print(f"warning: {missing}", file=sys.stderr)
    md = history_md(report).replace("\n\n", f"\n\nPolicy: {label}.\n\n", 1)
    out = Path(request.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "history.json").write_text(report.model_dump_json(indent=2) + "\n")
    (out / "history.md").write_text(md)
    print(md, end="")
    return 0


def _refused(exc: BaseException) -> str | None:
    """An AWS error answer (access denied, throttled past the retries, ...) as one line; None otherwise."""
    error = getattr(exc, "response", None)
    if not isinstance(error, dict) or "Error" not in error:
        return None
    code, message = error["Error"].get("Code", "?"), error["Error"].get("Message", "")
    return f"AWS refused {getattr(exc, 'operation_name', 'a call')}: {code}: {message}"


def main(request: ReplayRequest) -> int:
    """`gpufleet replay`: a trace (or `synthetic:bursty`), or a group's CloudWatch history."""
    try:
        if request.from_cloudwatch and not request.trace:
            return replay_cloudwatch(request, request.from_cloudwatch)
        if request.trace and not request.from_cloudwatch:
            return replay_trace(request, request.trace)
        print("error: give exactly one of --trace FILE and --from-cloudwatch GROUP", file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
