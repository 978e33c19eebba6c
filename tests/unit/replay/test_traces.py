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


# ---- hostile input the fuzzer found (tests/unit/test_fuzz_inputs.py): TraceError in one line ----

V2023_ROW = "p,1,1,{num_gpu},{gpu_milli},,BE,Running,{created},{deleted},{scheduled}\n"
V2023_GOOD = {"num_gpu": "1", "gpu_milli": "1000", "created": "0", "deleted": "", "scheduled": "0"}


def _v2023(v2023_csv: str, **cells: str) -> str:
    return v2023_csv + V2023_ROW.format(**{**V2023_GOOD, **cells})


def _refused(text: str, source: str = "pods.csv") -> str:
    with pytest.raises(TraceError) as raised:
        parse_trace(io.StringIO(text), source)
    message = str(raised.value)
    assert "\n" not in message and len(message) < 300
    return message


HOSTILE = ["inf", "-inf", "1e400", "9" * 5000]  # float() reads each as an infinity


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(
    ("cell", "column"),
    [
        ("num_gpu", "num_gpu"),
        ("gpu_milli", "gpu_milli"),
        ("created", "creation_time"),
        ("scheduled", "scheduled_time"),
        ("deleted", "deletion_time"),
    ],
)
def test_a_number_no_float_can_hold_is_refused_naming_line_and_column(
    v2023_csv: str, cell: str, column: str, value: str
) -> None:
    message = _refused(_v2023(v2023_csv, **{cell: value}))
    assert message.startswith(f"pods.csv:7: {column} ")


@pytest.mark.parametrize("column", ["num_gpu", "gpu_milli"])
def test_a_nan_gpu_count_is_refused_naming_its_column(v2023_csv: str, column: str) -> None:
    """NaN means 'before/after the trace' only in a time column."""
    assert _refused(_v2023(v2023_csv, **{column: "nan"})).startswith(f"pods.csv:7: {column} ")


@pytest.mark.parametrize("value", [*HOSTILE, "nan"])
def test_a_dlrm_gpu_request_no_float_can_hold_is_refused(dlrm_csv: str, value: str) -> None:
    row = f"instance_9,HN,app_0,12,12,{value},1,25,25,120.0,120.0,640.0,800.0,8,0,0,60\n"
    assert _refused(dlrm_csv + row, "dlrm.csv").startswith("dlrm.csv:7: gpu_request ")


def test_the_fuzzer_s_row_is_refused(v2023_csv: str) -> None:
    assert _refused(v2023_csv + "p,1,1,inf,1000,,BE,Running,0,,0\n").startswith("pods.csv:7: num_gpu ")


@pytest.mark.parametrize("column", ["created", "scheduled", "deleted"])
def test_a_time_past_any_trace_is_refused_as_not_seconds_from_the_trace_start(v2023_csv: str, column: str) -> None:
    """Epoch or millisecond times would make a replay of decades, minute by minute; 1.7e308 apart, two
    times would overflow the run time's arithmetic."""
    for value in ("1700000000", "1.7e308"):
        message = _refused(_v2023(v2023_csv, **{column: value}))
        assert "_time " in message and "seconds from the trace start" in message


def test_a_negative_creation_time_is_refused_in_one_line(v2023_csv: str) -> None:
    assert "creation_time" in _refused(_v2023(v2023_csv, created="-1"))


def test_a_dlrm_request_below_a_thousandth_is_the_smallest_share(dlrm_csv: str) -> None:
    row = "instance_9,HN,app_0,12,12,0.0001,1,25,25,120.0,120.0,640.0,800.0,8,0,0,60\n"
    pods = {p.name: p for p in parse_trace(io.StringIO(dlrm_csv + row), "dlrm.csv").pods}
    assert pods["instance_9"].milli == 1


def test_a_trace_that_is_not_utf8_is_refused_naming_the_file(v2023_csv: str) -> None:
    raw = (v2023_csv + "p\xe9,1,1,1,1000,,BE,Running,0,,0\n").encode("latin-1")
    lines = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8", newline="")  # as `gpufleet replay` opens it
    with pytest.raises(TraceError) as raised:
        parse_trace(lines, "pods.csv")
    assert str(raised.value).startswith("pods.csv: ") and "UTF-8" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_header_that_is_not_utf8_is_refused_naming_the_file() -> None:
    lines = io.TextIOWrapper(io.BytesIO(b"na\xffme,num_gpu\n"), encoding="utf-8", newline="")
    with pytest.raises(TraceError, match=r"^pods.csv: .*UTF-8"):
        parse_trace(lines, "pods.csv")


def test_a_field_beyond_the_csv_limit_is_refused(v2023_csv: str) -> None:
    message = _refused(v2023_csv + '"' + "x" * 200_000 + '",1,1,1,1000,,BE,Running,0,,0\n')
    assert message.startswith("pods.csv:")
