"""`make bench`: every benchmark, one Markdown table per component (the same sections as bench/README.md);
copy the tables there with the machine line and date printed first.

`python -m bench --quick` runs every benchmark's code path at small sizes in seconds (tests/test_bench_quick.py
runs it in `make test`, so a benchmark cannot rot unnoticed); its numbers mean nothing and are never asserted.
Its files go to bench/out/quick/, so it never overwrites the plots bench/README.md shows.

Sections (SECTIONS below, in order): the scaler's pure decision core; cold start (the handler's imports vs a
bare `import boto3`, layer by layer); one reconcile against moto server; notifications; the node publisher
vs gpumon.py's pattern; the OOM guard's reads at fleet scale; capacity (spot_watch's sweep); replay vs the
baselines (bench/replay.py); telemetry cost per node-month (bench/telemetry.py); the node's Prometheus
endpoint: its cost (bench/prometheus_cost.py) and under 1,025 idle connections and a scrape storm
(bench/prometheus_endpoint.py).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, GroupState, InstanceObservation
from gpufleet.policy.fleet import GroupSettings
from gpufleet.scaling.core import decide_reconcile

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
NOW = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Sizes:
    """How big each benchmark runs: `make bench` (FULL, the figures in bench/README.md) or --quick."""

    groups: int = 1000  # decision core and reconcile
    gpus: int = 8
    decide_repeat: int = 20
    cold_start_runs: int = 7
    notifications: int = 1000
    notification_groups: int = 20
    publisher_minutes: int = 30
    guard_gpus: int = 10_000
    guard_repeat: int = 5
    spot_groups: int = 500
    kube_pods: int = 50_000  # one Kubernetes listing at the scaler's CPU share (bench/kube_listing.py)
    quick: bool = False  # replay and telemetry: short traces, 3 simulated days, a 4-node fleet
    out: Path = OUT


FULL = Sizes()
QUICK = Sizes(
    groups=10,
    decide_repeat=2,
    cold_start_runs=1,
    notifications=40,
    notification_groups=4,
    publisher_minutes=2,
    guard_gpus=800,
    guard_repeat=1,
    spot_groups=50,
    kube_pods=2_000,
    quick=True,
    out=OUT / "quick",
)


def _reconcile_row(label: str, calls: Counter[str], target: int, wall: float) -> str:
    control = {k.split(":")[1]: v for k, v in calls.items() if not k.startswith("dynamodb:")}
    ddb = {k.split(":")[1]: v for k, v in calls.items() if k.startswith("dynamodb:")}
    detail = ", ".join(f"{k} {v}" for k, v in sorted(control.items()))
    ddb_detail = ", ".join(f"{k} {v}" for k, v in sorted(ddb.items()))
    return (
        f"| {label} | {sum(control.values())} control-plane calls ({detail}); target {target} | "
        f"{sum(ddb.values())} DynamoDB calls ({ddb_detail}) | {wall:.2f} s wall |"
    )


def bench_reconcile(groups: int, gpus: int, out: Path = OUT) -> list[str]:
    """Two reconcile ticks of N busy groups in band, one minute apart, each counted on its own: the first
    sight of the fleet (the scaler notes every group's desired capacity once) and a steady tick."""
    import boto3

    from rehearsal import fleet
    from rehearsal.moto import moto_server
    from tests.integration.conftest import TABLE, Fleet, count_calls

    with moto_server() as server:
        clients = fleet.Clients.create()
        fleet.create_state_table(clients.dynamodb, TABLE)
        fleet.create_busy_asg_fleet(clients, groups, gpus, at=NOW - timedelta(minutes=1))
        policy = out / "policy.yaml"
        policy.write_text("discovery: {eks: false}\n")
        queue = boto3.client("sqs").create_queue(QueueName="gpufleet-notify")["QueueUrl"]  # as deployed
        scaler = Fleet(clients, policy, server.url, "").scaler(notify_queue=queue)
        calls = count_calls(
            scaler.ctx.fleet.autoscaling, scaler.metrics.cloudwatch, scaler.ctx.state.dynamodb, scaler.ctx.fleet.eks
        )
        ticks = []
        for n, label in enumerate(("first tick (notes each group once)", "steady tick, a minute later")):
            at = NOW + timedelta(minutes=n)
            tick = {"gpufleet": "reconcile", "execution_id": f"bench-{n}", "scheduled_time": at.isoformat()}
            calls.clear()
            started = time.perf_counter()
            scaler.handle(tick, at)
            ticks.append((label, Counter(calls), time.perf_counter() - started))
    target = math.ceil(groups / 500) + math.ceil(groups / 100)
    return [
        _reconcile_row(f"reconcile, {groups} ASGs x {gpus} GPU series, no changes, moto server: {label}", c, target, w)
        for label, c, w in ticks
    ]


def bench_notifications(total: int = 1000, groups: int = 20, out: Path = OUT) -> list[str]:
    """A burst of notifications across groups through the real notifier (moto server + local Slack)."""
    from aws_lambda_powertools import Logger, Metrics

    from gpufleet.domain.notification import NotificationKind, Severity, note
    from gpufleet.runtime import build_notifier
    from rehearsal import fleet
    from rehearsal.moto import moto_server
    from rehearsal.slack import slack_receiver
    from tests.integration.conftest import TABLE, count_calls

    with moto_server(), slack_receiver() as (receiver, base):
        clients = fleet.Clients.create()
        fleet.create_state_table(clients.dynamodb, TABLE)
        stack = fleet.create_notification_stack(f"{base}/services/T0/B0/bench")
        policy = out / "notify-policy.yaml"
        policy.write_text("notifications: {}\n")  # the defaults: 30 s group wait, 5 min interval
        notifier = build_notifier(
            Logger(service="notifier", level="WARNING"), Metrics(service="notifier"), env=stack.env(TABLE, str(policy))
        )
        calls = count_calls(notifier.store.dynamodb, notifier.queue.sqs)
        bodies = []
        for i in range(total):  # built as producers build them: one capacity incident per group
            group = f"asg:train-{i % groups:02d}"
            bodies.append(
                note(
                    NotificationKind.SCALING,
                    Severity.WARNING if i % 7 == 0 else Severity.INFO,
                    group,
                    f"{group}: event {i}",
                    at=NOW,
                    source="bench",
                    id_parts=("burst", str(i)),
                    reason="burst",
                ).model_dump_json()
            )
        started = time.perf_counter()
        for i, body in enumerate(bodies):  # the burst arrives within 20 s
            notifier.handle_message(body, now=NOW + timedelta(seconds=20 * i / total))
        burst_wall = time.perf_counter() - started
        notifier.sweep(NOW + timedelta(seconds=31))  # group wait over: one post per incident
        wall = time.perf_counter() - started
    ddb = sum(v for k, v in calls.items() if k.startswith("dynamodb:"))
    ddb_detail = ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(calls.items()) if k.startswith("dynamodb:"))
    flushes = calls["sqs:SendMessage"]
    return [
        f"| notification burst: {total} notifications, {groups} groups, default grouping | "
        f"{len(receiver.received)} Slack posts (target ~{groups}) | {flushes} delayed flush messages | |",
        f"| notifier time per message (moto server, local Slack receiver) | {burst_wall / total * 1000:.1f} ms "
        f"(burst), {wall:.1f} s total incl. the sweep that posts | | |",
        f"| DynamoDB calls per message | {ddb / total:.2f} ({ddb_detail}) | | |",
    ]


