"""One side of the telemetry-cost benchmark, in its own process: `python bench/telemetry_run.py SIDE [DAYS]`.

SIDE is `adaptive`, `essential` or `full` (the real publisher on a simulated backend driven by the
scenario in bench/telemetry_scenario.py, simulated clock, one sample per GPU every 10 s), or `gpumon` /
`agent` (the request patterns of gpumon.py and the CloudWatch agent's `nvidia_gpu` plugin over the same
scenario). Every side sends to a `Meter`, a stand-in CloudWatch client that counts requests, datums and
series-hours (a series is namespace + name + dimensions; CloudWatch bills it for each hour in which it
receives data). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "layers" / "node")]

from bench.telemetry_scenario import DAYS, MONTH_START, SAMPLE_EVERY_S, FakeHost, Scenario  # noqa: E402

# The CloudWatch agent's nvidia_gpu measurements (AWS docs, CloudWatch-Agent-NVIDIA-GPU): 17 per GPU.
AGENT_FIELDS = (
    "utilization_gpu",
    "temperature_gpu",
    "power_draw",
    "utilization_memory",
    "fan_speed",
    "memory_total",
    "memory_used",
    "memory_free",
    "pcie_link_gen_current",
    "pcie_link_width_current",
    "encoder_stats_session_count",
    "encoder_stats_average_fps",
    "encoder_stats_average_latency",
    "clocks_current_graphics",
    "clocks_current_sm",
    "clocks_current_memory",
    "clocks_current_video",
)


class Meter:
    """FAKE CloudWatch (counting only): what was sent, priced later by bench/telemetry.py."""

    def __init__(self) -> None:
        self.requests = 0
        self.datums = 0
        self.log_requests = 0
        self.log_events = 0
        self.log_bytes = 0  # as CloudWatch Logs bills ingestion: message bytes + 26 bytes per event
        self.series_hours: set[tuple[Any, int]] = set()
        self._scope: dict[Any, str] = {}

    def put_metric_data(self, Namespace: str, MetricData: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        self.requests += 1
        self.datums += len(MetricData)
        for d in MetricData:
            dims = tuple((x["Name"], x["Value"]) for x in d["Dimensions"])
            key = (Namespace, d["MetricName"], dims)
            self.series_hours.add((key, int(d["Timestamp"].timestamp()) // 3600))
        return {}

    def put_log_events(self, logGroupName: str, logStreamName: str, logEvents: list[dict[str, Any]]) -> dict[str, Any]:  # noqa: N803
        self.log_requests += 1
        self.log_events += len(logEvents)
        self.log_bytes += sum(len(e["message"].encode()) + 26 for e in logEvents)
        return {}

    def create_log_stream(self, logGroupName: str, logStreamName: str) -> dict[str, Any]:  # noqa: N803
        self.log_requests += 1
        return {}

    def scope(self, key: Any) -> str:
        """gpu (a GPU's own series), instance, or group (shared by every node of the group)."""
        names = {n for n, _ in key[2]}
        if names & {"GpuIndex", "GPUNumber", "index"}:
            return "gpu"
        return "instance" if "InstanceId" in names else "group"

    def result(self) -> dict[str, Any]:
        hours: dict[str, int] = {"gpu": 0, "instance": 0, "group": 0}
        for key, _ in self.series_hours:
            hours[self.scope(key)] += 1
        series = {key for key, _ in self.series_hours}
        host = {"instance": 0, "group": 0}
        for key, _ in self.series_hours:
            if key[1].startswith("Host") and self.scope(key) in host:
                host[self.scope(key)] += 1
        return {
            "host_series_hours": host,
            "requests": self.requests,
            "datums": self.datums,
            "series_hours": hours,
            "series": len(series),
            "series_by_scope": {s: sum(self.scope(k) == s for k in series) for s in hours},
            "logs": {"requests": self.log_requests, "events": self.log_events, "bytes": self.log_bytes},
        }


class TwoTeams:
    """Attribution's inputs for the month: team-a's trainer holds GPUs 0-3 (one of them never used),
    team-b's pods GPUs 4-6, GPU 7 is unallocated; the pods keep their GPUs through nights and weekends.
    It answers as the Attributor (owner of each PID) and as the kubelet's reader (the allocations)."""

    def __init__(self, backend: Any) -> None:
        from gpufleet_node.podresources import Allocations
        from gpufleet_node.workload import POD, Workload

        pods = [("team-a", "trainer-0") if g < 4 else ("team-b", f"infer-{g - 4}") for g in range(7)]
        workloads = [Workload(POD, namespace=ns, pod=pod, container="main") for ns, pod in pods]
        self.owners = {1000 + g: w for g, w in enumerate(workloads)}
        self.allocations = Allocations(by_device={backend.describe(g).uuid: w for g, w in enumerate(workloads)})

    def current(self) -> Any:
        return self.allocations

    def workload_of(self, pid: int) -> Any:
        return self.owners[pid]

    def unknown(self) -> dict[str, str]:
        return {}

    def processes(self, gpu: int, util: float, memory_mib: float) -> list[Any]:
        from gpufleet_node.nvml import ProcessUse

        if gpu == 7 or gpu == 3:  # GPU 3: allocated to the trainer, never touched; GPU 7: nobody's
            return []
        return [ProcessUse(1000 + gpu, memory_mib, util)]


def ours(mode: str, scenario: Scenario, attribution: bool = False) -> dict[str, Any]:
    from gpufleet_node import schema
    from gpufleet_node.host import HostFeed
    from gpufleet_node.identity import Identity
    from gpufleet_node.nvml import SimulatedBackend
    from gpufleet_node.publisher import Publisher
    from gpufleet_node.sender import LogSender, Sender
    from gpufleet_node.tracker import UsageTracker

    meter = Meter()
    backend = SimulatedBackend(gpus=scenario.gpus, memory_total_mib=81920.0, power_limit_w=400.0)
    identity = Identity("i-0bench", "us-east-1", "p4d.24xlarge", asg_name="bench-train")
    sender = Sender(meter)
    usage, teams = None, TwoTeams(backend)
    if attribution:
        uuids = [backend.describe(g).uuid for g in range(scenario.gpus)]
        logs = LogSender(meter, "/gpufleet/usage", identity.instance_id, flush_every_s=schema.USAGE_FLUSH_S)
        usage = UsageTracker(teams, teams, uuids, logs, sender, sample_s=SAMPLE_EVERY_S)
    scratch = tempfile.TemporaryDirectory()
    host = FakeHost(Path(scratch.name))
    publisher = Publisher(backend, identity, sender, detail=mode, usage=usage, host=HostFeed(host.reader))
    publisher.start(xid_thread=False)
    xids = list(scenario.xids)
    detail_minutes = host_minutes = 0
    for offset in range(0, scenario.seconds, SAMPLE_EVERY_S):
        host.set(*scenario.host(offset))
        for gpu in range(scenario.gpus):
            util, memory, throttle = scenario.at(offset, gpu)
            if attribution and gpu in (3, 7):
                util, memory, throttle = 0.0, 0.5, 0
            backend.set(gpu, util, memory, throttle)
            if attribution:
                backend.set_processes(gpu, teams.processes(gpu, util, 819.2 * memory))
        while xids and xids[0][0] <= offset:
            publisher.record_xid(xids[0][1], xids[0][2])
            xids.pop(0)
        publisher.step(MONTH_START + timedelta(seconds=offset))
        if offset % 60 == 0 and publisher.selector is not None:
            detail_minutes += len(publisher.selector.current)
            host_minutes += len(publisher.selector.host.current)
    end = MONTH_START + timedelta(seconds=scenario.seconds)
    publisher.finish(end)
    if usage is not None:  # as the service's shutdown does (stop_background): the last records still go
        usage.log_sender.final = True  # type: ignore[attr-defined]
        usage.log_sender.flush(end)
    scratch.cleanup()
    return {**meter.result(), "detail_gpu_hours": detail_minutes / 60, "host_detail_hours": host_minutes / 60}


def gpumon(scenario: Scenario) -> dict[str, Any]:
    """gpumon.py's loop: every 10 s, per GPU, one PutMetricData with 4 datums; dimensions InstanceId,
    ImageId, InstanceType, GPUNumber; namespace DeepLearningTrain."""
    meter = Meter()
    base = [
        {"Name": "InstanceId", "Value": "i-0bench"},
        {"Name": "ImageId", "Value": "ami-0bench"},
        {"Name": "InstanceType", "Value": "p4d.24xlarge"},
    ]
    dims = [[*base, {"Name": "GPUNumber", "Value": str(g)}] for g in range(scenario.gpus)]
    for offset in range(0, scenario.seconds, 10):
        now = MONTH_START + timedelta(seconds=offset)
        for g in range(scenario.gpus):
            util, _, _ = scenario.at(offset, g)
            values = (("GPU Usage", util), ("Memory Usage", util * 0.6), ("Power Usage (Watts)", 60 + 3.4 * util))
            data = [{"MetricName": n, "Dimensions": dims[g], "Value": v, "Timestamp": now} for n, v in values]
            data.append(
                {"MetricName": "Temperature (C)", "Dimensions": dims[g], "Value": 35 + 0.4 * util, "Timestamp": now}
            )
            meter.put_metric_data(Namespace="DeepLearningTrain", MetricData=data)
    return meter.result()


def agent(scenario: Scenario) -> dict[str, Any]:
    """The CloudWatch agent with the `nvidia_gpu` section listing its 17 measurements, 60 s collection:
    one series per field per GPU with dimensions index, name, host (namespace CWAgent); the agent batches
    up to 1,000 datums per PutMetricData and flushes every 60 s (force_flush_interval)."""
    meter = Meter()
    dims = [
        [
            {"Name": "index", "Value": str(g)},
            {"Name": "name", "Value": "NVIDIA A100-SXM4-80GB"},
            {"Name": "host", "Value": "ip-10-0-1-23.ec2.internal"},
        ]
        for g in range(scenario.gpus)
    ]
    for offset in range(0, scenario.seconds, 60):
        now = MONTH_START + timedelta(seconds=offset)
        data = []
        for g in range(scenario.gpus):
            util, mem, _ = scenario.at(offset, g)
            for field in AGENT_FIELDS:
                value = util if field == "utilization_gpu" else mem if field == "memory_used" else 0.0
                data.append(
                    {"MetricName": "nvidia_smi_" + field, "Dimensions": dims[g], "Value": value, "Timestamp": now}
                )
        for i in range(0, len(data), 1000):
            meter.put_metric_data(Namespace="CWAgent", MetricData=data[i : i + 1000])
    return meter.result()


def main(side: str, days: int = DAYS) -> dict[str, Any]:
    scenario = Scenario(days)
    started = time.process_time()
    if side == "gpumon":
        result = gpumon(scenario)
    elif side == "agent":
        result = agent(scenario)
    elif side == "attributed":
        result = ours("adaptive", scenario, attribution=True)
    else:
        result = ours(side, scenario)
    return {**result, "side": side, "cpu_s": round(time.process_time() - started, 1)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else DAYS)))
