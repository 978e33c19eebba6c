"""One reader per demand source, registered once under the policy's name for it, in the order a tick
reads them (pods, then queues, then metrics)."""

from __future__ import annotations

from gpufleet.domain.demand_sources import SourceName
from gpufleet.scaling.demand_source import READERS


def test_every_source_has_one_reader_in_the_order_a_tick_reads_them() -> None:
    assert list(READERS) == list(SourceName) == ["kubernetes", "sqs", "metric"]
