"""`gpufleet report` at fleet scale: what reading a month of usage records costs, in calls, bytes, time
and dollars, for 1,000 nodes x 30 days = 8.64 M records.

`python -c "from bench.report_read import bench_report; print('\\n'.join(bench_report(quick=True)))"`
(quick: 4 nodes x 1 day, numbers not to quote; full: 40 nodes x 7 days).

Measured, on realistic 8-GPU records built by the node publisher's own code (gpufleet_node.usage: one
p4d.24xlarge per node, three pods on 4 + 2 + 1 GPUs, one GPU free, utilization varying):
1. bytes per record (the log event's message, UTF-8);
2. records/s of the pure core (parse + sum, in memory, one thread);
3. a seeded moto server read through the report's own reader (FilterLogEvents, time slices, 4 workers):
   calls, events, wall time.
Extrapolated to 1,000 nodes x 30 days: FilterLogEvents returns at most 10,000 events or 1 MB a page
(AWS API reference), so a month needs at least max(records / 10,000, bytes / 1 MB) calls; the account
may make 5 FilterLogEvents calls a second per Region (AWS knowledge center, not adjustable), so that is
the shortest possible read. moto pages by 10,000 events only, so its call count is the lower of the two.

Prices (us-east-1, 2026): ingestion $0.50/GB and storage $0.03/GB-month (CloudWatch Logs standard class;
storage is billed on compressed bytes, counted uncompressed here: an upper bound), Logs Insights $0.005
per GB scanned. FilterLogEvents: no per-request or per-GB-scanned charge was found (AWS's list of
CloudWatch Logs usage types on a bill names ingestion, vended logs and storage only; Insights' scans are
DataScan), so the read itself is counted at $0 - check your bill's CW:Requests line if in doubt.
"""

from __future__ import annotations

import json
import math
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

FLEET_NODES, FLEET_DAYS = 1000, 30
PAGE_EVENTS, PAGE_BYTES = 10_000, 1_000_000  # FilterLogEvents: a page holds at most either
FILTER_TPS = 5.0  # FilterLogEvents calls per second per account and Region
INGEST_GB, STORE_GB_MONTH, INSIGHTS_GB = 0.50, 0.03, 0.005  # $, us-east-1
WINDOW = 300
HEAD = ("| measure | result | note | |", "|---|---|---|---|")


