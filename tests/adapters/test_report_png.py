"""The report's PNG is drawn from the chart's spans (gpufleet_tools.report.chart, glue: matplotlib). The
spans themselves, a partial hour drawn as its part: tests/unit/test_report_render.py."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from gpufleet_tools.report.chart import write_png
from gpufleet_tools.report.model import Period
from gpufleet_tools.report.render import chart_series
from tests.unit.test_report_usage import DAY0, report_of, windows


def test_the_png_is_drawn_from_those_spans(tmp_path: Path) -> None:
    period = Period(DAY0, DAY0 + timedelta(hours=2, minutes=30))
    png = tmp_path / "usage.png"
    write_png(chart_series(report_of(windows(2.5), period=period)), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
