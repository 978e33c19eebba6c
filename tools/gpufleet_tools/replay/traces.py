"""Workload traces: the public Alibaba GPU formats (detected by their header) and a seeded bursty
synthetic batch workload. Pure: lines in, a `Trace` out; the caller opens files and owns the rng.

Both Alibaba formats give creation, scheduled and deletion times in seconds from the trace start. A pod
arrives at its creation time (empty/NaN: it existed before the trace, so it arrives at 0) and, once our
scheduler starts it, runs for as long as it ran in the real cluster: deletion - scheduled (or - creation
when it was never scheduled); an empty/NaN deletion means it outlived the trace.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from gpufleet_tools.replay.model import MILLI_PER_GPU, NeverFit, Pod, Trace, TraceFormat

DLRM_COLUMNS = frozenset({"instance_sn", "role", "gpu_request", "creation_time", "scheduled_time", "deletion_time"})
V2023_COLUMNS = frozenset({"name", "num_gpu", "gpu_milli", "creation_time", "scheduled_time", "deletion_time"})
V2023_HEADER = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


class TraceError(ValueError):
    """The file is not one of the formats the replay reads, or a row is unreadable."""


class Rng(Protocol):
    """What the synthetic generator needs from `random.Random` (passed in, seeded by the caller)."""

    def random(self) -> float: ...

    def expovariate(self, lambd: float) -> float: ...

    def lognormvariate(self, mu: float, sigma: float) -> float: ...

    def randint(self, a: int, b: int) -> int: ...


TIME_COLUMNS = ("creation_time", "scheduled_time", "deletion_time")
MAX_TRACE_S = 10 * 366 * 86400  # past this a time is epoch seconds or milliseconds, not from the trace start
Times = tuple[float | None, float | None, float | None]


def _float(row: dict[str, str | None], column: str) -> float | None:
    """A cell as a float, None when empty. float() reads 'inf', '1e400' and 5,000 nines as infinities,
    which no count or time can be: refused here, not by an OverflowError in int() or math.ceil()."""
    raw = row[column]
    if raw is None or not raw.strip():
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{column} {raw!r:.40} is not a number") from None
    if math.isinf(value):
        raise ValueError(f"{column} {raw!r:.40} is not a finite number")
    return value


def _amount(row: dict[str, str | None], column: str) -> float:
    """A GPU count or share: empty is none; NaN means 'before/after the trace' only in a time column."""
    value = _float(row, column)
    if value is not None and math.isnan(value):
        raise ValueError(f"{column} {row[column]!r:.40} is not a number")
    return value or 0.0


def _time(row: dict[str, str | None], column: str) -> float | None:
    """Seconds from the trace start; None when empty or NaN (docs/replay.md: 'before/after the trace').
    Bounded, so no time makes a replay of decades and no difference of two overflows."""
    value = _float(row, column)
    if value is None or math.isnan(value):
        return None
    if not 0 <= value <= MAX_TRACE_S:
        raise ValueError(f"{column} {row[column]!r:.40} is not seconds from the trace start (0 to {MAX_TRACE_S})")
    return value


def _pod(name: str, times: Times, gpus: int, milli: int) -> Pod:
    created, scheduled, deleted = times
    arrival_s = created or 0.0
    started_s = scheduled if scheduled is not None else arrival_s
    duration = None if deleted is None else max(1, math.ceil((deleted - started_s) / 60))
    return Pod(name=name, arrival=int(arrival_s // 60), duration=duration, gpus=gpus, milli=milli)


def detect_format(header: Iterable[str]) -> TraceFormat:
    columns = {c.strip() for c in header}
    if columns >= DLRM_COLUMNS:
        return TraceFormat.DLRM_V2025
    if columns >= V2023_COLUMNS:
        return TraceFormat.PODS_V2023
    raise TraceError(
        "unknown trace format: expected the Alibaba GPU v2025 DLRM instance list "
        f"({', '.join(sorted(DLRM_COLUMNS))}) or the v2023 pod list ({', '.join(sorted(V2023_COLUMNS))}); "
        f"got columns {', '.join(sorted(columns)) or '(none)'}"
    )


def _row_pod(fmt: TraceFormat, row: dict[str, str | None], times: Times) -> Pod | None:
    """The pod a row describes, or None when it asks for no GPU."""
    if fmt is TraceFormat.DLRM_V2025:
        request = _amount(row, "gpu_request")
        name = row["instance_sn"] or ""
        if request <= 0:
            return None
        if request < 1:  # a share: at least a thousandth of a GPU, however small the request
            return _pod(name, times, 1, max(1, round(request * MILLI_PER_GPU)))
        return _pod(name, times, math.ceil(request), MILLI_PER_GPU)
    gpus = int(_amount(row, "num_gpu"))
    milli = int(_amount(row, "gpu_milli"))
    if gpus <= 0:
        return None
    share = gpus == 1 and 0 < milli < MILLI_PER_GPU
    return _pod(row["name"] or "", times, gpus, milli if share else MILLI_PER_GPU)


@contextmanager
def _readable(reader: csv.DictReader[str], source: str) -> Iterator[None]:
    """A file that is not UTF-8 text or not CSV is a TraceError, not the codec's or csv's traceback. The
    codec decodes ahead of the rows read, so a bad byte's line is only known to be past the last read."""
    try:
        yield
    except UnicodeDecodeError as exc:
        raise TraceError(
            f"{source}: not UTF-8 text (byte {exc.object[exc.start]:#04x} after line {reader.line_num}); "
            "save the trace as UTF-8"
        ) from None
    except csv.Error as exc:
        raise TraceError(f"{source}:{reader.line_num}: unreadable CSV ({exc})") from None


