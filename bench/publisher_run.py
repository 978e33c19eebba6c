"""One side of the publisher benchmark, in its own process: `python bench/publisher_run.py ours|gpumon
ENDPOINT MINUTES`. Both sides read 8 GPUs through nvidia-ml-py from the fake libnvidia-ml.so.1 (on
LD_LIBRARY_PATH) on a simulated clock and send to moto server; prints one JSON line of measurements."""

from __future__ import annotations

import json
import resource
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any


def peak_rss_mb() -> float:
    """This process's own high-water mark (VmHWM). getrusage's ru_maxrss survives fork+exec on Linux, so
    it would report the benchmark parent's size instead."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def track(client: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {"requests": 0, "bytes": 0, "datums": 0, "series": set()}

    def before_send(request: Any, **_: Any) -> None:
        stats["requests"] += 1
        stats["bytes"] += len(request.body or b"")

    def count(params: dict[str, Any], **_: Any) -> None:
        for d in params.get("MetricData", []):
            stats["datums"] += 1
            stats["series"].add((d["MetricName"], tuple(sorted((x["Name"], x["Value"]) for x in d["Dimensions"]))))

    client.meta.events.register("before-send.cloudwatch.PutMetricData", before_send)
    client.meta.events.register("provide-client-params.cloudwatch.PutMetricData", count)
    return stats


def ours(endpoint: str, minutes: int, detail: str = "full", node: str | None = None) -> dict[str, Any]:
    """`node`: a folder with a /proc and /var/log tree of the GPUs' processes: attribution on, usage
    records to moto's CloudWatch Logs, and the Prometheus endpoint scraped every 15 s (what the default
    config plus `prometheus: true` does)."""
    from gpufleet_node.identity import Identity
    from gpufleet_node.nvml import NvmlBackend
    from gpufleet_node.publisher import Publisher
    from gpufleet_node.sender import Sender, cloudwatch_client

    client = cloudwatch_client("us-east-1", endpoint)
    stats = track(client)
    identity = Identity("i-bench", "us-east-1", asg_name="bench")
    backend, sender = NvmlBackend(), Sender(client)
    usage = _attribution(backend, identity, sender, endpoint, node) if node else None
    scrape, stops = None, []
    publisher = Publisher(backend, identity, sender, detail=detail, usage=usage)
    publisher.start(xid_thread=False)
    if node:
        from gpufleet_node import __main__ as service

        stops = service.start_extras(_config(node), publisher)
        scrape = f"http://127.0.0.1:{stops[-1].__self__.port}/metrics"  # type: ignore[attr-defined]
    t0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    cpu = time.process_time()
    scraped = 0
    for second in range(minutes * 60):  # 1 Hz
        publisher.step(t0 + timedelta(seconds=second))
        if scrape and second % 15 == 0:
            scraped += len(urllib.request.urlopen(scrape, timeout=5).read())
    publisher.finish(t0 + timedelta(minutes=minutes))
    result = {**stats, "cpu_s": time.process_time() - cpu, "scrape_bytes": scraped}
    for stop in stops:
        stop()
    if usage is not None:
        result["records"] = usage.records
    return result


def _config(node: str) -> dict[str, Any]:
    from gpufleet_node import config

    cfg = dict(config.DEFAULTS)
    cfg.update(prometheus=True, prometheus_port=0, prometheus_address="127.0.0.1", proc_root=f"{node}/proc")
    cfg.update(kubelet_log_root=f"{node}/var/log", pod_resources_socket=None, region="us-east-1")
    return cfg


def _attribution(backend: Any, identity: Any, sender: Any, endpoint: str, node: str) -> Any:
    import boto3

    from gpufleet_node import __main__ as service

    logs = boto3.client("logs", region_name="us-east-1", endpoint_url=endpoint)
    logs.create_log_group(logGroupName="/gpufleet/usage")
    backend.init()
    cfg = _config(node)
    cfg["endpoint_url"] = endpoint
    return service.usage_tracker(cfg, backend, identity, sender)


def gpumon(endpoint: str, minutes: int) -> dict[str, Any]:
    """The pattern of AWS's 2017 gpumon.py: every 10 s, per GPU, one uncompressed PutMetricData."""
    import boto3
    import pynvml
    from botocore.config import Config

    client = boto3.client(
        "cloudwatch", region_name="us-east-1", endpoint_url=endpoint, config=Config(disable_request_compression=True)
    )
    stats = track(client)
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    t0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)
    cpu = time.process_time()
    for step in range(minutes * 6):
        now = t0 + timedelta(seconds=10 * step)
        for i, h in enumerate(handles):
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            power = pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0
            temp = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            dims = [{"Name": "InstanceId", "Value": "i-bench"}, {"Name": "GPUNumber", "Value": str(i)}]
            data = [
                ("GPU Usage", util.gpu, "Percent"),
                ("Memory Usage", util.memory, "Percent"),  # memory-controller activity, as gpumon reports it
                ("Power Usage (Watts)", power, "None"),
                ("Temperature (C)", temp, "None"),
            ]
            client.put_metric_data(
                Namespace="DeepLearningTrain",
                MetricData=[
                    {
                        "MetricName": n,
                        "Dimensions": dims,
                        "Unit": u,
                        "StorageResolution": 60,
                        "Value": v,
                        "Timestamp": now,
                    }
                    for n, v, u in data
                ],
            )
    return {**stats, "cpu_s": time.process_time() - cpu}


if __name__ == "__main__":
    side, endpoint, minutes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if side == "gpumon":
        result = gpumon(endpoint, minutes)
    elif side == "ours-attributed":
        result = ours(endpoint, minutes, detail="adaptive", node=sys.argv[4])
    else:
        result = ours(endpoint, minutes, detail="essential" if side == "ours-essential" else "full")
    result["series"] = len(result["series"])
    result["peak_rss_mb"] = peak_rss_mb()
    print(json.dumps(result))
