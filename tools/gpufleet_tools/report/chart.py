"""The report's PNG (matplotlib, Agg: no display needed): GPU-hours per team per day (per hour for a
period under two days), allocated above and busy below on the same scale, so the gap between the two
panels is the idle time the teams paid for.

A bucket the period covers only in part (the hour the period ends in, the day `--since 7d` starts in) is
drawn as the part it is: as wide as the share it covers and as tall as its rate per whole bucket
(ChartSeries.bar and .rate), hatched and labelled. Its area is still its GPU-hours, and the usage does
not seem to halve at the end of the period; a full-width bar of its GPU-hours did both wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufleet_node.schema import TEAM_UNALLOCATED
from gpufleet_tools.report.render import OTHER, ChartSeries

_GREY = "#b0b0b0"
_OTHER_GREY = "#707070"


def _stack(ax: Any, series: ChartSeries, values: dict[str, tuple[float, ...]], colors: dict[str, Any]) -> None:
    """One panel: each team's rate per bucket, stacked, on bars as wide as each bucket's covered part."""
    spans = [series.bar(i) for i in range(len(series.buckets))]
    base = [0.0] * len(spans)
    for team in (t for t in series.teams if t in values):
        heights = series.rate(values[team])
        bars = ax.bar([s[0] for s in spans], heights, bottom=base, width=[s[1] for s in spans], align="edge",
                      color=colors[team], edgecolor="white")  # fmt: skip
        for i, patch in enumerate(bars.patches):
            hatch = ("//" if team == TEAM_UNALLOCATED else "") + (".." if series.partial(i) else "")
            patch.set_hatch(hatch or None)
        base = [b + h for b, h in zip(base, heights, strict=True)]


def _legend(ax: Any, series: ChartSeries, colors: dict[str, Any]) -> None:
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=colors[t], edgecolor="white", hatch="//" if t == TEAM_UNALLOCATED else None,
              label="unallocated (no workload)" if t == TEAM_UNALLOCATED else t)
        for t in series.teams
    ]  # fmt: skip
    if any(series.partial(i) for i in range(len(series.buckets))):
        part = f"part of {'an hour' if series.hourly else 'a day'}, at its rate"
        handles.append(Patch(facecolor="white", edgecolor=_OTHER_GREY, hatch="..", label=part))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


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
    per = "hour" if series.hourly else "day"
    busy = {t: v for t, v in series.busy.items() if t != TEAM_UNALLOCATED}
    for ax, values, what in ((top, series.held, "held"), (bottom, busy, "busy")):
        _stack(ax, series, values, colors)
        ax.set_ylabel(f"GPU-hours {what} per {per}")
        ax.grid(axis="y", alpha=0.3)
    stacks = [sum(series.rate(series.held[t])[i] for t in series.teams) for i in x]
    peak = max(stacks or [1.0])
    for i in (i for i in x if series.partial(i)):
        left, width = series.bar(i)
        whole = 60 if series.hourly else 24
        note = f"partial: {series.covered(i) * whole:.0f} of {whole} {'min' if series.hourly else 'h'},\nat its rate"
        top.annotate(note, (left + width / 2, stacks[i]), ha="center", va="bottom", fontsize=7)
    top.set_ylim(0, peak * 1.15 or 1.0)
    bottom.set_ylim(0, peak * 1.15 or 1.0)
    top.set_title(series.title, fontsize=10)
    _legend(top, series, colors)
    step = max(1, n // 16)
    fmt = "%m-%d %H:00" if series.hourly else "%a %m-%d"
    bottom.set_xticks(x[::step], [b.strftime(fmt) for b in series.buckets][::step], rotation=45, ha="right")
    bottom.set_xlabel("UTC hour" if series.hourly else "UTC day")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
