"""Host memory in the OOM guard, on the pure core: forecast like a GPU's memory (table), and a host's key
never counts as GPU pressure. Screened, confirmed, told and resolved through CloudWatch:
tests/adapters/guard/test_host_memory.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpufleet.guard.core import HOST_INDEX, GpuRef, Risk, forecast_host, group_pressure, instance_of
from gpufleet.policy.guard import OomSettings

SCREEN = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)  # a host-screening run (a new container's first)
MINUTES = 15
HOST = GpuRef(group="asg:train", instance_id="i-leak", gpu_index=HOST_INDEX)


def series(values: list[float], now: datetime = SCREEN) -> list[tuple[datetime, float]]:
    return [(now - timedelta(minutes=len(values) - 1 - m), v) for m, v in enumerate(values)]


@pytest.mark.parametrize(
    ("values", "risk", "words"),
    [
        ([50.0] * MINUTES, Risk.OK, "50.0% used"),
        ([91.0] * MINUTES, Risk.WARNING, "91.0% used"),
        ([98.0] * MINUTES, Risk.CRITICAL, "98.0% used"),
        ([60.0 + 1.5 * m for m in range(MINUTES)], Risk.WARNING, "full in ~"),  # 81 % now, 1.5 %/min: ~13 min
        ([70.0 + 2 * m for m in range(MINUTES)], Risk.CRITICAL, "rising 2.00 %/min"),  # 98 %, and ~1 min
        ([], Risk.OK, "no recent reading of its own"),
    ],
)
def test_forecast_host_like_gpu_memory(values: list[float], risk: Risk, words: str) -> None:
    f = forecast_host(HOST, series(values), SCREEN, OomSettings())
    assert f.risk is risk
    assert words in f.reason and f.reason.startswith("host memory")


def test_host_keys_round_trip_and_never_count_as_gpu_pressure() -> None:
    assert HOST.key == "i-leak/host" and GpuRef.parse_key("asg:train", HOST.key) == HOST
    assert instance_of("i-leak/host") == "i-leak" == instance_of("i-leak/gpu3")
    at_risk = forecast_host(HOST, series([95.0] * MINUTES), SCREEN, OomSettings())
    assert group_pressure([at_risk], {"asg:train": 1}, OomSettings(pressure_share=0.1)) == {}
