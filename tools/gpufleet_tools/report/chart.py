"""The report's PNG (matplotlib, Agg: no display needed): GPU-hours per team per day (per hour for a
period under two days), allocated above and busy below on the same scale, so the gap between the two
panels is the idle time the teams paid for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet_node.schema import TEAM_UNALLOCATED
from gpufleet_tools.report.render import OTHER, ChartSeries

_GREY = "#b0b0b0"
_OTHER_GREY = "#707070"


def write_png(series: ChartSeries, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(series.buckets)
    x = list(range(n))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(9.0, min(22.0, 0.35 * n + 6)), 7.5), sharex=True)
    palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    colors: dict[str, Any] = {}
    for i, team in enumerate(t for t in series.teams if t not in (OTHER, TEAM_UNALLOCATED)):
        colors[team] = palette[i % len(palette)]
    colors[OTHER], colors[TEAM_UNALLOCATED] = _OTHER_GREY, _GREY
    for ax, values, what in ((top, series.held, "held"), (bottom, series.busy, "busy")):
        base = [0.0] * n
        for team in series.teams:
            if team == TEAM_UNALLOCATED and what == "busy":
                continue
            heights = list(values[team])
            label = "unallocated (no workload)" if team == TEAM_UNALLOCATED else team
            hatch = "//" if team == TEAM_UNALLOCATED else None
            ax.bar(x, heights, bottom=base, color=colors[team], label=label, width=0.8, hatch=hatch, edgecolor="white")
            base = [b + h for b, h in zip(base, heights, strict=True)]
        ax.set_ylabel(f"GPU-hours {what}")
        ax.grid(axis="y", alpha=0.3)
    peak = max([sum(series.held[t][i] for t in series.teams) for i in range(n)] or [1.0])
    top.set_ylim(0, peak * 1.08 or 1.0)
    bottom.set_ylim(0, peak * 1.08 or 1.0)
    top.set_title(series.title, fontsize=10)
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    step = max(1, n // 16)
    fmt = "%m-%d %H:00" if series.hourly else "%a %m-%d"
    bottom.set_xticks(x[::step], [b.strftime(fmt) for b in series.buckets][::step], rotation=45, ha="right")
    bottom.set_xlabel("UTC hour" if series.hourly else "UTC day")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
