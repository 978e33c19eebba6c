"""Every policy on the same trace, the same boot delay and bounds, then the table and the issue's goals.

Pure: `compare` runs the simulations (progress reported through a callback), `report_json` / `report_md`
render them; the service writes the files and draws the plot.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpufleet.domain.models import Frozen
from gpufleet.domain.policy import FleetPolicy
from gpufleet_tools.replay.baselines import AsgTargetTracking, ClusterAutoscaler, StaticPeak, demand_milli, oracle
from gpufleet_tools.replay.core import Experiment, GpufleetController
from gpufleet_tools.replay.model import MILLI_PER_GPU, ReplayOptions, RunName, RunOutcome, RunResult, Trace
from gpufleet_tools.replay.policy import derived_max
from gpufleet_tools.replay.simulate import Controller, TieBreaker, run

ORDER = tuple(RunName)


class Goal(Frozen):
    """One of the issue's goals for gpufleet on this trace, met or not, with the numbers."""

    goal: str
    met: bool
    detail: str


class Comparison(Frozen):
    source: str
    options: ReplayOptions
    pods: int
    horizon: int
    max_nodes: int
    initial_nodes: int
    demand_gpus: tuple[float, ...]
    runs: tuple[RunOutcome, ...]
    experiments: tuple[RunOutcome, ...] = ()

    def result(self, name: RunName) -> RunResult:
        return next(r.result for r in self.runs if r.result.name == name)


def compare(
    trace: Trace,
    policy: FleetPolicy,
    options: ReplayOptions,
    ties: TieBreaker,
    *,
    experiments: Sequence[Experiment] = (),
    progress: Callable[[int], None] | None = None,
) -> Comparison:
    """The five runs of report.json (plus any experiments), in one process. Every simulated policy
    starts from the same warm fleet: the nodes the oracle needs at minute 0."""
    pods = [p for p in trace.pods if p.gpus <= options.gpus_per_node]
    best = oracle(pods, trace.horizon, options)
    peak, first = max(best.timeline.nodes), best.timeline.nodes[0]
    top = derived_max(peak, options.min_nodes, options.max_nodes)
    controllers: list[Controller] = [
        GpufleetController(policy, options, top),
        StaticPeak(),
        AsgTargetTracking(options, top, ties),
        ClusterAutoscaler(options, top),
    ]
    simulated = {
        c.name: run(pods, trace.horizon, c, options, initial_nodes=_start(c, first, peak), progress=progress)
        for c in controllers
    }
    simulated[best.result.name] = best
    extra = tuple(
        run(
            pods,
            trace.horizon,
            GpufleetController(policy, options, top, e),
            options,
            initial_nodes=first,
            progress=progress,
        )
        for e in experiments
    )
    return Comparison(
        source=trace.source,
        options=options,
        pods=len(pods),
        horizon=trace.horizon,
        max_nodes=top,
        initial_nodes=first,
        demand_gpus=tuple(d / MILLI_PER_GPU for d in demand_milli(pods, trace.horizon)),
        runs=tuple(simulated[str(name)] for name in ORDER),
        experiments=extra,
    )


def _start(controller: Controller, first: int, peak: int) -> int:
    return peak if controller.name == RunName.STATIC_PEAK else first


def goals(c: Comparison) -> list[Goal]:
    """The goals for gpufleet on every trace, checked on this comparison: disrupt nothing, wait no longer
    than Cluster Autoscaler, stay within 1.25x the oracle's node-hours; and cheaper than a static fleet."""
    g, o = c.result(RunName.GPUFLEET), c.result(RunName.ORACLE)
    ca, peak = c.result(RunName.CLUSTER_AUTOSCALER), c.result(RunName.STATIC_PEAK)
    ratio = g.node_hours / o.node_hours if o.node_hours else float("inf")
    return [
        Goal(
            goal="pods_disrupted = 0", met=g.pods_disrupted == 0, detail=f"{g.pods_disrupted} (CA {ca.pods_disrupted})"
        ),
        Goal(
            goal="pending_gpu_minutes <= cluster-autoscaler",
            met=g.pending_gpu_minutes <= ca.pending_gpu_minutes,
            detail=f"{g.pending_gpu_minutes:,.0f} vs {ca.pending_gpu_minutes:,.0f}",
        ),
        Goal(goal="node_hours <= 1.25x oracle", met=ratio <= 1.25, detail=f"{ratio:.3f}x"),
        Goal(
            goal="cost < static-peak",
            met=g.cost_usd < peak.cost_usd,
            detail=f"${g.cost_usd:,.0f} vs ${peak.cost_usd:,.0f}",
        ),
    ]


def report_json(c: Comparison) -> dict[str, object]:
    """report.json: `runs` holds exactly the five policies with exactly the promised keys."""
    return {
        "trace": c.source,
        "pods": c.pods,
        "minutes": c.horizon,
        "options": c.options.model_dump(mode="json"),
        "group": {"min": c.options.min_nodes, "max": c.max_nodes, "initial": c.initial_nodes},
        "runs": [r.result.model_dump(mode="json") for r in c.runs],
        "experiments": [r.result.model_dump(mode="json") for r in c.experiments],
        "goals": [g.model_dump(mode="json") for g in goals(c)],
    }


def table(results: Sequence[RunResult], oracle_hours: float) -> list[str]:
    rows = [
        "| policy | node-hours | vs oracle | GPU-h provisioned | GPU-h used | pending GPU-min | pods disrupted "
        "| lost GPU-h | scaling actions | cost USD |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        ratio = f"{r.node_hours / oracle_hours:.3f}x" if oracle_hours else "-"
        rows.append(
            f"| {r.name} | {r.node_hours:,.1f} | {ratio} | {r.gpu_hours_provisioned:,.0f} | {r.gpu_hours_used:,.0f} "
            f"| {r.pending_gpu_minutes:,.0f} | {r.pods_disrupted:,} | {r.lost_gpu_hours:,.1f} "
            f"| {r.scaling_actions:,} | {r.cost_usd:,.0f} |"
        )
    return rows


def report_md(c: Comparison) -> str:
    o = c.options
    days = c.horizon / 1440
    lines = [
        f"# Replay: {c.source}",
        "",
        f"{c.pods:,} GPU pods over {days:.1f} days; {o.gpus_per_node} GPUs per node, boot {o.boot_minutes} min, "
        f"${o.node_price:g}/node-hour, placement {o.placement}; group min {o.min_nodes}, max {c.max_nodes}, "
        f"{c.initial_nodes} nodes up at the start.",
        "",
        *table([r.result for r in c.runs], c.result(RunName.ORACLE).node_hours),
    ]
    if c.experiments:
        lines += ["", "Experiments (not what the scaler does today):", ""]
        lines += table([r.result for r in c.experiments], c.result(RunName.ORACLE).node_hours)
    lines += ["", "| gpufleet goal | met | value |", "|---|---|---|"]
    lines += [f"| {g.goal} | {'yes' if g.met else 'NO'} | {g.detail} |" for g in goals(c)]
    return "\n".join(lines) + "\n"
