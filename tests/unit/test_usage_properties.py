"""Properties of the node's usage windows (gpufleet_node.usage), for any samples: time is conserved per
GPU, and no row is busier or idler than the time it held the GPU (what `gpufleet report` relies on)."""

from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from gpufleet_node.usage import Holder, UsageWindow
from gpufleet_node.workload import POD, Workload

PODS = [Workload(POD, namespace=f"team-{i % 2}", pod=f"p{i}", container="c") for i in range(4)]
holder = st.builds(
    Holder,
    st.sampled_from(PODS),
    st.floats(0, 80_000),
    st.one_of(st.none(), st.floats(0, 100)),
    st.integers(0, 3),
)
sample = st.tuples(
    st.integers(0, 3),
    st.floats(0.1, 60),
    st.one_of(st.none(), st.floats(0, 100)),
    st.lists(holder, max_size=3, unique_by=lambda h: h.workload.key),
)


@given(st.lists(sample, max_size=40))
def test_time_is_conserved_and_busy_and_idle_stay_within_held(samples):
    window = UsageWindow(datetime(2026, 11, 23, tzinfo=UTC), 300, 4)
    per_gpu: dict[int, float] = {}
    for gpu, dt, util, holders in samples:
        window.add(gpu, dt, util, holders)
        per_gpu[gpu] = per_gpu.get(gpu, 0.0) + dt
    held: dict[int, float] = {}
    for (gpu, _), row in window.rows.items():
        held[gpu] = held.get(gpu, 0.0) + row.held_s
        assert row.busy_s <= row.held_s + 1e-6
        assert row.idle_s <= row.held_s + 1e-6
        assert row.busy_s >= 0 and row.idle_s >= 0
    assert held.keys() == per_gpu.keys()
    for gpu, seconds in per_gpu.items():
        assert abs(held[gpu] - seconds) < 1e-6 * max(1.0, seconds)
    record = window.record("i-0", "g5.12xlarge", None)
    assert len(record["u"]) == len(window.rows)
