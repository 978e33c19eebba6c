"""The whole cost of watching and controlling one 8-GPU node for a month, side by side (issue 14).

`python -m bench.telemetry` (also part of `make bench`; `--quick`: the first 3 days and a fleet of 2 x 2
nodes, the controller's reads in `adaptive` only; numbers not to quote). Two measurements, both real code:

1. A 30-day month of one node (the scenario below) through the real publisher on a simulated NVML
   backend, in `adaptive` (the default), `essential` and `full`, and through gpumon.py's and the
   CloudWatch agent's `nvidia_gpu` request patterns, each in its own process (bench/telemetry_run.py).
   Counted: PutMetricData requests and series-hours (CloudWatch bills a custom metric for every hour in
   which it receives data: $0.30/730 per series-hour in the first tier). The publisher samples every 10 s
   of simulated time instead of every second (as the rehearsal does): windows stay 60 s, and neither the
   requests nor the series-hours depend on the sampling rate.
2. The controller's own reads, measured on moto server: a fleet of 2 ASGs x 10 nodes publishing in each
   of our modes (real publisher, simulated GPUs), then one reconcile tick (`build_scaler`) and one
   OOM-guard evaluation (`build_guard`; its ListMetrics inventory counted once per 15 evaluations, as a
   warm function caches it), counting the metrics requested
   by GetMetricData (sum of len(MetricDataQueries) per call, $0.01 per 1,000) and the other CloudWatch
   requests ($0.01 per 1,000), scaled to a node-month at the default schedules (both every minute).
   A scale-in check (the group series' forged-metrics check, then the instance metrics of the whole
   group) is measured too and added at most once per
   scale-in cooldown (600 s) through every idle hour of the scenario - an upper bound.

Group series are shared by the nodes of a group: a node pays 1/GROUP_NODES of them.

The scenario (bench/telemetry_scenario.py: one p4d-class node, 8 x 80 GiB, Monday 2026-11-02 00:00 UTC for
30 days):
- weekdays 08:00-20:00 busy: utilization 60-95 % (power-capped at >= 90 %), memory 35-54 %; nights and
  weekends idle: utilization 0-2 %, memory 2-4 %;
- memory above the detail threshold a few times: day 2 10:00-14:00 GPU 2 at 82 %; day 9 09:00-12:00
  GPUs 5 and 6 at 76 %; day 16 13:00-15:00 GPU 4 hovering 72 % / 64 % every 5 minutes (hysteresis keeps
  its series on instead of flapping); day 22 14:00-15:30 GPU 1 leaking 0.5 %/min from 50 % to 95 %, then
  its process restarts;
- one XID 94 (contained ECC error) on GPU 3, day 10 14:22;
- the host (`Scenario.host`, read by the real publisher's host reader from a fake /proc/meminfo and
  statvfs): memory 45-59 % busy, 18 % idle, a host-memory leak on day 11 10:00-13:00 (50 % -> 86 %);
  the data filesystem at 83 % on day 18 09:00-15:00, 55 % otherwise; no swap.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.telemetry_scenario import DAYS, GPUS, HOUR, QUICK_DAYS, FakeHost, Scenario

ROOT = Path(__file__).resolve().parents[1]
GROUP_NODES = 10
HOURS_BILLED_PER_MONTH = 730  # CloudWatch prorates the monthly metric price by the hour over 730 h
METRIC_MONTH = 0.30  # $ per custom metric-month, first 10,000 metrics
REQUEST = 0.01 / 1000  # $ per PutMetricData / ListMetrics / other request
GMD_METRIC = 0.01 / 1000  # $ per metric requested by GetMetricData
TICKS_PER_MONTH = DAYS * 24 * 60  # reconcile and OOM guard every minute (ReconcileRate default)
SCALE_IN_COOLDOWN_S = 600
GUARD_INVENTORY_EVALS = 15  # a warm guard lists the fleet's GPUs again every 15 min (INVENTORY_MAX_AGE)


# ---- 1. the month, per side ----

SIDES = ("adaptive", "attributed", "essential", "full", "gpumon", "agent")
LOG_INGEST_GB = 0.50  # $ per GB ingested into CloudWatch Logs (standard class)
LOG_STORE_GB_MONTH = 0.03  # $ per GB-month stored (billed compressed; counted uncompressed here: an upper bound)
USAGE_RETENTION_MONTHS = 400 / 30.4  # the template's default UsageRetentionDays: each month's records kept ~13 months


def run_side(side: str, days: int = DAYS) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "layers" / "node")])}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "telemetry_run.py"), side, str(days)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def logs_cost(result: dict[str, Any]) -> float:
    """Usage records of a node-month: ingestion, plus storage over the retention (steady state: a month
    pays for every month still kept)."""
    gb: float = result.get("logs", {}).get("bytes", 0) / 1e9
    return gb * LOG_INGEST_GB + gb * LOG_STORE_GB_MONTH * USAGE_RETENTION_MONTHS


def series_cost(result: dict[str, Any], group_nodes: int = GROUP_NODES) -> float:
    hours = result["series_hours"]
    per_node: float = hours["gpu"] + hours["instance"] + hours["group"] / group_nodes
    return per_node * METRIC_MONTH / HOURS_BILLED_PER_MONTH


# ---- 2. the controller's reads, per mode ----


def _publish(clients: Any, asg: str, mode: str, busy: bool, end: datetime, minutes: int = 6) -> list[str]:
    """Every instance of `asg` publishes `minutes` of data ending at `end` through the real publisher."""
    from gpufleet_node.host import HostFeed
    from gpufleet_node.identity import Identity
    from gpufleet_node.nvml import SimulatedBackend
    from gpufleet_node.publisher import Publisher, simulate
    from gpufleet_node.sender import Sender

    group = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"][0]
    ids = sorted(i["InstanceId"] for i in group["Instances"])
    scratch = tempfile.TemporaryDirectory()
    for n, iid in enumerate(ids):
        host = FakeHost(Path(scratch.name) / iid)
        host.meminfo.parent.mkdir()
        host.set(80.0 if busy and n == 0 else 45.0 if busy else 18.0, 38.0, 55.0)  # one node under pressure
        backend = SimulatedBackend(gpus=GPUS, memory_total_mib=81920.0)
        for g in range(GPUS):
            backend.set(g, 50 + 3 * g if busy else 1, 45 if busy else 3)
        if busy and n == 0:
            backend.set(2, 60, 80)  # one GPU of the fleet above the detail threshold
        identity = Identity(iid, "us-east-1", asg_name=asg)
        pub = Publisher(backend, identity, Sender(clients.cloudwatch), detail=mode, host=HostFeed(host.reader))
        pub.start(xid_thread=False)
        for m in range(minutes):
            start = end - timedelta(minutes=minutes - m)
            simulate(pub, start, 60, every_s=30)
            pub.close_windows(start + timedelta(seconds=59))
    scratch.cleanup()
    return ids


def _reads(client: Any) -> dict[str, int]:
    counts = {"metrics": 0, "calls": 0, "other": 0}

    def gmd(params: dict[str, Any], **_: Any) -> None:
        counts["metrics"] += len(params.get("MetricDataQueries", []))
        counts["calls"] += 1

    def other(model: Any, **_: Any) -> None:
        if model.name != "GetMetricData":
            counts["other"] += 1

    client.meta.events.register("provide-client-params.cloudwatch.GetMetricData", gmd)
    client.meta.events.register("before-call.cloudwatch", other)
    return counts


def _tick(scaler: Any, now: datetime, tag: str) -> dict[str, int]:
    counts = _reads(scaler.metrics.cloudwatch)
    scaler.handle({"gpufleet": "reconcile", "execution_id": tag, "scheduled_time": now.isoformat()}, now)
    return dict(counts)


def controller_reads(
    mode: str, out: Path = ROOT / "bench" / "out", group_nodes: int = GROUP_NODES, minutes: int = 6
) -> dict[str, Any]:
    """Build the fleet (2 ASGs of `group_nodes`), publish `minutes`, then measure a steady reconcile tick,
    a scale-in check and a warm OOM-guard evaluation, each on its own counted client."""
    import boto3
    from aws_lambda_powertools import Logger, Metrics
    from botocore.config import Config

    from gpufleet.domain import defaults
    from gpufleet.runtime import build_guard
    from rehearsal import fleet
    from rehearsal.moto import moto_server
    from tests.integration.conftest import TABLE, Fleet

    # Minute 7: a tick that does not audit in-band holds (every SERIES_AUDIT_EVERY_MIN minutes); the audit
    # tick is measured on its own below and counted once per that many ticks.
    now = datetime.now(UTC).replace(minute=7, second=0, microsecond=0)
    with moto_server() as server:
        clients = fleet.Clients.create()
        fleet.create_state_table(clients.dynamodb, TABLE)
        queue = boto3.client("sqs").create_queue(QueueName="gpufleet-notify")["QueueUrl"]  # as deployed
        for asg in ("bench-busy", "bench-idle"):
            fleet.create_asg(clients, asg, min_size=1, max_size=20, desired=group_nodes, tags=fleet.MANAGED_TAG)
            _publish(clients, asg, mode, busy=asg == "bench-busy", end=now, minutes=minutes)
        steady, scale_in = out / f"telemetry-steady-{mode}.yaml", out / f"telemetry-scalein-{mode}.yaml"
        steady.write_text("dry_run: true\ndiscovery: {eks: false}\ndefaults: {target: {low: 1, high: 95}}\n")
        scale_in.write_text("dry_run: true\ndiscovery: {eks: false}\n")
        bench_fleet = Fleet(clients, steady, server.url, "")
        tick = _tick(bench_fleet.scaler(notify_queue=queue), now, f"steady-{mode}")
        every, defaults.SERIES_AUDIT_EVERY_MIN = defaults.SERIES_AUDIT_EVERY_MIN, 1
        try:  # the same tick as an audit tick: the in-band groups' series checked (4 metrics each)
            audit = _tick(bench_fleet.scaler(notify_queue=queue), now, f"audit-{mode}")
        finally:
            defaults.SERIES_AUDIT_EVERY_MIN = every
        check = _tick(bench_fleet.scaler(policy=scale_in.read_text(), notify_queue=queue), now, f"scale-in-{mode}")
        env = {defaults.ENV_STATE_TABLE: TABLE, defaults.ENV_POLICY_FILE: str(steady)}
        guard = build_guard(Logger(service="bench", level="ERROR"), Metrics(namespace="GPUFleet/Bench"), env=env)
        # moto server answers a few hundred GetMetricData queries in tens of seconds (CloudWatch: well under
        # one), beyond the controller's 20 s read timeout: same calls, a patient client, no retries
        guard.metrics.cloudwatch = boto3.client(
            "cloudwatch", config=Config(read_timeout=900, retries={"max_attempts": 1})
        )
        counts = _reads(guard.metrics.cloudwatch)
        # A warm container that last screened host memory at minute 5: the run at 7 does not screen, the
        # run at 10 (HOST_SCREEN_EVERY_MIN minutes on) does (hosts.HostScreening). At rate(1 minute), the
        # default priced here, that is one run in HOST_SCREEN_EVERY_MIN, as before (at rate(5 minutes)
        # every run screens: the same reads a month, fewer runs).
        guard.host_screening.screened(now.replace(minute=5))
        guard.evaluate(now, f"guard-{mode}")  # a warm run asks the same, without ListMetrics (cached 15 min)
        steady_guard = dict(counts)
        # minute 10: a host-screening run (every HOST_SCREEN_EVERY_MIN minutes), counted once per that many
        guard.evaluate(now.replace(minute=10), f"guard-host-{mode}")
        host_guard = {k: counts[k] - steady_guard[k] for k in counts}
    return {
        "nodes": 2 * group_nodes,
        "group_nodes": group_nodes,
        "tick": tick,
        "audit_tick": audit,
        "scale_in_check": check,
        "guard": steady_guard,
        "guard_host": host_guard,
    }


def controller_cost(reads: dict[str, Any], scenario: Scenario) -> tuple[float, float]:
    """$ per node-month, (reconcile, OOM guard): every tick and evaluation, plus the scale-in checks'
    extra reads (upper bound)."""
    nodes, group_nodes = reads["nodes"], reads.get("group_nodes", GROUP_NODES)
    per_tick = reads["tick"]["metrics"] * GMD_METRIC + reads["tick"]["other"] * REQUEST
    audit = reads.get("audit_tick", reads["tick"])  # one tick in SERIES_AUDIT_EVERY_MIN checks in-band holds
    per_tick += (audit["metrics"] - reads["tick"]["metrics"]) * GMD_METRIC / _audit_every()
    per_eval = reads["guard"]["metrics"] * GMD_METRIC
    per_eval += reads["guard"]["other"] * REQUEST / GUARD_INVENTORY_EVALS  # ListMetrics, cached 15 min
    host = reads.get("guard_host", reads["guard"])  # host memory screened on every HOST_SCREEN_EVERY_MIN-th run
    per_eval += (host["metrics"] - reads["guard"]["metrics"]) * GMD_METRIC / _host_every()
    check_extra = (reads["scale_in_check"]["metrics"] - reads["tick"]["metrics"]) * GMD_METRIC
    checks = scenario.idle_hours() * HOUR // SCALE_IN_COOLDOWN_S  # per group of group_nodes
    reconcile = per_tick * TICKS_PER_MONTH / nodes + check_extra * checks / group_nodes
    return float(reconcile), float(per_eval * TICKS_PER_MONTH / nodes)


def _host_every() -> int:
    from gpufleet.domain import defaults

    return defaults.HOST_SCREEN_EVERY_MIN


def _audit_every() -> int:
    from gpufleet.domain import defaults

    return defaults.SERIES_AUDIT_EVERY_MIN


# ---- the table ----

LABELS = {
    "adaptive": "gpufleet `adaptive` (default)",
    "attributed": "gpufleet `adaptive` + attribution (default config)",
    "essential": "gpufleet `essential`",
    "full": "gpufleet `full`",
    "gpumon": "gpumon.py pattern",
    "agent": "CloudWatch agent `nvidia_gpu` (17/GPU)",
}


def rows(
    month: dict[str, dict[str, Any]], reads: dict[str, dict[str, Any]], scenario: Scenario | None = None
) -> list[str]:
    scenario = scenario or Scenario()
    fleet = next(iter(reads.values()))["nodes"] if reads else 2 * GROUP_NODES
    group_nodes = next(iter(reads.values())).get("group_nodes", GROUP_NODES) if reads else GROUP_NODES
    out = [
        "| side | series-hours (GPU / instance / group) | PutMetricData requests | series $ | PutMetricData $ "
        "| usage records $ (MB ingested) "
        f"| controller reads $ (GetMetricData metrics: reconcile tick + guard run, fleet of {fleet} nodes) "
        "| total $/node-month | per 100 nodes |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    totals = {}
    for side, r in month.items():
        s, p = series_cost(r, group_nodes), (r["requests"] + r.get("logs", {}).get("requests", 0)) * REQUEST
        lg = logs_cost(r)
        side_reads = reads.get("adaptive" if side == "attributed" else side)
        c = sum(controller_cost(side_reads, scenario)) if side_reads else 0.0
        totals[side] = s + p + lg + c
        h = r["series_hours"]
        what = (
            f"{c:.2f} ({side_reads['tick']['metrics']} + {side_reads['guard']['metrics']}"
            f" + {_host_extra(side_reads)}/{_host_every()} host)"
            if side_reads
            else "- (cannot drive gpufleet)"
        )
        records = f"{lg:.3f} ({r['logs']['bytes'] / 1e6:.1f})" if r.get("logs", {}).get("events") else "-"
        out.append(
            f"| {LABELS[side]} | {h['gpu']:,} / {h['instance']:,} / {h['group']:,} | {r['requests']:,} | {s:.2f} "
            f"| {p:.2f} | {records} | {what} | **${totals[side]:.2f}** | ${100 * totals[side]:,.0f} |"
        )
    if "adaptive" in month and "adaptive" in reads:
        a = month["adaptive"]
        reconcile, guard = controller_cost(reads["adaptive"], scenario)
        out.append("")
        out.append(
            f"telemetry cost per 8-GPU node-month: ${totals['adaptive']:.2f} all-in (adaptive, default: series "
            f"${series_cost(a, group_nodes):.2f} + PutMetricData ${a['requests'] * REQUEST:.2f} + controller reads "
            f"${reconcile + guard:.2f} = reconcile ${reconcile:.2f} + OOM guard ${guard:.2f}; goal <= $2.00) "
            f"vs gpumon pattern ${totals.get('gpumon', 0):.2f}, CloudWatch agent ${totals.get('agent', 0):.2f}; "
            f"{a['detail_gpu_hours']:.0f} GPU-hours of per-GPU detail in the month"
        )
    if "adaptive" in month and "adaptive" in reads:
        out.append(host_line(month["adaptive"], reads["adaptive"], group_nodes))
    if "attributed" in month and "adaptive" in reads:
        t = month["attributed"]
        out.append(
            f"with attribution on (the default): ${totals['attributed']:.2f} all-in per 8-GPU node-month "
            "(goal <= $2.00): "
            f"{t['logs']['events']:,} usage records ({t['logs']['bytes'] / t['logs']['events']:.0f} B each, "
            f"${logs_cost(t):.3f} ingested and kept {USAGE_RETENTION_MONTHS:.1f} months), "
            f"{t['series_by_scope']['group'] - a['series_by_scope']['group']} fleet-wide team series "
            f"(${series_cost(t, group_nodes) - series_cost(a, group_nodes):.2f} per node "
            f"at {group_nodes} nodes sharing them)"
        )
    return out


def _host_extra(reads: dict[str, Any]) -> int:
    return int(reads.get("guard_host", reads["guard"])["metrics"] - reads["guard"]["metrics"])


def host_line(a: dict[str, Any], reads: dict[str, Any], group_nodes: int) -> str:
    """What the host metrics cost in the adaptive month: the group's shared series, the node's own while
    under pressure, and the guard's host screen."""
    h = a.get("host_series_hours", {"instance": 0, "group": 0})
    shared = h["group"] / group_nodes * METRIC_MONTH / HOURS_BILLED_PER_MONTH
    own = h["instance"] * METRIC_MONTH / HOURS_BILLED_PER_MONTH
    guard = _host_extra(reads) * GMD_METRIC / _host_every() * TICKS_PER_MONTH / reads["nodes"]
    return (
        f"host metrics (in the figures above): group series {h['group']:,} series-hours shared by {group_nodes} "
        f"nodes ${shared:.3f} + the node's own {h['instance']:,} series-hours while under pressure "
        f"({a.get('host_detail_hours', 0):.0f} h) ${own:.3f} + OOM guard's host screen "
        f"({_host_extra(reads)} metrics every {_host_every()} min) ${guard:.3f} = ${shared + own + guard:.2f} "
        "per node-month; no new PutMetricData request"
    )


def bench_telemetry(quick: bool = False, out: Path = ROOT / "bench" / "out") -> list[str]:
    """The month's five sides run in subprocesses while the controller's reads are measured here.
    `quick`: QUICK_DAYS instead of the month, 2 groups of 2 nodes publishing 2 minutes."""
    days, group_nodes, minutes = (QUICK_DAYS, 2, 2) if quick else (DAYS, GROUP_NODES, 6)
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        futures = {side: pool.submit(run_side, side, days) for side in SIDES}
        modes = ("adaptive",) if quick else ("adaptive", "essential", "full")  # the same code path per mode
        reads = {m: controller_reads(m, out, group_nodes, minutes) for m in modes}
        month = {side: f.result() for side, f in futures.items()}
    (out / "telemetry.json").write_text(json.dumps({"month": month, "reads": reads}, indent=1))
    return rows(month, reads, Scenario(days))


if __name__ == "__main__":
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
    quick = "--quick" in sys.argv[1:]
    out = ROOT / "bench" / "out" / ("quick" if quick else "")
    out.mkdir(parents=True, exist_ok=True)
    for line in bench_telemetry(quick, out):
        print(line, flush=True)
