"""capacity.png: demand, each policy's provisioned GPUs and each policy's pending GPUs, hourly.

The pending panel is scaled to the runs that are ranked: a baseline that could not start (its pending
curve is all the demand) would otherwise flatten gpufleet's and Cluster Autoscaler's curves to a line.
Such a run is clipped at the top and its legend says so. matplotlib is imported only to draw.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpufleet_tools.replay.model import RunOutcome
from gpufleet_tools.replay.report import Comparison

HEADROOM = 1.1  # the pending panel's top: this much above the highest ranked run
MIN_TOP = 1.0  # GPUs: the panel's top when no ranked run ever waited


def pending_limit(runs: Sequence[RunOutcome]) -> float | None:
    """The pending panel's y-limit: from the ranked runs only, or None (matplotlib's own) when no run
    that is not ranked would go off it."""
    ranked = max((max(r.timeline.pending_gpus, default=0.0) for r in runs if not r.result.not_ranked), default=0.0)
    top = max(ranked * HEADROOM, MIN_TOP)
    others = max((max(r.timeline.pending_gpus, default=0.0) for r in runs if r.result.not_ranked), default=0.0)
    return top if others > top else None


def legend_label(outcome: RunOutcome, limit: float | None) -> str:
    """The run's name; a run that is not ranked says why, and that it is clipped when it goes off scale."""
    r = outcome.result
    if not r.not_ranked:
        return r.name
    clipped = limit is not None and max(outcome.timeline.pending_gpus, default=0.0) > limit
    return f"{r.name} (not ranked: {r.not_ranked}{'; clipped' if clipped else ''})"


def _hourly(values: Sequence[float], how: Callable[[Sequence[float]], float]) -> list[float]:
    return [how(values[i : i + 60]) for i in range(0, len(values), 60)]


def plot(c: Comparison, path: Path) -> None:
    """Demand, each policy's provisioned GPUs and each policy's pending GPUs, hourly (max within the
    hour for capacity and pending, mean for demand)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 7.5), sharex=True, height_ratios=(3, 1.4))
    hours = list(range(0, c.horizon, 60))
    x = [h / 1440 for h in hours]
    limit = pending_limit(c.runs)
    top.plot(x, _hourly(c.demand_gpus, lambda v: sum(v) / len(v)), color="black", lw=2.2, label="demand (GPUs)")
    for k, outcome in enumerate(c.runs):
        gpus = [n * c.options.gpus_per_node for n in outcome.timeline.nodes]
        style = "--" if outcome.result.not_ranked else "-"
        label = legend_label(outcome, None)
        top.plot(x, _hourly(gpus, max), lw=1.1, ls=style, color=f"C{k}", label=f"{label} capacity")
        pending = outcome.timeline.pending_gpus
        if any(pending):
            line = _hourly(pending, max)
            bottom.plot(x, line, lw=1.0, ls=style, color=f"C{k}", label=legend_label(outcome, limit))
    if limit is not None:
        bottom.set_ylim(0, limit)
    top.set_ylabel("GPUs")
    title = f"{c.source}: demand vs provisioned GPUs (placement {c.options.placement})"
    if c.never_fit.pods:
        title += f"\n{c.never_fit.line}"
    top.set_title(title, fontsize=10)
    top.legend(loc="upper left", fontsize=8, ncols=2)
    bottom.set_ylabel("pending GPUs")
    bottom.set_xlabel("day")
    if bottom.lines:
        bottom.legend(loc="upper left", fontsize=8, ncols=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