def parse_trace(lines: Iterable[str], source: str = "trace") -> Trace:
    """Read either Alibaba format; the header decides which. Rows without a GPU request are counted, not
    replayed (the DLRM CPU nodes, CPU-only pods). A bad row is a TraceError naming its line and column."""
    reader = csv.DictReader(lines)
    pods: list[Pod] = []
    skipped = 0
    last_s = 0.0
    with _readable(reader, source):
        fmt = detect_format(reader.fieldnames or ())
        for row in reader:
            try:
                times: Times = (_time(row, TIME_COLUMNS[0]), _time(row, TIME_COLUMNS[1]), _time(row, TIME_COLUMNS[2]))
                pod = _row_pod(fmt, row, times)
            except (KeyError, ValueError, TypeError) as exc:
                why = " ".join(str(exc).split())  # one line, whatever raised it
                raise TraceError(f"{source}:{reader.line_num}: {why}") from None
            last_s = max([last_s, *(s for s in times if s is not None)])
            if pod is None:
                skipped += 1
            else:
                pods.append(pod)
    pods.sort(key=lambda p: p.arrival)
    horizon = max(math.ceil(last_s / 60) + 1, max((p.arrival + 1 for p in pods), default=1))
    return Trace(format=fmt, source=source, pods=tuple(pods), horizon=horizon, skipped=skipped)


def fitting(pods: Sequence[Pod], horizon: int, gpus_per_node: int) -> tuple[list[Pod], NeverFit]:
    """The pods a node of `gpus_per_node` GPUs can hold, and the count and GPU-hours of those it cannot.
    A pod asks for its GPUs on one node (a share of one GPU always fits), so one bigger than a node waits
    forever under every policy: every run leaves it out alike and the report says so."""
    fit: list[Pod] = []
    count, gpu_minutes = 0, 0
    for p in pods:
        if p.gpus <= gpus_per_node:
            fit.append(p)
            continue
        count += 1
        ran = horizon - p.arrival if p.duration is None else min(p.duration, horizon - p.arrival)
        gpu_minutes += p.gpus * max(ran, 0)
    return fit, NeverFit(gpus_per_node=gpus_per_node, pods=count, gpu_hours=round(gpu_minutes / 60, 2))


