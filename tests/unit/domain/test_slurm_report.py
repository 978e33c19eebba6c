"""Slurm's idle report, the pure rules (domain.slurm_report): a node is idle only on the newest landed
report's word, every datum saying 1, at most one older minute missing; a stale report calls none idle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.domain.slurm_report import idle_nodes

NOW = datetime(2026, 11, 23, 8, 12, 30, tzinfo=UTC)


def _at(*offsets: int, value: float = 1.0) -> dict[datetime, float]:
    end = NOW.replace(second=0)
    return {end + timedelta(minutes=k): value for k in offsets}


WHOLE = (-6, -5, -4, -3, -2, -1)  # the group's report landed each whole minute, not yet in the current one
WITH_CURRENT = (*WHOLE, 0)  # ... and in the current one too

# A node's IdleNode minutes (offsets from the current minute: -1 the newest whole one), the minutes the
# group's report landed -> idle?
WINDOWS = [
    (_at(-5, -4, -3, -2, -1), WHOLE, True),
    (_at(-4, -3, -2, -1), WHOLE, True),  # the oldest missing: forgiven
    (_at(-5, -4, -2, -1), WHOLE, True),  # an older gap: forgiven
    (_at(-5, -4, -3, -2), WHOLE, False),  # the newest landed report left it out: a job took the node
    (_at(-3, -2, -1), WHOLE, False),  # two missing
    (_at(-5, -4, -3, -2, -1, 0), WHOLE, True),  # the current minute said idle too (its report not in yet)
    ({**_at(-5, -4, -3, -2, -1), **_at(0, value=0.0)}, WHOLE, False),  # the current minute said busy
    ({**_at(-5, -4, -3, -2, -1), **_at(-3, value=2.0)}, WHOLE, False),  # a datum that is not 1
    (_at(-5, -4, -3, -2, -1, value=float("nan")), WHOLE, False),
    ({}, WHOLE, False),
    # The probe's regression: the current minute's report landed without the node (Slurm: allocated), its
    # older minutes said idle - busy, whatever those say.
    (_at(-5, -4, -3, -2, -1), WITH_CURRENT, False),
    (_at(-4, -3, -2, -1, 0), WITH_CURRENT, True),  # the window ends at the current minute's report
    (_at(-3, -2, -1, 0), WITH_CURRENT, True),  # one older missing, counted back from there
    (_at(-3, -1, 0), WITH_CURRENT, False),  # two older missing
    (_at(-5, -4, -3, -2, -1), (-6, -5, -4, -3), False),  # no report in the current or previous minute: stale
    (_at(-5, -4, -3, -2, -1), (), False),  # the publisher never reported
    (_at(-5, -4, -3, -2, -1), (1,), False),  # a minute after the current one (a skewed clock) is not a report
]


@pytest.mark.parametrize(("series", "landed", "idle"), WINDOWS)
def test_idle_needs_the_newest_landed_report_and_every_datum_saying_one(
    series: dict[datetime, float], landed: tuple[int, ...], idle: bool
) -> None:
    reports = set(_at(*landed))
    assert (idle_nodes({"n": series}, reports, NOW.replace(second=0)) == {"n"}) is idle