REQUEST_PRICE_PER_1000 = 0.01  # PutMetricData, us-east-1 list price
METRIC_PRICE = 0.30  # custom metric per month, first 10,000 metrics tier
NODE_MONTH_MINUTES = 30 * 24 * 60


def bench_publisher(minutes: int = 30, gpus: int = 8, out: Path = OUT) -> list[str]:
    """Our publisher vs gpumon.py's pattern, side by side in one run, both through nvidia-ml-py and
    the fake libnvidia-ml.so.1 (a C file in tests/node) to moto server."""
    import json
    import shutil
    import subprocess

    from rehearsal.moto import moto_server

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return ["| publisher vs gpumon | skipped: no C compiler for the fake NVML | | |"]
    lib = out / "libnvidia-ml.so.1"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(ROOT / "tests/node/fake_nvml/fake_nvml.c")], check=True
    )
    scenario = out / "gpus.txt"
    scenario.write_text(
        f"gpus {gpus}\n"
        + "".join(
            f"gpu {i} util {40 + i}\ngpu {i} mem_util 20\ngpu {i} mem_total_mib 81920\ngpu {i} mem_used_mib 40000\n"
            f"gpu {i} power_mw 300000\ngpu {i} power_limit_mw 700000\ngpu {i} temp 60\ngpu {i} mem_temp 70\n"
            f"gpu {i} proc {1000 + i} 39000 {40 + i}\ngpu {i} sm_clock 1410\n"
            for i in range(gpus)
        )
    )
    results = {}
    with moto_server() as server:
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": str(out),
            "GPUFLEET_FAKE_NVML_SCENARIO": str(scenario),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "PYTHONPATH": str(ROOT / "layers" / "node"),
        }
        node = _node_tree(out / "node", gpus)
        for side in ("gpumon", "ours", "ours-essential", "ours-attributed"):
            proc = subprocess.run(
                [sys.executable, str(ROOT / "bench" / "publisher_run.py"), side, server.url, str(minutes), str(node)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    rows = []
    base, ours = results["gpumon"], results["ours"]
    for label, key, per in (
        ("PutMetricData requests per node-minute", "requests", minutes),
        ("datums per node-minute", "datums", minutes),
        ("bytes on the wire per node-minute (request bodies)", "bytes", minutes),
    ):
        b, o = base[key] / per, ours[key] / per
        rows.append(f"| {label} | {o:,.1f} | gpumon pattern {b:,.1f} | ratio {o / b:.3f}x |")
    o, b = ours["cpu_s"] * 60 / minutes, base["cpu_s"] * 60 / minutes
    rows.append(
        f"| CPU seconds per hour of 1 Hz sampling (8 GPUs) | {o:.2f} s = {o / 36:.3f} % of one core "
        f"(target < 0.5 %) | gpumon pattern (0.1 Hz) {b:.2f} s | |"
    )
    rows.append(
        f"| peak RSS | {ours['peak_rss_mb']:.0f} MB (target < 60 MB) | gpumon pattern {base['peak_rss_mb']:.0f} MB | |"
    )
    a = results["ours-attributed"]
    o2 = a["cpu_s"] * 60 / minutes
    rows.append(
        f"| with attribution + Prometheus endpoint (adaptive; a fake /proc of 8 pods; scraped every 15 s) | "
        f"{o2:.2f} s CPU per hour = {o2 / 36:.3f} % of one core (target <= 1 %), peak RSS {a['peak_rss_mb']:.0f} MB "
        f"(target <= 64 MB); {a.get('records', 0)} usage records, {a['scrape_bytes'] / max(1, minutes * 4):,.0f} B "
        f"per scrape | full, no attribution: {o:.2f} s, {ours['peak_rss_mb']:.0f} MB | ratio CPU {o2 / o:.2f}x, "
        f"RSS {a['peak_rss_mb'] / ours['peak_rss_mb']:.2f}x |"
    )
    cost = {k: v["requests"] / minutes * NODE_MONTH_MINUTES / 1000 * REQUEST_PRICE_PER_1000 for k, v in results.items()}
    rows.append(
        f"| PutMetricData API cost per node-month | ${cost['ours']:.2f} | gpumon pattern ${cost['gpumon']:.2f} | |"
    )
    series = {k: v["series"] for k, v in results.items()}
    rows.append(
        f"| metric series per node (custom-metric charge per node-month) | full {series['ours']} "
        f"(${series['ours'] * METRIC_PRICE:.2f}); detail=essential {series['ours-essential']} "
        f"(${series['ours-essential'] * METRIC_PRICE:.2f}) | gpumon pattern {series['gpumon']} "
        f"(${series['gpumon'] * METRIC_PRICE:.2f}) | first-10k-tier list price ${METRIC_PRICE}/metric-month |"
    )
    return rows


def _node_tree(root: Path, gpus: int) -> Path:
    """The fake NVML's processes (pids 1000+i) as pods of two teams, in /proc and the kubelet's log folders."""
    from rehearsal.usage_scene import write_pod_process

    for i in range(gpus):
        ns, pod = ("team-a", "trainer-0") if i < 4 else ("team-b", f"infer-{i}")
        write_pod_process(root, 1000 + i, ns, pod, "main", systemd=True)
    return root


GMD_METRIC_PRICE = 0.01 / 1000  # GetMetricData: $ per metric requested; ListMetrics: $ per request
EVALUATIONS_PER_MONTH = 30 * 24 * 60  # the OOM guard runs every minute
# The guard before issue 14 read every GPU's memory series plus 4 health counters per instance each
# evaluation: measured 2026-11-22 on this benchmark (bench/README.md, "OOM guard").
GUARD_SERIES_BEFORE = 15_178


class SyntheticCloudWatch:
    """FAKE CloudWatch for the 10,000-GPU guard benchmark (moto server would need minutes to scan that many
    series). Answers as the adaptive publisher's fleet would: group and instance aggregates (fullest GPU,
    average, health summary) always, a GPU's own series only while it is in detail (>= 70 % or a health
    event). One GPU in `leak_every` leaks 1.5 %/min (0: none); one in 4,001 had an XID. Counts calls and
    metrics requested."""

    MINUTES = 15

    def __init__(self, groups: int, instances_per_group: int, gpus: int, now: datetime, leak_every: int) -> None:
        from gpufleet_node import schema

        self.schema, self.now, self.gpus, self.leak_every = schema, now, gpus, leak_every
        self.groups = {
            f"g{g:03d}": [f"i-{g * instances_per_group + n:05d}" for n in range(instances_per_group)]
            for g in range(groups)
        }
        self.calls: dict[str, int] = {"ListMetrics": 0, "GetMetricData": 0, "series": 0}

    @staticmethod
    def _seed(iid: str, gpu: int) -> int:
        return int(iid[2:]) * 8 + gpu

    def memory(self, iid: str, gpu: int) -> list[float]:
        """Percent used, oldest first."""
        seed = self._seed(iid, gpu)
        if self.leaks(iid, gpu):
            return [50 + 1.5 * m for m in range(self.MINUTES)]
        return [40.0 + seed % 45] * self.MINUTES

    def leaks(self, iid: str, gpu: int) -> bool:
        return self.leak_every > 0 and self._seed(iid, gpu) % self.leak_every == 0

    def xid(self, iid: str, gpu: int) -> list[float]:
        return [0.0] * (self.MINUTES - 1) + [1.0 if self._seed(iid, gpu) % 4001 == 0 else 0.0]

    def in_detail(self, iid: str, gpu: int) -> bool:
        return self.memory(iid, gpu)[-1] >= 70 or sum(self.xid(iid, gpu)) > 0

    def list_metrics(self, **kwargs: Any) -> dict[str, Any]:
        self.calls["ListMetrics"] += 1
        iid = kwargs["Dimensions"][0]["Value"]
        dims = [
            [{"Name": "InstanceId", "Value": iid}, {"Name": "GpuIndex", "Value": str(g)}]
            for g in range(self.gpus)
            if self.in_detail(iid, g)
        ]
        return {"Metrics": [{"MetricName": "GPUMemoryUsedPercent", "Dimensions": d} for d in dims]}

    def _aggregate(self, instances: list[str], name: str, stat: str) -> list[float]:
        per_gpu = [
            self.xid(i, g) if name == self.schema.GPU_HEALTH_EVENTS.name else self.memory(i, g)
            for i in instances
            for g in range(self.gpus)
        ]
        if name == self.schema.GPU_HEALTH_EVENTS.name:
            return [sum(col) for col in zip(*per_gpu, strict=True)]
        return [max(col) if stat == "Maximum" else statistics.fmean(col) for col in zip(*per_gpu, strict=True)]

    def _series(self, name: str, stat: str, dims: dict[str, str]) -> list[float]:
        schema = self.schema
        if schema.DIM_GPU_INDEX in dims:
            iid, gpu = dims[schema.DIM_INSTANCE_ID], int(dims[schema.DIM_GPU_INDEX])
            if not self.in_detail(iid, gpu):
                return []
            if name == schema.GPU_MEMORY_USED_PERCENT.name:
                return self.memory(iid, gpu)
            if name == schema.GPU_MEMORY_TOTAL.name:
                return [81920.0] * self.MINUTES
            if name == schema.GPU_TOP_PROCESS_MEMORY.name:
                return [30000.0] * self.MINUTES
            return self.xid(iid, gpu) if name == schema.GPU_XID_ERRORS.name else []
        instances = (
            [dims[schema.DIM_INSTANCE_ID]] if schema.DIM_INSTANCE_ID in dims else self.groups[dims[schema.DIM_ASG_NAME]]
        )
        return self._aggregate(instances, name, stat)

    def get_metric_data(self, MetricDataQueries: list[dict[str, Any]], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.calls["GetMetricData"] += 1
        self.calls["series"] += len(MetricDataQueries)
        results = []
        for q in MetricDataQueries:
            stat = q["MetricStat"]
            dims = {d["Name"]: d["Value"] for d in stat["Metric"]["Dimensions"]}
            values = self._series(stat["Metric"]["MetricName"], stat["Stat"], dims)[::-1]  # newest first
            stamps = [self.now - timedelta(minutes=m) for m in range(len(values))]
            results.append({"Id": q["Id"], "Timestamps": stamps, "Values": values})
        return {"MetricDataResults": results}


def _guard_reads(gpus: int, per_instance: int, group_size: int, leak_every: int) -> str:
    """One OOM-guard screening over the synthetic fleet: what it read, what it found, what that costs."""
    from gpufleet.aws.metrics import GpuMetricsReader
    from gpufleet.guard.screen import GpuScreen
    from gpufleet.policy.fleet import FleetPolicy

    instances = gpus // per_instance
    fake = SyntheticCloudWatch(instances // group_size, group_size, per_instance, NOW, leak_every)
    groups = [
        GroupObservation(
            ref=GroupRef(kind=GroupKind.ASG, name=name),
            min_size=0,
            max_size=group_size * 2,
            desired=group_size,
            asg_name=name,
            instances=tuple(InstanceObservation(instance_id=i) for i in members),
        )
        for name, members in fake.groups.items()
    ]
    started = time.perf_counter()
    forecasts, findings = GpuScreen(GpuMetricsReader(fake)).assess(groups, set(), NOW, FleetPolicy())
    took = time.perf_counter() - started
    at_risk = sum(f.risk != "ok" for f in forecasts)
    leaking = sum(fake.leaks(i, g) for ms in fake.groups.values() for i in ms for g in range(per_instance))
    month = (fake.calls["series"] + fake.calls["ListMetrics"]) * EVALUATIONS_PER_MONTH * GMD_METRIC_PRICE
    before = GUARD_SERIES_BEFORE * EVALUATIONS_PER_MONTH * GMD_METRIC_PRICE
    return (
        f"| OOM guard reads, {gpus:,} GPUs ({instances:,} nodes, {len(groups)} groups), {leaking} leaking at once "
        f"| GetMetricData {fake.calls['GetMetricData']} calls, {fake.calls['series']:,} metrics; ListMetrics "
        f"{fake.calls['ListMetrics']}; {len(forecasts)} GPUs read, {at_risk} at risk, {len(findings)} health "
        f"findings; {took * 1000:.0f} ms | **${month:,.0f}/month** at 1 evaluation/min (before: "
        f"{GUARD_SERIES_BEFORE:,} metrics, ${before:,.0f}/month); goal <= $1,000 |"
    )


def bench_guard(gpus: int = 10_000, per_instance: int = 8, group_size: int = 10, repeat: int = 5) -> list[str]:
    """The OOM guard over 10,000 GPUs (fake CloudWatch as the adaptive publisher's fleet would answer):
    one evaluation's reads through the real screening with no leak, 10 and ~100 leaking at once, priced
    per month at one evaluation per minute against the per-GPU design it replaced; and the forecast's
    compute time if every GPU had to be forecast (pure)."""
    from gpufleet.guard.core import GpuRef, MemorySeries, OomSettings, forecast_gpu

    rows = [_guard_reads(gpus, per_instance, group_size, every) for every in (0, 997, 97)]
    series = [
        MemorySeries(
            gpu=GpuRef(group="asg:g", instance_id=f"i-{i // 8:05d}", gpu_index=i % 8),
            points=tuple((NOW - timedelta(minutes=14 - m), 20 + (i % 70) + 0.05 * m * (i % 3)) for m in range(15)),
            total_mib=100.0,
        )
        for i in range(gpus)
    ]
    s = OomSettings()
    times = []
    gc.collect()  # start from a collected heap: earlier benchmarks in this process leave a large one
    for _ in range(repeat):
        started = time.perf_counter()
        for x in series:
            forecast_gpu(x, NOW, s)
        times.append(time.perf_counter() - started)
    return [
        *rows,
        f"| forecast compute, {gpus:,} GPUs x 15 points (if every GPU were read) | median "
        f"{statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f} ms over {repeat} runs | "
        "target < 200 ms |",
    ]


def _asg(clients: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"
    ][0]
    return found


def bench_spot_sweep(groups: int = 500, out: Path = OUT) -> str:
    """spot_watch's sweep over N managed ASGs against moto server: API calls and wall time."""
    from aws_lambda_powertools import Logger, Metrics

    from gpufleet.domain import defaults
    from gpufleet.runtime import build_spot_watch
    from rehearsal import fleet
    from rehearsal.moto import moto_server
    from tests.integration.conftest import TABLE, count_calls

    with moto_server():
        clients = fleet.Clients.create()
        fleet.create_state_table(clients.dynamodb, TABLE)
        for i in range(groups):
            fleet.create_asg(clients, f"gpu-{i:03d}", min_size=0, max_size=4, desired=1, tags=fleet.MANAGED_TAG)
        for i in range(0, groups, 50):  # every 50th group is one instance short after a failed launch [emulated]
            name = f"gpu-{i:03d}"
            before = {x["InstanceId"] for x in _asg(clients, name)["Instances"]}
            clients.autoscaling.set_desired_capacity(AutoScalingGroupName=name, DesiredCapacity=2)
            new = [x["InstanceId"] for x in _asg(clients, name)["Instances"] if x["InstanceId"] not in before]
            fleet.hold_out_of_service(clients.autoscaling, name, new)
            fleet.inject_failed_launch(
                os.environ["AWS_ENDPOINT_URL"], name, NOW - timedelta(minutes=2), "UnfulfillableCapacity"
            )
        policy = out / "spot-policy.yaml"
        policy.write_text("discovery: {eks: false}\n")
        env = {defaults.ENV_STATE_TABLE: TABLE, defaults.ENV_POLICY_FILE: str(policy)}
        watch = build_spot_watch(Logger(service="bench", level="ERROR"), Metrics(service="bench"), env=env)
        clients_used = (
            watch.ctx.fleet.autoscaling,
            watch.ctx.fleet.eks,
            watch.activities.ec2,
            watch.ctx.state.dynamodb,
        )
        calls = count_calls(*clients_used)
        started = time.perf_counter()
        result = watch.sweep(NOW, "bench")
        wall = time.perf_counter() - started
    found = sum(len(g["new_failures"]) for g in result["groups"])
    control = {k.split(":")[1]: v for k, v in calls.items() if not k.startswith("dynamodb:")}
    ddb = sum(v for k, v in calls.items() if k.startswith("dynamodb:"))
    detail = ", ".join(f"{k} {v}" for k, v in sorted(control.items()))
    ddb_detail = ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(calls.items()) if k.startswith("dynamodb:"))
    return (
        f"| spot_watch sweep, {groups} managed ASGs ({groups // 50} short of capacity), moto server | "
        f"{sum(control.values())} control-plane calls "
        f"({detail}); {ddb} DynamoDB calls ({ddb_detail}) | {found} failed launches found | {wall:.1f} s wall |"
    )


def bench_decide(groups: int, repeat: int = 20) -> str:
    ref = [GroupRef(kind=GroupKind.ASG, name=f"g{i}") for i in range(groups)]
    obs = [
        GroupObservation(
            ref=r,
            min_size=0,
            max_size=20,
            desired=8,
            instance_metrics_loaded=True,
            gpu_utilization=float(i % 100),
            instances=tuple(
                InstanceObservation(
                    instance_id=f"i-{i}-{k}", gpu_utilization=float((i + k) % 100), gpu_memory_percent=float(k)
                )
                for k in range(8)
            ),
        )
        for i, r in enumerate(ref)
    ]
    settings, state = GroupSettings(), GroupState()
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        for o in obs:
            decide_reconcile(o, settings, state, NOW, event_id="bench")
        times.append(time.perf_counter() - started)
    return (
        f"| pure decision core, {groups} groups x 8 instances | median {statistics.median(times) * 1000:.1f} ms, "
        f"min {min(times) * 1000:.1f} ms over {repeat} runs | target < 50 ms | |"
    )


def _import_time(code: str, task_root: str) -> float:
    """Wall time of a fresh interpreter running `code` in a Lambda-like environment: LAMBDA_TASK_ROOT set
    (so the X-Ray SDK takes its Lambda path, as deployed) and tracing left on, as in the template."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", code],
        check=True,
        cwd=ROOT,
        env={
            "PATH": "/usr/bin:/bin",
            "AWS_DEFAULT_REGION": "us-east-1",
            "GPUFLEET_STATE_TABLE": "t",
            "GPUFLEET_NOTIFY_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/notify",
            "LAMBDA_TASK_ROOT": task_root,
            "AWS_LAMBDA_FUNCTION_NAME": "scaler",
            "POWERTOOLS_LOG_LEVEL": "WARNING",
        },
    )
    return time.perf_counter() - started


_POWERTOOLS = (
    "from aws_lambda_powertools import Logger, Metrics, Tracer; "
    "Logger(service='s'); Tracer(service='s'); Metrics(namespace='n', service='s')"
)
# pydantic loads most of itself when the first model class is built, not at `import pydantic`.
_PYDANTIC = "import pydantic; type('M', (pydantic.BaseModel,), {'__annotations__': {'x': int}})"
_CLIENTS = "s = boto3.session.Session(); [s.client(n) for n in ('autoscaling', 'eks', 'cloudwatch', 'dynamodb', 'sqs')]"
# Each layer adds one thing to the previous, so the table shows where a cold start's time goes.
COLD_START_LAYERS = (
    ("bare `import boto3` (baseline)", "import boto3"),
    ("+ Powertools Logger/Tracer/Metrics", f"import boto3; {_POWERTOOLS}"),
    ("+ pydantic (one model), PyYAML, croniter", f"import boto3, yaml, croniter; {_POWERTOOLS}; {_PYDANTIC}"),
    ("+ the scaler's 5 boto3 clients", f"import boto3, yaml, croniter; {_POWERTOOLS}; {_PYDANTIC}; {_CLIENTS}"),
    (
        "scaler handler module (all of the above + gpufleet)",
        "import importlib.util as u; s = u.spec_from_file_location('app', 'functions/scaler/app.py'); "
        "m = u.module_from_spec(s); s.loader.exec_module(m)",
    ),
)


def bench_cold_start(runs: int = 7) -> list[str]:
    samples: dict[str, list[float]] = {label: [] for label, _ in COLD_START_LAYERS}
    with tempfile.TemporaryDirectory() as task_root:
        for _ in range(runs):  # interleaved, so every layer shares the machine's noise
            for label, code in COLD_START_LAYERS:
                samples[label].append(_import_time(code, task_root))
    base = statistics.median(samples[COLD_START_LAYERS[0][0]])
    rows = []
    for label, _ in COLD_START_LAYERS:
        median = statistics.median(samples[label])
        rows.append(
            f"| cold-start proxy: {label} | {median * 1000:.0f} ms | ratio {median / base:.2f}x vs boto3 "
            f"(issue target for the handler <= 1.5x) | median of {runs} interleaved runs |"
        )
    return rows


TABLE_HEAD = ("| benchmark | result | target / note | |", "|---|---|---|---|")


def _decide(z: Sizes) -> list[str]:
    return [*TABLE_HEAD, bench_decide(z.groups, z.decide_repeat)]


def _cold_start(z: Sizes) -> list[str]:
    return [*TABLE_HEAD, *bench_cold_start(z.cold_start_runs)]


def _reconcile(z: Sizes) -> list[str]:
    return [*TABLE_HEAD, *bench_reconcile(z.groups, z.gpus, z.out)]


def _notifications(z: Sizes) -> list[str]:
    return [*TABLE_HEAD, *bench_notifications(z.notifications, z.notification_groups, z.out)]


def _publisher(z: Sizes) -> list[str]:
    return [
        "| measure | ours (1 Hz, 60 s windows, gzip) | gpumon pattern | |",
        "|---|---|---|---|",
        *bench_publisher(z.publisher_minutes, z.gpus, z.out),
    ]


def _guard(z: Sizes) -> list[str]:
    return [*TABLE_HEAD, *bench_guard(z.guard_gpus, repeat=z.guard_repeat)]


def _spot(z: Sizes) -> list[str]:
    return [*TABLE_HEAD, bench_spot_sweep(z.spot_groups, z.out)]


def _kube_listing(z: Sizes) -> list[str]:
    from bench.kube_listing import HEAD, bench_kube_listing

    return [*HEAD, *bench_kube_listing(z.kube_pods)]


def _replay(z: Sizes) -> list[str]:
    from bench.replay import bench_replay

    return bench_replay(quick=z.quick, out=z.out if z.quick else None)


def _telemetry(z: Sizes) -> list[str]:
    from bench.telemetry import bench_telemetry

    return bench_telemetry(quick=z.quick, out=z.out)


def _prometheus(z: Sizes) -> list[str]:
    from bench.prometheus_cost import bench_prometheus

    return bench_prometheus(quick=z.quick)


def _prometheus_endpoint(z: Sizes) -> list[str]:
    from bench.prometheus_endpoint import bench_prometheus_endpoint

    return bench_prometheus_endpoint(quick=z.quick)


def _report(z: Sizes) -> list[str]:
    from bench.report_read import bench_report

    return bench_report(quick=z.quick)


# (heading, what it runs): the components of bench/README.md, in its order. tests/test_bench_quick.py checks
# that --quick prints every heading.
SECTIONS: tuple[tuple[str, Callable[[Sizes], Iterable[str]]], ...] = (
    ("Scaler: pure decision core", _decide),
    ("Scaler: cold start, decomposed", _cold_start),
    ("Scaler: one reconcile on moto server", _reconcile),
    ("Notifications: a burst through the notifier", _notifications),
    ("Node publisher vs gpumon.py's pattern", _publisher),
    ("OOM guard reads at fleet scale", _guard),
    ("Capacity: spot_watch sweep", _spot),
    ("Kubernetes listing at the scaler's CPU share", _kube_listing),
    ("Replay: decision quality vs the baselines", _replay),
    ("Telemetry cost per 8-GPU node-month", _telemetry),
    ("Node Prometheus endpoint: series and cost", _prometheus),
    ("Node Prometheus endpoint: a hostile neighbour", _prometheus_endpoint),
    ("Usage report: reading 1,000 nodes x 30 days", _report),
)


def machine_note() -> str:
    """The line every table in bench/README.md carries: cores, interpreter, moto, date."""
    from importlib.metadata import version

    return (
        f"machine: {platform.machine()}, {os.cpu_count()} cores (nproc), {platform.python_implementation()} "
        f"{platform.python_version()}, moto {version('moto')}, {datetime.now(UTC):%Y-%m-%d}"
    )


def main(argv: list[str] | None = None) -> int:
    os.environ["POWERTOOLS_LOG_LEVEL"] = "WARNING"  # one log line per group would drown the table
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="every benchmark at small sizes (seconds, for CI)")
    parser.add_argument("--groups", type=int, help=f"groups for the decision core and reconcile ({FULL.groups})")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node (8)")
    parser.add_argument("--only", action="append", default=[], help="run only sections containing this (repeatable)")
    args = parser.parse_args(argv)
    z = QUICK if args.quick else FULL
    z = replace(z, groups=args.groups or z.groups, gpus=args.gpus)
    z.out.mkdir(parents=True, exist_ok=True)
    print(machine_note() + (", QUICK (sizes too small to quote)" if z.quick else ""), flush=True)
    walls = []
    started = time.perf_counter()
    for heading, run in SECTIONS:
        if args.only and not any(o.lower() in heading.lower() for o in args.only):
            continue
        print(f"\n## {heading}\n", flush=True)
        t = time.perf_counter()
        for row in run(z):
            print(row, flush=True)
        walls.append(f"{heading} {time.perf_counter() - t:.1f} s")
    print(f"\nwall: {time.perf_counter() - started:.0f} s ({'; '.join(walls)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