def to_v2023_csv(trace: Trace) -> str:
    """A trace written in the v2023 pod-list format (how the synthetic workload is saved and re-read)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(V2023_HEADER)
    for p in trace.pods:
        created = p.arrival * 60
        deleted = "" if p.duration is None else str(created + p.duration * 60)
        milli = p.milli if not p.whole else MILLI_PER_GPU
        row = (p.name, 8000, 32768, p.gpus, milli, "", "BE", "Succeeded", created, deleted, created)
        writer.writerow(row)
    return out.getvalue()


# ---- the synthetic bursty batch workload ----

SERVICES = 16  # long-running 1-GPU inference pods, present all along
NIGHT_RATE, DAY_RATE = 0.05, 0.25  # background job arrivals per minute (night 20-08 h, day 08-20 h)
BURSTS_PER_DAY = (2, 4)  # e.g. hyper-parameter sweeps or a team's nightly batch, between 08 and 22 h
BURST_JOBS_MIN, BURST_JOBS_MEAN_EXTRA, BURST_SPREAD_MIN = 20, 40, 15
MEDIAN_MINUTES, SIGMA, MAX_MINUTES = 45.0, 1.0, 16 * 60


def _job_shape(rng: Rng) -> tuple[int, int]:
    """(gpus, milli): 45 % 1 GPU, 20 % 2, 20 % 4, 10 % 8, 5 % a quarter or half of one GPU."""
    x = rng.random()
    for limit, gpus in ((0.45, 1), (0.65, 2), (0.85, 4), (0.95, 8)):
        if x < limit:
            return gpus, MILLI_PER_GPU
    return 1, 250 if rng.random() < 0.5 else 500


def _job(rng: Rng, name: str, arrival: int) -> Pod:
    gpus, milli = _job_shape(rng)
    minutes = min(MAX_MINUTES, max(2, int(rng.lognormvariate(math.log(MEDIAN_MINUTES), SIGMA))))
    return Pod(name=name, arrival=arrival, duration=minutes, gpus=gpus, milli=milli)


def bursty_trace(rng: Rng, days: int = 7) -> Trace:
    """A bursty batch workload: a few long-running services, a day/night background of jobs and 2-4
    bursts a day of 20+ jobs each (1-8 GPUs or a GPU share, log-normal run times, median 45 min).

    Seeded by the caller's rng, so `random.Random(13)` gives the same trace on every machine."""
    horizon = days * 1440
    pods = [Pod(name=f"svc-{i}", arrival=0, duration=None) for i in range(SERVICES)]
    t = 0.0
    while True:
        hour = int(t // 60) % 24
        t += rng.expovariate(DAY_RATE if 8 <= hour < 20 else NIGHT_RATE)
        if t >= horizon:
            break
        pods.append(_job(rng, f"job-{len(pods)}", int(t)))
    for day in range(days):
        for _ in range(rng.randint(*BURSTS_PER_DAY)):
            start = day * 1440 + rng.randint(8 * 60, 22 * 60)
            for _ in range(BURST_JOBS_MIN + int(rng.expovariate(1 / BURST_JOBS_MEAN_EXTRA))):
                arrival = min(horizon - 1, start + rng.randint(0, BURST_SPREAD_MIN))
                pods.append(_job(rng, f"burst-{len(pods)}", arrival))
    pods.sort(key=lambda p: p.arrival)
    return Trace(
        format=TraceFormat.SYNTHETIC, source=f"synthetic bursty, {days} days", pods=tuple(pods), horizon=horizon
    )


# ---- the synthetic training-cluster workload ----
# A second, documented workload with another shape than the bursty one (no public job trace beyond the
# DLRM list can be read here: shared/ holds only that one, and nothing is fetched at run time). Its
# shape follows what published characterisations of shared deep-learning clusters report in words
# (Microsoft Philly, ATC'19; SenseTime Helios, SC'21): most jobs take one GPU and are short (debugging,
# sweeps), while most GPU time goes to few large multi-node jobs that run for hours to days; submissions
# follow the working day and drop at weekends. The numbers below are ours, not those traces'.

TRAIN_WEEKDAY_RATE, TRAIN_OFF_RATE = 0.12, 0.03  # job arrivals per minute: weekdays 09-19 h, otherwise
TRAIN_SHAPES = ((0.60, 1), (0.70, 2), (0.80, 4), (0.92, 8), (0.97, 16), (1.00, 32))  # cumulative share, GPUs
TRAIN_SMALL_MEDIAN, TRAIN_LARGE_MEDIAN, TRAIN_SIGMA = 20.0, 240.0, 1.2  # minutes: <= 4 GPUs / 8 GPUs and more
TRAIN_MAX_MINUTES = 48 * 60
SWEEP_JOBS, SWEEP_MEDIAN = (30, 60), 90.0  # one hyper-parameter sweep each weekday: 1-GPU trials


def _training_job(rng: Rng, name: str, arrival: int) -> list[Pod]:
    """One job: its GPUs (a gang of 8-GPU pods above 8, arriving together, `gang` = the job's name), a
    log-normal run time."""
    x = rng.random()
    gpus = next(g for share, g in TRAIN_SHAPES if x < share)
    median = TRAIN_LARGE_MEDIAN if gpus >= 8 else TRAIN_SMALL_MEDIAN
    minutes = min(TRAIN_MAX_MINUTES, max(2, int(rng.lognormvariate(math.log(median), TRAIN_SIGMA))))
    members = max(1, gpus // 8)
    per_pod = gpus // members
    gang = name if members > 1 else ""
    return [Pod(name=f"{name}-{m}", arrival=arrival, duration=minutes, gpus=per_pod, gang=gang) for m in range(members)]


def training_trace(rng: Rng, days: int = 7) -> Trace:
    """A training cluster's week (starting Monday): working-day submissions of mostly short 1-GPU jobs and
    a few multi-node gangs (16 and 32 GPUs as 2 and 4 pods of 8 sharing `Pod.gang`, the job's name: the
    replay's scheduler starts a gang's pods together or not at all), and a daily sweep of 30-60 one-GPU
    trials. Seeded by the caller's rng."""
    horizon = days * 1440
    pods: list[Pod] = []
    t = 0.0
    while True:
        day, hour = int(t // 1440), int(t // 60) % 24
        working = day % 7 < 5 and 9 <= hour < 19
        t += rng.expovariate(TRAIN_WEEKDAY_RATE if working else TRAIN_OFF_RATE)
        if t >= horizon:
            break
        pods += _training_job(rng, f"job-{len(pods)}", int(t))
    for day in (d for d in range(days) if d % 7 < 5):
        start = day * 1440 + rng.randint(10 * 60, 17 * 60)
        for i in range(rng.randint(*SWEEP_JOBS)):
            minutes = max(5, int(rng.lognormvariate(math.log(SWEEP_MEDIAN), 0.5)))
            pods.append(
                Pod(name=f"sweep-{day}-{i}", arrival=min(horizon - 1, start + rng.randint(0, 10)), duration=minutes)
            )
    pods.sort(key=lambda p: p.arrival)
    return Trace(
        format=TraceFormat.SYNTHETIC,
        source=f"synthetic training cluster, {days} days",
        pods=tuple(pods),
        horizon=horizon,
    )
