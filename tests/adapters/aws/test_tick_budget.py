"""Every cluster of one tick shares one budget (found by the probe of issue 28: 4 slow clusters x 30 s each
filled the scaler's 120 s and no group was decided). Clock injected: nothing here is timed."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.kubernetes.cluster import TickBudget


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_each_cluster_gets_what_the_tick_has_left_and_none_once_it_is_spent() -> None:
    clock = Clock()
    budget = TickBudget(60.0, clock)
    budget.start()
    assert budget.for_cluster("a") == 60.0
    clock.t += 30  # cluster a took its 30 s
    assert budget.for_cluster("b") == 30.0
    clock.t += 29.5
    with pytest.raises(ClusterUnreadable) as caught:
        budget.for_cluster("c")
    assert caught.value.kind == "timeout" and "60 s for reading clusters is spent" in caught.value.cause
    budget.start()  # the next tick starts afresh
    assert budget.for_cluster("c") == 60.0
