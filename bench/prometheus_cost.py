"""What the node's Prometheus endpoint costs per 8-GPU node-month, next to the same series in CloudWatch.

`python -m bench.prometheus_cost` (`--quick`: fewer timed scrapes; numbers not to quote). Real code end to
end: the real collector (gpufleet_node.prometheus) over an 8 x H100 node with attribution, served by the
real HTTP endpoint on 127.0.0.1, scraped with urllib and parsed with prometheus_client's parser. Series
are counted from the scrape, so the rows follow whatever the endpoint emits.

The node (p5-class, 8 x H100 80GB): GPUs 0-3 one training pod each (namespace ml-train), GPU 4 time-sliced
between two inference pods (each pod's memory and SM share known), GPU 5 allocated to a notebook pod that
runs nothing, GPUs 6-7 unallocated. Every field NVML offers is known (SM clock and memory temperature too).

Prices (us-east-1, list, looked up for this benchmark; AMP pricing page https://aws.amazon.com/prometheus/
pricing/ and the AWS Price List API): AMP ingestion $0.90 per 10M samples for the first 2B samples of an
account-month ($0.35 next 250B, $0.16 beyond), storage $0.03 per GB-month, the managed collector $0.04 per
collector-hour plus $0.03 per 10M samples collected. A month is 730 hours (as CloudWatch prorates). AMP
storage: 2 bytes per sample ("typically 1 or 2 bytes" on the pricing page) plus each series' labels once,
held for the default 150-day retention, so a node-month carries 150/30.4 months of stored data in steady
state. CloudWatch: the same number of series as custom metrics at $0.30 per metric-month (first 10,000
metrics), PutMetricData requests not counted. Free tiers are ignored.
"""

from __future__ import annotations

import statistics
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpufleet_node.prometheus import GpuView

MONTH_S = 730 * 3600
AMP_INGEST_PER_SAMPLE = 0.90 / 10_000_000  # first 2B samples per account-month
AMP_INGEST_TIER2_PER_SAMPLE = 0.35 / 10_000_000  # next 250B: a fleet of ~80+ such nodes at 15 s gets here
AMP_STORAGE_GB_MONTH = 0.03
AMP_COLLECTOR_PER_SAMPLE = 0.03 / 10_000_000  # the EKS managed scraper, on top of ingestion
AMP_COLLECTOR_HOUR = 0.04  # per scraper (one per cluster), not per node
AMP_RETENTION_DAYS = 150
BYTES_PER_SAMPLE = 2
CLOUDWATCH_METRIC_MONTH = 0.30
GIB = 1024**3
INTERVALS_S = (30, 15)
HOST = "ip-10-0-1-23.ec2.internal"
MODEL = "NVIDIA H100 80GB HBM3"


def node_views(attributed: bool = True) -> list[GpuView]:
    """The benchmark node's eight GPUs as the publisher would hand them to the endpoint."""
    from gpufleet_node.nvml import GpuSample, ProcessUse
    from gpufleet_node.prometheus import GpuView
    from gpufleet_node.usage import Holder
    from gpufleet_node.workload import Workload

    def sample(util: float, used_mib: float, procs: list[ProcessUse]) -> GpuSample:
        return GpuSample(
            utilization=util,
            mem_controller_busy=util * 0.45,
            memory_total_mib=81559.0,
            memory_used_mib=used_mib,
            memory_free_mib=81559.0 - used_mib - 559.0,
            power_w=120.0 + 5.5 * util,
            power_limit_w=700.0,
            temperature_c=38.0 + util * 0.3,
            memory_temperature_c=45.0 + util * 0.3,
            throttle_reasons=0x4 if util > 90 else 0,
            ecc_double_bit_total=0.0,
            remapped_uncorrectable_total=0.0,
            process_count=len(procs),
            top_process_mib=max((p.memory_mib or 0.0 for p in procs), default=0.0),
            processes=procs,
            sm_clock_mhz=1980.0 if util else 345.0,
        )

    views: list[GpuView] = []
    for i in range(4):
        pod = Workload("pod", namespace="ml-train", pod=f"llm-trainer-{i}", container="trainer")
        s = sample(94.0, 71000.0, [ProcessUse(4100 + i, 71000.0, 93.0)])
        views.append(
            GpuView(i, f"GPU-{i:08x}-h100", MODEL, s, holders=[Holder(pod, 71000.0, 93.0, 1)] if attributed else None)
        )
    a = Workload("pod", namespace="inference", pod="chat-api-7d9f-a", container="server")
    b = Workload("pod", namespace="inference", pod="chat-api-7d9f-b", container="server")
    s = sample(63.0, 38000.0, [ProcessUse(5100, 20000.0, 41.0), ProcessUse(5200, 18000.0, 22.0)])
    holders = [Holder(a, 20000.0, 41.0, 1), Holder(b, 18000.0, 22.0, 1)]
    views.append(GpuView(4, "GPU-00000004-h100", MODEL, s, holders=holders if attributed else None))
    notebook = Workload("pod", namespace="research", pod="notebook-alice", container="jupyter")
    views.append(
        GpuView(5, "GPU-00000005-h100", MODEL, sample(0.0, 0.0, []), holders=[Holder(notebook)] if attributed else None)
    )
    for i in (6, 7):
        views.append(GpuView(i, f"GPU-{i:08x}-h100", MODEL, sample(0.0, 0.0, [])))
    return views


