"""Replay benchmarks: decision quality on the DLRM trace and the synthetic bursty workload, the policy
sweep behind the README's recommended values, boot-delay and placement sensitivity, and the wall time of a
whole 31-day replay with every baseline, and gangs under injected partial launches (training trace).
`python -m bench.replay` runs only these (`--quick`: the bursty
workload's first day and a sample of DLRM's first hours, plots to bench/out/quick/).

The plots land in bench/replay-dlrm.png, bench/replay-bursty.png and bench/replay-bursty-pack.png
(referenced from bench/README.md).
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from gpufleet.policy.fleet import FleetPolicy, parse_policy
from gpufleet_tools.replay.baselines import ClusterAutoscaler, oracle
from gpufleet_tools.replay.core import Experiment, GpufleetController
from gpufleet_tools.replay.model import CapacityShortage, Placement, ReplayOptions, RunName, Trace
from gpufleet_tools.replay.plot import plot
from gpufleet_tools.replay.policy import Workload, derived_max, recommended_policy
from gpufleet_tools.replay.report import compare, goal_rows, notes, table
from gpufleet_tools.replay.service import ALL_EXPERIMENTS, load_trace
from gpufleet_tools.replay.simulate import Controller, run
from gpufleet_tools.replay.traces import fitting

ROOT = Path(__file__).resolve().parents[1]
DLRM = ROOT.parent / "shared" / "traces" / "alibaba-gpu-v2025-dlrm-instances.csv"
SEED = 13
QUICK_DAYS = 1  # --quick: the bursty workload's first day
QUICK_DLRM_MINUTES = 360  # and one pod in QUICK_DLRM_EVERY of the DLRM trace's first 6 hours (most of its
QUICK_DLRM_EVERY = 10  # pods are up from minute 0: a replay's time grows with the pods, not the minutes)
SWEEP = {
    "scaler defaults (band 30-80, step 1, cooldowns 300/600)": "defaults: {}",
    "serving (recommended)": None,
    "batch (recommended)": None,
    "band 60-90, step 1": "defaults: {target: {low: 60, high: 90}, scale_in_step: '50%', scale_in_cooldown_s: 300}",
    "band 60-95, step 10% / 300 s": (
        "defaults: {target: {low: 60, high: 95}, scale_out_step: '10%', scale_in_step: '50%', scale_in_cooldown_s: 300}"
    ),
}


def _sample(trace: Trace, minutes: int, every: int = 1) -> Trace:
    """One pod in `every` of those that arrive in the first `minutes` of a trace (for --quick)."""
    horizon = min(trace.horizon, minutes)
    pods = tuple(p for p in trace.pods if p.arrival < horizon)[::every]
    return trace.model_copy(update={"pods": pods, "horizon": horizon})


def _traces(quick: bool = False) -> dict[str, Trace]:
    days = QUICK_DAYS if quick else 7
    found = {
        "bursty": load_trace("synthetic:bursty", SEED, days),
        "training": load_trace("synthetic:training", SEED, days),
    }
    if DLRM.exists():
        dlrm = load_trace(str(DLRM), SEED, 0)
        found = {"dlrm": _sample(dlrm, QUICK_DLRM_MINUTES, QUICK_DLRM_EVERY) if quick else dlrm, **found}
    return found


def _comparison_rows(
    label: str, trace: Trace, policy: FleetPolicy, options: ReplayOptions, png: str, plots: Path
) -> list[str]:
    started = time.perf_counter()
    c = compare(trace, policy, options, random.Random(SEED))
    wall = time.perf_counter() - started
    with_experiments = compare(trace, policy, options, random.Random(SEED), experiments=ALL_EXPERIMENTS)
    plot(c, plots / png)
    oracle_hours = c.result(RunName.ORACLE).node_hours
    rows = [f"### {label}: {c.pods:,} pods, {c.horizon / 1440:.1f} days, placement {options.placement}", ""]
    rows += table([r.result for r in c.runs], oracle_hours)
    if found := notes(c):
        rows += ["", *found]
    rows += ["", "Experiments:", "", *table([r.result for r in with_experiments.experiments], oracle_hours)]
    rows += ["", *goal_rows(c, "goal")]
    shown = (plots / png).relative_to(ROOT) if (plots / png).is_relative_to(ROOT) else plots / png
    rows += ["", f"Wall time, five policies in one process: {wall:.1f} s (plot: {shown}).", ""]
    return rows


def _gpufleet_only(trace: Trace, policy: FleetPolicy, options: ReplayOptions) -> tuple[float, float, int]:
    """gpufleet and the oracle alone, on the pods a node can hold (as `compare` replays them)."""
    pods, _ = fitting(trace.pods, trace.horizon, options.gpus_per_node)
    best = oracle(pods, trace.horizon, options)
    top = derived_max(max(best.timeline.nodes), options.min_nodes, None)
    g = GpufleetController(policy, options, top)
    r = run(pods, trace.horizon, g, options, initial_nodes=best.timeline.nodes[0]).result
    return r.node_hours / best.result.node_hours, r.pending_gpu_minutes, r.pods_disrupted


def policy_sweep(traces: dict[str, Trace]) -> list[str]:
    """gpufleet alone under each candidate policy on every trace: what the recommended values rest on."""
    options = ReplayOptions()
    rows = ["| gpufleet policy | " + " | ".join(f"{k}: node-h vs oracle, pending GPU-min" for k in traces) + " |"]
    rows.append("|---|" + "---|" * len(traces))
    for label, yaml in SWEEP.items():
        if yaml is None:
            policy = recommended_policy(Workload.SERVING if label.startswith("serving") else Workload.BATCH)
        else:
            policy = parse_policy(yaml)
        cells = []
        for trace in traces.values():
            ratio, pending, _ = _gpufleet_only(trace, policy, options)
            cells.append(f"{ratio:.3f}x, {pending:,.0f}")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return rows


def boot_sensitivity(trace: Trace, boots: tuple[int, ...] = (2, 5, 10, 15)) -> list[str]:
    """The cost of slow boots on the bursty workload: gpufleet (batch policy) and Cluster Autoscaler."""
    rows = ["| boot minutes | gpufleet node-h vs oracle | gpufleet pending GPU-min | CA pending GPU-min |"]
    rows.append("|---:|---:|---:|---:|")
    policy = recommended_policy(Workload.BATCH)
    for boot in boots:
        options = ReplayOptions(boot_minutes=boot)
        ratio, pending, _ = _gpufleet_only(trace, policy, options)
        pods, _ = fitting(trace.pods, trace.horizon, options.gpus_per_node)
        best = oracle(pods, trace.horizon, options)
        ca: Controller = ClusterAutoscaler(options, derived_max(max(best.timeline.nodes), 1, None))
        ca_pending = run(pods, trace.horizon, ca, options, initial_nodes=best.timeline.nodes[0]).result
        rows.append(f"| {boot} | {ratio:.3f}x | {pending:,.0f} | {ca_pending.pending_gpu_minutes:,.0f} |")
    return rows


def gang_rows(trace: Trace, policy: FleetPolicy) -> list[str]:
    """Gangs on the training trace: gpufleet (with consolidation by attrition, its replayed default, and
    without), and Cluster
    Autoscaler, both placements, with and without the
    injected capacity shortage (CapacityShortage's stated defaults): node-hours vs the oracle, waiting,
    partially billed gang node-minutes, gangs started and their mean wait."""
    short = CapacityShortage()
    rows = [
        "| placement | partial launches | policy | node-h vs oracle | pending GPU-min "
        "| partially billed gang node-min | gangs started | mean gang wait min |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    pods, _ = fitting(trace.pods, trace.horizon, ReplayOptions().gpus_per_node)
    gangs = len({p.gang for p in pods if p.gang})
    for placement in Placement:
        for shortage in (None, short):
            options = ReplayOptions(placement=placement, shortage=shortage)
            best = oracle(pods, trace.horizon, options)
            top = derived_max(max(best.timeline.nodes), options.min_nodes, None)
            runs: list[Controller] = [
                GpufleetController(policy, options, top),
                GpufleetController(policy, options, top, Experiment(consolidation_off=True)),
                ClusterAutoscaler(options, top),
            ]
            for c in runs:
                r = run(pods, trace.horizon, c, options, initial_nodes=best.timeline.nodes[0]).result
                wait = "-" if r.gang_wait_minutes is None else f"{r.gang_wait_minutes:,.1f}"
                rows.append(
                    f"| {placement} | {'injected' if shortage else 'none'} | {c.name} "
                    f"| {r.node_hours / best.result.node_hours:.3f}x | {r.pending_gpu_minutes:,.0f} "
                    f"| {r.gang_partial_node_minutes:,.0f} | {r.gangs_started} of {gangs} | {wait} |"
                )
    return [*rows, "", f"Injected partial launches: {short.label} (seed {short.seed}), the same for every run."]


def bench_replay(quick: bool = False, out: Path | None = None) -> list[str]:
    """Every replay benchmark; `quick`: small traces (QUICK_*) and two boot delays. Plots go
    to `out` when given, else next to bench/README.md."""
    traces = _traces(quick)
    plots = out or ROOT / "bench"
    rows: list[str] = []
    if "dlrm" in traces:
        policy = recommended_policy(Workload.SERVING)
        rows += _comparison_rows("DLRM v2025", traces["dlrm"], policy, ReplayOptions(), "replay-dlrm.png", plots)
        pack = ReplayOptions(placement=Placement.PACK)
        rows += _comparison_rows("DLRM v2025", traces["dlrm"], policy, pack, "replay-dlrm-pack.png", plots)
    else:
        rows += ["(DLRM trace not found next to the checkout: skipped)", ""]
    bursty, batch = traces["bursty"], recommended_policy(Workload.BATCH)
    label = "synthetic bursty (seed 13)"
    rows += _comparison_rows(label, bursty, batch, ReplayOptions(), "replay-bursty.png", plots)
    pack = ReplayOptions(placement=Placement.PACK)
    rows += _comparison_rows(label, bursty, batch, pack, "replay-bursty-pack.png", plots)
    training, label = traces["training"], "synthetic training cluster (seed 13)"
    rows += _comparison_rows(label, training, batch, ReplayOptions(), "replay-training.png", plots)
    rows += _comparison_rows(label, training, batch, pack, "replay-training-pack.png", plots)
    rows += [f"### Gangs and partial launches ({label}, batch policy)", "", *gang_rows(training, batch), ""]
    rows += ["### Policy sweep (gpufleet alone, spread)", "", *policy_sweep(traces), ""]
    boots = (2, 5) if quick else (2, 5, 10, 15)
    rows += ["### Boot delay (synthetic bursty, batch policy)", "", *boot_sensitivity(bursty, boots), ""]
    return rows


if __name__ == "__main__":
    quick = "--quick" in sys.argv[1:]
    out = ROOT / "bench" / "out" / "quick" if quick else None
    if out:
        out.mkdir(parents=True, exist_ok=True)
    for line in bench_replay(quick, out):
        print(line, flush=True)
    sys.exit(0)
