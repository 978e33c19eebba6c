"""Both Alibaba formats are read by header, with the traces' NaN semantics; the generator is seeded."""

from __future__ import annotations

import io
import random

import pytest

from gpufleet_tools.replay.model import TraceFormat
from gpufleet_tools.replay.traces import TraceError, bursty_trace, detect_format, parse_trace, to_v2023_csv


def test_dlrm_rows_become_one_gpu_pods_with_nan_semantics(dlrm_csv: str) -> None:
    trace = parse_trace(io.StringIO(dlrm_csv), "dlrm.csv")
    assert trace.format is TraceFormat.DLRM_V2025
    assert trace.skipped == 1  # the CPU node (role CN, gpu_request 0)
    pods = {p.name: p for p in trace.pods}
    assert pods["instance_0"].arrival == 0 and pods["instance_0"].duration is None  # before and after the trace
    assert pods["instance_1"].duration == 120  # existed before the trace, deleted at 2 h
    assert pods["instance_3"].arrival == 10 and pods["instance_3"].duration == 60  # ran 660 s -> 4260 s
    assert pods["instance_4"].arrival == 0 and pods["instance_4"].duration is None  # literal NaN
    assert all(p.gpus == 1 and p.whole for p in trace.pods)
    assert trace.horizon == 7200 // 60 + 1  # the latest time in the file


def test_v2023_rows_keep_whole_gpus_and_shares(v2023_csv: str) -> None:
    trace = parse_trace(io.StringIO(v2023_csv), "pods.csv")
    assert trace.format is TraceFormat.PODS_V2023
    assert trace.skipped == 1  # num_gpu 0
    pods = {p.name: p for p in trace.pods}
    assert pods["openb-pod-0001"].milli == 500 and not pods["openb-pod-0001"].whole
    assert pods["openb-pod-0001"].demand_milli == 500
    assert pods["openb-pod-0003"].gpus == 8 and pods["openb-pod-0003"].duration == 120
    assert pods["openb-pod-0004"].duration is None and pods["openb-pod-0004"].gpus == 2
    assert [p.arrival for p in trace.pods] == sorted(p.arrival for p in trace.pods)


def test_an_unknown_header_is_refused_with_both_formats_named() -> None:
    with pytest.raises(TraceError, match=r"v2025 DLRM.*v2023"):
        detect_format(["a", "b"])


def test_an_unreadable_row_names_its_line(v2023_csv: str) -> None:
    bad = v2023_csv + "openb-pod-x,1,1,one,1000,,BE,Running,0,,0\n"
    with pytest.raises(TraceError, match=r"pods.csv:7"):
        parse_trace(io.StringIO(bad), "pods.csv")


def test_the_synthetic_workload_is_seeded_and_round_trips_through_v2023() -> None:
    a, b = bursty_trace(random.Random(13), days=2), bursty_trace(random.Random(13), days=2)
    assert a == b
    assert a != bursty_trace(random.Random(14), days=2)
    assert {p.gpus for p in a.pods} >= {1, 2, 4, 8} and any(not p.whole for p in a.pods)
    again = parse_trace(io.StringIO(to_v2023_csv(a)), "synthetic.csv")
    assert [(p.arrival, p.duration, p.gpus, p.milli) for p in again.pods] == [
        (p.arrival, p.duration, p.gpus, p.milli) for p in a.pods
    ]


def test_the_training_cluster_workload_is_seeded_and_shaped_as_documented() -> None:
    """Same seed, same week; mostly 1-GPU jobs, gangs of 8-GPU pods arriving together, fewer submissions
    at the weekend, and a sweep of 1-GPU trials each weekday."""
    from gpufleet_tools.replay.traces import training_trace

    a, b = training_trace(random.Random(13), days=7), training_trace(random.Random(13), days=7)
    assert a == b and a.horizon == 7 * 1440
    jobs = [p for p in a.pods if p.name.startswith("job-")]
    gangs: dict[str, list[int]] = {}
    for p in jobs:
        gangs.setdefault(p.name.rsplit("-", 1)[0], []).append(p.arrival)
    sizes = [len(v) for v in gangs.values()]
    assert sum(1 for s in sizes if s == 1) / len(sizes) > 0.85  # gangs are a few percent of jobs
    assert {2, 4} <= set(sizes) and all(len(set(v)) == 1 for v in gangs.values())  # a gang arrives at once
    assert all(p.gpus == 8 for v, p in ((gangs[p.name.rsplit("-", 1)[0]], p) for p in jobs) if len(v) > 1)
    weekday = sum(1 for p in jobs if p.arrival < 5 * 1440) / 5
    weekend = sum(1 for p in jobs if p.arrival >= 5 * 1440) / 2
    assert weekend < weekday / 2
    sweeps = {p.name.split("-")[1] for p in a.pods if p.name.startswith("sweep-")}
    assert sweeps == {"0", "1", "2", "3", "4"}