def scrape_once(port: int) -> tuple[bytes, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        body = resp.read()
    return body, (time.perf_counter() - started) * 1000


def count_series(body: bytes) -> tuple[int, int, int]:
    """(series, of them dcgm-exporter's, label bytes of all series) from prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    series = dcgm = label_bytes = 0
    for family in text_string_to_metric_families(body.decode("utf-8")):
        for s in family.samples:
            series += 1
            dcgm += s.name.startswith("DCGM_")
            label_bytes += len(s.name) + sum(len(k) + len(v) + 4 for k, v in s.labels.items())
    return series, dcgm, label_bytes


def amp_month(series: int, label_bytes: int, interval_s: int) -> tuple[float, float]:
    """(ingestion $, steady-state storage $) of one node-month in AMP at the first ingestion tier."""
    samples = series * MONTH_S / interval_s
    stored_gb = (samples * BYTES_PER_SAMPLE + label_bytes) / GIB * (AMP_RETENTION_DAYS / (730 / 24))
    return samples * AMP_INGEST_PER_SAMPLE, stored_gb * AMP_STORAGE_GB_MONTH


def measure(label: str, views: Callable[[], Sequence[GpuView]], scrapes: int, **switches: bool) -> tuple[str, int]:
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from gpufleet_node.prometheus import GpuCollector, serve
    from gpufleet_node.scrape_server import Limits

    collector = GpuCollector(HOST, views, "i-0123456789abcdef0", **switches)
    # every scrape renders afresh and none waits for the response rate: this measures one full scrape
    endpoint = serve(collector, 0, "127.0.0.1", Limits(render_every_s=0, responses_per_s=1e6))
    try:
        body, _ = scrape_once(endpoint.port)  # warm
        walls = [scrape_once(endpoint.port)[1] for _ in range(scrapes)]
    finally:
        endpoint.stop()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    cpu0 = time.thread_time()
    for _ in range(scrapes):
        generate_latest(registry)
    cpu_ms = (time.thread_time() - cpu0) * 1000 / scrapes
    series, dcgm, label_bytes = count_series(body)
    costs = []
    for interval in INTERVALS_S:
        ingest, storage = amp_month(series, label_bytes, interval)
        costs.append(f"${ingest + storage:.2f}")
    cloudwatch = series * CLOUDWATCH_METRIC_MONTH
    row = (
        f"| {label} | {series} ({dcgm} dcgm) | {len(body):,} | {statistics.median(walls):.2f} | {cpu_ms:.2f} | "
        f"{' | '.join(costs)} | ${cloudwatch:,.2f} |"
    )
    return row, series


def bench_prometheus(quick: bool = False) -> list[str]:
    """Markdown table rows: per endpoint shape, its series, one scrape's size and time, the collector's
    CPU per scrape, and a node-month in AMP (30 s and 15 s scrapes) vs the same series in CloudWatch."""
    scrapes = 5 if quick else 200
    attributed = node_views(True)
    plain = node_views(False)
    rows = [
        "| endpoint, 8 x H100 node | series | bytes/scrape | scrape ms (p50) | collector CPU ms/scrape | "
        "AMP node-month, 30 s | AMP node-month, 15 s | CloudWatch, same series |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    row, series = measure("default: gpufleet + dcgm names, 7 pods on 6 GPUs", lambda: attributed, scrapes)
    rows.append(row)
    rows.append(measure("gpufleet names only (`dcgm=False`)", lambda: attributed, scrapes, dcgm=False)[0])
    rows.append(measure("default, no attribution (no pods known)", lambda: plain, scrapes)[0])
    samples = {i: series * MONTH_S / i for i in INTERVALS_S}
    scraper = " | ".join(f"+${samples[i] * AMP_COLLECTOR_PER_SAMPLE:.2f}" for i in INTERVALS_S)
    rows.append(
        f"| default + the AMP managed scraper on EKS (samples collected; the scraper's own "
        f"${AMP_COLLECTOR_HOUR * 730:.2f}/month is per cluster) | | | | | {scraper} | |"
    )
    tier2 = " | ".join(f"${samples[i] * AMP_INGEST_TIER2_PER_SAMPLE:.2f}" for i in INTERVALS_S)
    rows.append(
        f"| default, ingestion past 2B samples per account-month (~{2e9 / samples[30]:.0f} such nodes at 30 s) "
        f"| | | | | {tier2} | |"
    )
    return rows


if __name__ == "__main__":
    print("\n".join(bench_prometheus(quick="--quick" in sys.argv[1:])))
