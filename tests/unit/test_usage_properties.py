"""Properties of the node's usage windows (gpufleet_node.usage), for any samples: time is conserved per
GPU, and no row is busier or idler than the time it held the GPU (what `gpufleet report` relies on); and
the report never flags what an honest node writes, whole or split in parts."""

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet_node.usage import Holder, UsageWindow, split_record
from gpufleet_node.workload import POD, Workload
from gpufleet_tools.report.bounds import RESENT, Ledger, check, claimed
from gpufleet_tools.report.identity import identify
from gpufleet_tools.report.prices import PriceBook
from gpufleet_tools.report.records import RecordParser, UsageRecord
from tests.profiles import examples

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


# The report's side (issue 29): whatever an honest node writes passes the report's bounds, split or not.
window_samples = st.lists(
    st.tuples(
        st.integers(0, 3),
        st.one_of(st.none(), st.floats(0, 100)),
        st.lists(holder, max_size=3, unique_by=lambda h: h.workload.key),
    ),
    max_size=30,
)


@settings(max_examples=examples(40), deadline=None)
@given(window_samples, st.integers(60, 4000), st.sampled_from([60, 300]), st.floats(0, 1.0), st.integers(0, 30))
def test_an_honest_nodes_record_is_never_flagged_split_or_not(samples, max_bytes, window_s, reach_s, restart_at):
    """Each GPU sampled for at most the window (30 samples), its first sample reaching up to one sample
    interval (1 s) before the window's start; the publisher restarted after `restart_at` samples (two
    records of the window). Every part the node writes is within the report's bounds, and the parts of
    the window fit it together: all count (identical content twice would be a resend, counted once)."""
    start = datetime(2026, 11, 23, 10, 5, tzinfo=UTC)
    windows = [UsageWindow(start, window_s, 4), UsageWindow(start, window_s, 4)]
    sampled: set[int] = set()
    for i, (gpu, util, holders) in enumerate(samples):
        windows[i >= restart_at].add(gpu, window_s / 30 + (0.0 if gpu in sampled else reach_s), util, holders)
        sampled.add(gpu)
    book, parser = PriceBook(), RecordParser(identify)
    ledger = Ledger(86400, int(start.timestamp()) // 86400 * 86400)
    stamp, judged = int(start.timestamp() * 1000), []
    for window in windows:
        if not window.rows:
            continue  # the publisher writes no record of a window without rows
        for text in split_record(window.record("i-0node", "g5.12xlarge", "asg:train"), max_bytes):
            parsed = parser.parse(text, "i-0node", stamp)
            assert isinstance(parsed, UsageRecord)
            gpus = book.gpus(parsed.instance_type, parsed.group)
            assert check(parsed, gpus, claimed(parsed)) is None
            judged += ledger.admit(parsed, gpus)
    judged += ledger.flush()
    assert all(verdict is None or verdict is RESENT for _, verdict in judged)