def realistic_records(nodes: int, days: int, end: datetime, seed: int = 7) -> dict[str, list[tuple[int, str]]]:
    """(timestamp ms, message) per node, as the publisher writes them: UsageWindow.record()."""
    from gpufleet_node.usage import Holder, UsageWindow
    from gpufleet_node.workload import Workload

    rng = random.Random(seed)
    start = end - timedelta(days=days)
    out: dict[str, list[tuple[int, str]]] = {}
    for n in range(nodes):
        node = f"i-0{n:016x}"
        pods = [
            Workload(
                "pod",
                namespace=f"team-{(n + k) % 6}",
                pod=f"{name}-{n}-{rng.randrange(10**5):05d}",
                container="main",
                pod_uid=f"{rng.getrandbits(128):032x}",
            )
            for k, name in enumerate(("trainer", "finetune", "notebook"))
        ]
        layout = [0, 0, 0, 0, 1, 1, 2, None]  # GPU -> pod (None: free)
        events = []
        for w in range(days * 86400 // WINDOW):
            at = start + timedelta(seconds=w * WINDOW)
            window = UsageWindow(at, WINDOW, 8)
            for gpu, p in enumerate(layout):
                util = rng.uniform(0, 4) if p == 2 else rng.uniform(20, 100)
                holders = [] if p is None else [Holder(pods[p], rng.uniform(500, 78000), util, 1)]
                window.add(gpu, float(WINDOW), util, holders)
            record = window.record(node, "p4d.24xlarge", f"eks:ml/train-{n % 4}")
            events.append((int(at.timestamp() * 1000), json.dumps(record, separators=(",", ":"))))
        out[node] = events
    return out


def _core_rate(events: list[tuple[str, int, str]], start: datetime, end: datetime) -> tuple[float, Any]:
    from gpufleet_tools.report.identity import identify
    from gpufleet_tools.report.prices import PriceBook
    from gpufleet_tools.report.records import RecordParser
    from gpufleet_tools.report.usage import Period, UsageSums

    sums, parser = UsageSums(Period(start, end)), RecordParser(identify)
    started = time.perf_counter()
    for stream, stamp, m in events:  # with the stream and the stamp, as the reader hands them on (bounds)
        sums.add(parser.parse(m, stream, stamp))
    report = sums.report(PriceBook())
    return len(events) / (time.perf_counter() - started), report


def _read_on_moto(records: dict[str, list[tuple[int, str]]], start: datetime, end: datetime) -> dict[str, Any]:
    import boto3

    from gpufleet_node.schema import USAGE_LOG_GROUP
    from gpufleet_tools.report.identity import identify
    from gpufleet_tools.report.model import Period, Selection
    from gpufleet_tools.report.reader import read_usage, slices
    from gpufleet_tools.report.records import RecordParser
    from gpufleet_tools.report.usage import UsageSums
    from rehearsal.moto import moto_server

    with moto_server():
        logs = boto3.client("logs")
        logs.create_log_group(logGroupName=USAGE_LOG_GROUP)
        for node, events in records.items():
            logs.create_log_stream(logGroupName=USAGE_LOG_GROUP, logStreamName=node)
            batch = [{"timestamp": ts, "message": m} for ts, m in events]
            for i in range(0, len(batch), 1000):
                logs.put_log_events(logGroupName=USAGE_LOG_GROUP, logStreamName=node, logEvents=batch[i : i + 1000])
        period = Period(start, end)
        sums, parser = UsageSums(period), RecordParser(identify)
        stats = read_usage(logs, period, Selection(), lambda s, t, m: sums.add(parser.parse(m, s, t)), max_tps=1000.0)
        stamps = [ts for events in records.values() for ts, _ in events]
        in_slice = [sum(a <= ts < b for ts in stamps) for a, b in slices(period)]
        expected = sum(max(1, math.ceil(n / PAGE_EVENTS)) for n in in_slice)
        return {"stats": stats, "records": sums.records, "expected_calls": expected}


def bench_report(quick: bool = False) -> list[str]:
    nodes, days = (4, 1) if quick else (40, 7)
    end = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)  # moto keeps 14 days, like AWS
    start = end - timedelta(days=days)
    records = realistic_records(nodes, days, end)
    messages = [m for events in records.values() for _, m in events]
    per_record = sum(len(m.encode()) for m in messages) / len(messages)
    in_order = sorted((ts, node, m) for node, events in records.items() for ts, m in events)
    rate, report = _core_rate([(node, ts, m) for ts, node, m in in_order], start, end)
    moto = _read_on_moto(records, start, end)
    stats = moto["stats"]

    fleet_records = FLEET_NODES * FLEET_DAYS * 86400 // WINDOW
    fleet_bytes = fleet_records * per_record
    calls = max(math.ceil(fleet_records / PAGE_EVENTS), math.ceil(fleet_bytes / PAGE_BYTES))
    at_quota = calls / FILTER_TPS
    core = fleet_records / rate
    gb = fleet_bytes / 1e9
    rows = [
        *HEAD,
        f"| seeded fleet | {nodes} nodes x {days} day(s) = {len(messages):,} records of 8 GPUs "
        f"(p4d.24xlarge, 3 pods + 1 free GPU) | records built by gpufleet_node.usage.UsageWindow | |",
        f"| bytes per record | {per_record:,.0f} B | JSON message, UTF-8 | |",
        f"| pure core (parse + sum), one thread | {rate:,.0f} records/s | "
        f"{report.records:,} records, {len(report.findings)} findings, {report.flagged_records} flagged | |",
        f"| read + sum on moto server (4 workers, no quota) | {stats.seconds:.2f} s, {stats.calls} FilterLogEvents "
        f"calls ({moto['expected_calls']} expected: {stats.slices} time slices, pages of 10,000), "
        f"{stats.events:,} events, {stats.bytes / 1e6:.1f} MB | {moto['records']:,} records summed | |",
        f"| 1,000 nodes x 30 days | {fleet_records / 1e6:.2f} M records, {gb:.2f} GB | "
        f"{per_record:,.0f} B x records | |",
        f"| FilterLogEvents calls for it | >= {calls:,} | pages of <= 1 MB / 10,000 events: "
        f"{'bytes' if fleet_bytes / PAGE_BYTES > fleet_records / PAGE_EVENTS else 'events'} bound | |",
        f"| read time at the quota (5 calls/s) | >= {at_quota / 60:.0f} min | the core needs {core / 60:.1f} min "
        f"of one CPU for it, overlapped with the reading | |",
        "| $ to read it with the report (FilterLogEvents) | $0.00 | no per-call or per-GB charge found | |",
        f"| $ Logs Insights alternative (scan) | ${gb * INSIGHTS_GB:.3f} per report | $0.005/GB scanned | |",
        f"| $ to write and keep it (per month of records) | ingestion ${gb * INGEST_GB:,.2f}, "
        f"storage <= ${gb * STORE_GB_MONTH:,.2f} per month kept | $0.50/GB, $0.03/GB-month | |",
    ]
    return rows


if __name__ == "__main__":
    import sys

    print("\n".join(bench_report(quick="--quick" in sys.argv[1:])))
