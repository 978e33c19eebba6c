"""`make bench`: scaler benchmarks. Prints a Markdown row per result; copy them into bench/README.md.

1. Reconcile of N groups x 8 GPUs against moto server: AWS API calls per reconcile and wall time.
2. The pure decision core for N groups (no I/O).
3. Cold-start proxy: importing the scaler handler vs a bare `import boto3`, with the layers in between.
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpufleet.domain.models import GroupKind, GroupObservation, GroupRef, GroupState, InstanceObservation
from gpufleet.domain.policy import GroupSettings
from gpufleet.scaling.core import decide_reconcile

ROOT = Path(__file__).resolve().parents[1]
NOW = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


def bench_reconcile(groups: int, gpus: int) -> str:
    from rehearsal import fleet
    from rehearsal.moto import moto_server
    from tests.integration.conftest import TABLE, Fleet, count_calls

    with moto_server() as server:
        clients = fleet.Clients.create()
        fleet.create_state_table(clients.dynamodb, TABLE)
        fleet.create_busy_asg_fleet(clients, groups, gpus, at=NOW - timedelta(minutes=1))
        policy = ROOT / "bench" / "out" / "policy.yaml"
        policy.parent.mkdir(exist_ok=True)
        policy.write_text("discovery: {eks: false}\n")
        scaler = Fleet(clients, policy, server.url, "").scaler()
        calls = count_calls(
            scaler.ctx.fleet.autoscaling, scaler.metrics.cloudwatch, scaler.ctx.state.dynamodb, scaler.ctx.fleet.eks
        )
        tick = {"gpufleet": "reconcile", "execution_id": "bench", "scheduled_time": "2026-11-23T08:00:00Z"}
        started = time.perf_counter()
        scaler.handle(tick, NOW)
        wall = time.perf_counter() - started
    control = {k: v for k, v in calls.items() if not k.startswith("dynamodb:")}
    ddb = sum(v for k, v in calls.items() if k.startswith("dynamodb:"))
    target = math.ceil(groups / 500) + math.ceil(groups / 100)
    detail = ", ".join(f"{k.split(':')[1]} {v}" for k, v in sorted(control.items()))
    return (
        f"| reconcile, {groups} ASGs x {gpus} GPU series, no changes, moto server | "
        f"{sum(control.values())} control-plane calls ({detail}); target {target} | "
        f"{ddb} DynamoDB calls (state batch-get, audit batch-write, idempotency) | {wall:.2f} s wall |"
    )


def bench_notifications(total: int = 1000, groups: int = 20) -> list[str]:
    """A burst of notifications across groups through the real notifier (moto server + local Slack)."""
    from aws_lambda_powertools import Logger, Metrics

    from gpufleet.notify.model import Notification, Severity, scaling_incident_key
    from gpufleet.runtime import build_notifier
    from rehearsal import fleet
    from rehearsal.moto import moto_server
    from rehearsal.slack import slack_receiver
    from tests.integration.conftest import TABLE, count_calls

    with moto_server(), slack_receiver() as (receiver, base):
        clients = fleet.Clients.create()
        fleet.create_state_table(clients.dynamodb, TABLE)
        stack = fleet.create_notification_stack(f"{base}/services/T0/B0/bench")
        policy = ROOT / "bench" / "out" / "notify-policy.yaml"
        policy.parent.mkdir(exist_ok=True)
        policy.write_text("notifications: {}\n")  # the defaults: 30 s group wait, 5 min interval
        notifier = build_notifier(
            Logger(service="notifier", level="WARNING"), Metrics(service="notifier"), env=stack.env(TABLE, str(policy))
        )
        calls = count_calls(notifier.store.dynamodb, notifier.queue.sqs)
        bodies = []
        for i in range(total):
            group = f"asg:train-{i % groups:02d}"
            bodies.append(
                Notification(
                    notification_id=f"burst-{i}",
                    kind="scaling",
                    severity=Severity.WARNING if i % 7 == 0 else Severity.INFO,
                    group=group,
                    incident_key=scaling_incident_key(group),
                    title=f"{group}: event {i}",
                    reason="burst",
                    at=NOW,
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


def bench_publisher(minutes: int = 30, gpus: int = 8) -> list[str]:
    """Our publisher vs gpumon.py's pattern, side by side in one run, both through nvidia-ml-py and
    the fake libnvidia-ml.so.1 (a C file in tests/node) to moto server."""
    import json
    import shutil
    import subprocess

    from rehearsal.moto import moto_server

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        return ["| publisher vs gpumon | skipped: no C compiler for the fake NVML | | |"]
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
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
            f"gpu {i} proc {1000 + i} 39000\n"
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
        for side in ("gpumon", "ours", "ours-essential"):
            proc = subprocess.run(
                [sys.executable, str(ROOT / "bench" / "publisher_run.py"), side, server.url, str(minutes)],
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


class SyntheticCloudWatch:
    """FAKE CloudWatch for the 10,000-GPU guard benchmark (moto server would need minutes to scan that many
    series): answers ListMetrics and GetMetricData with deterministic synthetic series and counts calls."""

    def __init__(self, instances: int, gpus: int, now: datetime) -> None:
        from gpufleet_node import schema

        self.schema = schema
        self.instances, self.gpus, self.now = instances, gpus, now
        self.calls: dict[str, int] = {"ListMetrics": 0, "GetMetricData": 0, "series": 0}

    def list_metrics(self, **kwargs: Any) -> dict[str, Any]:
        self.calls["ListMetrics"] += 1
        page = int(kwargs.get("NextToken", "0"))
        every = [(i, g) for i in range(self.instances) for g in range(self.gpus)]
        chunk = every[page * 500 : (page + 1) * 500]
        out: dict[str, Any] = {
            "Metrics": [
                {"Dimensions": [{"Name": "InstanceId", "Value": f"i-{i:05d}"}, {"Name": "GpuIndex", "Value": str(g)}]}
                for i, g in chunk
            ]
        }
        if (page + 1) * 500 < len(every):
            out["NextToken"] = str(page + 1)
        return out

    def get_metric_data(self, MetricDataQueries: list[dict[str, Any]], **_: Any) -> dict[str, Any]:  # noqa: N803
        self.calls["GetMetricData"] += 1
        self.calls["series"] += len(MetricDataQueries)
        results = []
        for q in MetricDataQueries:
            metric = q["MetricStat"]["Metric"]
            dims = {d["Name"]: d["Value"] for d in metric["Dimensions"]}
            seed = int(dims["InstanceId"][2:]) * 8 + int(dims.get("GpuIndex", 0))
            name = metric["MetricName"]
            stamps = [self.now - timedelta(minutes=m) for m in range(15)]
            if name == self.schema.GPU_MEMORY_USED_PERCENT.name:
                leak = 1.5 if seed % 97 == 0 else 0.0  # ~1 % of GPUs leak 1.5 %/min
                values = [40 + seed % 50 + leak * (14 - m) - leak * 14 for m in range(15)]
            elif name == self.schema.GPU_MEMORY_TOTAL.name:
                values = [81920.0] * 15
            elif name == self.schema.GPU_TOP_PROCESS_MEMORY.name:
                values = [30000.0] * 15
            elif name == self.schema.GPU_XID_ERRORS.name and seed % 4001 == 0:
                values = [1.0] + [0.0] * 14
            else:
                values = [0.0] * 15
            results.append({"Id": q["Id"], "Timestamps": stamps, "Values": values})
        return {"MetricDataResults": results}


def bench_guard(gpus: int = 10_000, per_instance: int = 8, repeat: int = 5) -> list[str]:
    """The OOM guard over 10,000 GPUs: GetMetricData calls (fake CloudWatch), forecast time (pure)."""
    from gpufleet.aws.metrics import GpuMetricsReader
    from gpufleet.guard.core import GpuRef, MemorySeries, OomSettings, forecast_gpu

    instances = gpus // per_instance
    fake = SyntheticCloudWatch(instances, per_instance, NOW)
    reader = GpuMetricsReader(fake)
    inventory = reader.list_gpus()
    refs = [GpuRef(group=f"asg:g{i // 8}", instance_id=iid, gpu_index=g) for i, (iid, g) in enumerate(inventory)]
    from aws_lambda_powertools import Logger, Metrics

    from gpufleet.domain.policy import FleetPolicy
    from gpufleet.guard.service import OomGuard

    # Only `_assess` is exercised: the parts it does not touch are left empty.
    guard = OomGuard(
        fleet=None,  # type: ignore[arg-type]
        actuator=None,  # type: ignore[arg-type]
        metrics=reader,
        state=None,  # type: ignore[arg-type]
        scaler=None,  # type: ignore[arg-type]
        load_policy=FleetPolicy,
        logger=Logger(level="ERROR"),
        emf=Metrics(),
    )
    forecasts, findings = guard._assess(refs, NOW, FleetPolicy())
    series = [
        MemorySeries(
            gpu=r,
            points=tuple((NOW - timedelta(minutes=14 - m), 20 + (i % 70) + 0.05 * m * (i % 3)) for m in range(15)),
            total_mib=100.0,
        )
        for i, r in enumerate(refs)
    ]
    s = OomSettings()
    times = []
    gc.collect()  # start from a collected heap: earlier benchmarks in this process leave a large one
    for _ in range(repeat):
        started = time.perf_counter()
        for x in series:
            forecast_gpu(x, NOW, s)
        times.append(time.perf_counter() - started)
    screening = gpus + instances * 4
    at_risk = sum(f.risk != "ok" for f in forecasts)
    return [
        f"| OOM guard, {gpus} GPUs on {instances} instances (fake CloudWatch) | "
        f"ListMetrics {fake.calls['ListMetrics']}, GetMetricData {fake.calls['GetMetricData']} "
        f"for {fake.calls['series']} series | screening "
        f"ceil({screening}/500) = {math.ceil(screening / 500)} calls + detail for {at_risk} GPUs at risk and "
        f"{len(findings)} with errors | |",
        f"| forecast compute, {gpus} GPUs x 15 points | median {statistics.median(times) * 1000:.0f} ms, "
        f"min {min(times) * 1000:.0f} ms over {repeat} runs | target < 200 ms | |",
        f"| notifications the evaluation would produce (first run) | {at_risk} memory + {len(findings)} health | "
        f"one incident per GPU; later runs only on changes | |",
    ]


def _asg(clients: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])[
        "AutoScalingGroups"
    ][0]
    return found


def bench_spot_sweep(groups: int = 500) -> str:
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
        policy = ROOT / "bench" / "out" / "spot-policy.yaml"
        policy.parent.mkdir(exist_ok=True)
        policy.write_text("discovery: {eks: false}\n")
        env = {defaults.ENV_STATE_TABLE: TABLE, defaults.ENV_POLICY_FILE: str(policy)}
        watch = build_spot_watch(Logger(service="bench", level="ERROR"), Metrics(service="bench"), env=env)
        calls = count_calls(watch.ctx.fleet.autoscaling, watch.ctx.fleet.eks, watch.ctx.state.dynamodb)
        started = time.perf_counter()
        result = watch.sweep(NOW, "bench")
        wall = time.perf_counter() - started
    found = sum(len(g["new_failures"]) for g in result["groups"])
    control = {k.split(":")[1]: v for k, v in calls.items() if not k.startswith("dynamodb:")}
    ddb = sum(v for k, v in calls.items() if k.startswith("dynamodb:"))
    detail = ", ".join(f"{k} {v}" for k, v in sorted(control.items()))
    return (
        f"| spot_watch sweep, {groups} managed ASGs ({groups // 50} short of capacity), moto server | "
        f"{sum(control.values())} control-plane calls "
        f"({detail}); {ddb} DynamoDB calls | {found} failed launches found | {wall:.1f} s wall |"
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


def main() -> int:
    os.environ["POWERTOOLS_LOG_LEVEL"] = "WARNING"  # one log line per group would drown the table
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} {platform.python_version()}, "
        f"{datetime.now(UTC):%Y-%m-%d}"
    )
    print("| benchmark | result | target / note | |")
    print("|---|---|---|---|")
    print(bench_decide(args.groups), flush=True)
    for row in bench_cold_start():
        print(row, flush=True)
    print(bench_reconcile(args.groups, args.gpus), flush=True)
    for row in bench_notifications():
        print(row, flush=True)
    for row in bench_publisher():
        print(row, flush=True)
    for row in bench_guard():
        print(row, flush=True)
    print(bench_spot_sweep(), flush=True)
    from bench.replay import bench_replay

    for row in bench_replay():
        print(row, flush=True)
    from bench.telemetry import bench_telemetry

    print("\nTelemetry cost per 8-GPU node-month (bench/telemetry.py: a simulated 30-day month, controller on moto)\n")
    for row in bench_telemetry():
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
