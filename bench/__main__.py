"""`make bench`: scaler benchmarks. Prints a Markdown row per result; copy them into bench/README.md.

1. Reconcile of N groups x 8 GPUs against moto server: AWS API calls per reconcile and wall time.
2. The pure decision core for N groups (no I/O).
3. Cold-start proxy: importing the scaler handler's modules vs a bare `import boto3`, same run.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpufleet.decide import decide_reconcile
from gpufleet.fleet_policy import GroupSettings
from gpufleet.models import GroupKind, GroupObservation, GroupRef, GroupState, InstanceObservation

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
            scaler.fleet.autoscaling, scaler.metrics.cloudwatch, scaler.state.dynamodb, scaler.fleet.eks
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


def _import_time(code: str, runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", code],
            check=True,
            cwd=ROOT,
            env={
                "PATH": "/usr/bin:/bin",
                "AWS_DEFAULT_REGION": "us-east-1",
                "GPUFLEET_STATE_TABLE": "t",
                "POWERTOOLS_TRACE_DISABLED": "true",
            },
        )
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench_cold_start(runs: int = 7) -> str:
    app = ROOT / "functions" / "scaler" / "app.py"
    handler = (
        f"import importlib.util as u; s = u.spec_from_file_location('app', {str(app)!r}); "
        "m = u.module_from_spec(s); s.loader.exec_module(m)"
    )
    # Interleave to share the machine's noise.
    base, ours = [], []
    for _ in range(runs):
        base.append(_import_time("import boto3", 1))
        ours.append(_import_time(handler, 1))
    b, o = statistics.median(base), statistics.median(ours)
    return (
        f"| cold-start proxy: import scaler handler (builds clients) vs bare `import boto3` | "
        f"{o * 1000:.0f} ms vs {b * 1000:.0f} ms | ratio {o / b:.2f}x (target <= 1.5x) | {runs} interleaved runs |"
    )


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
    print(bench_cold_start(), flush=True)
    print(bench_reconcile(args.groups, args.gpus), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
