"""How a CloudWatch series read as several statistics becomes one summary: shared by the metrics adapter
(which reads the statistics) and the scaler's trust check (which weighs the summaries)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpufleet.domain.models import SeriesStats


def combine(name: str, points: Mapping[str, Sequence[float]]) -> SeriesStats:
    """One series' per-period SampleCount, Sum, Maximum and Minimum over the lookback as one summary."""
    counts, sums = points.get("SampleCount", ()), points.get("Sum", ())
    highs, lows = points.get("Maximum", ()), points.get("Minimum", ())
    return SeriesStats(
        name=name,
        samples=float(sum(counts)),
        busiest_minute=float(max(counts, default=0.0)),
        total=float(sum(sums)) if sums else None,
        maximum=max(highs) if highs else None,
        minimum=min(lows) if lows else None,
    )
