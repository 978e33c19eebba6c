"""The on-node publisher against moto server over HTTP: gzip-compressed PutMetricData that CloudWatch
(moto) accepts, read back with GetMetricData the way the scaler reads it; an outage and recovery."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import boto3

from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender, cloudwatch_client

T0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=30)


def publisher(endpoint: str) -> tuple[Publisher, list[dict[str, Any]]]:
    client = cloudwatch_client("us-east-1", endpoint)
    sent: list[dict[str, Any]] = []

    def capture(request: Any, **_: Any) -> None:
        encoding = request.headers.get("Content-Encoding")
        encoding = encoding.decode() if isinstance(encoding, bytes) else encoding
        sent.append({"encoding": encoding, "size": len(request.body or b"")})

    client.meta.events.register("before-send.cloudwatch.PutMetricData", capture)
    backend = SimulatedBackend(gpus=8)
    for i in range(8):
        backend.set(i, utilization=50 + i, memory_percent=40)
    identity = Identity("i-0pub", "us-east-1", "g5.48xlarge", asg_name="train-spot")
    pub = Publisher(backend, identity, Sender(client))
    pub.start(xid_thread=False)
    return pub, sent


def read(cloudwatch: Any, metric: schema.Metric, dims: dict[str, str], stat: str) -> list[float]:
    resp = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": "q",
                "MetricStat": {
                    "Metric": {
                        "Namespace": schema.NAMESPACE,
                        "MetricName": metric.name,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
                    },
                    "Period": 60,
                    "Stat": stat,
                },
            }
        ],
        StartTime=T0 - timedelta(minutes=5),
        EndTime=T0 + timedelta(minutes=10),
    )
    return list(resp["MetricDataResults"][0]["Values"])


def test_one_gzip_call_per_minute_readable_by_the_scaler(aws: str) -> None:
    pub, sent = publisher(aws)
    simulate(pub, T0, 180)
    pub.finish(T0 + timedelta(seconds=180))
    assert len(sent) == 3  # 3 minutes of 8 GPUs: 3 calls (gpumon.py: 144)
    assert all(s["encoding"] == "gzip" for s in sent)
    cloudwatch = boto3.client("cloudwatch")
    assert read(cloudwatch, schema.GPU_UTILIZATION, {"InstanceId": "i-0pub"}, "Maximum") == [57.0, 57.0, 57.0]
    group = read(cloudwatch, schema.GPU_UTILIZATION, {"AutoScalingGroupName": "train-spot"}, "Average")
    assert len(group) == 3 and all(abs(v - 53.5) < 1e-6 for v in group)
    memory = read(cloudwatch, schema.GPU_MEMORY_USED_PERCENT, {"InstanceId": "i-0pub"}, "Maximum")
    assert len(memory) == 3 and all(abs(v - 40.0) < 1e-9 for v in memory)


def test_metrics_buffered_during_an_outage_arrive_with_their_own_timestamps(aws: str) -> None:
    pub, _ = publisher(aws)
    real = pub.sender.cloudwatch
    pub.sender.cloudwatch = cloudwatch_client("us-east-1", "http://127.0.0.1:9")  # nothing listens there
    pub.sender.cloudwatch.meta.config.retries = {"max_attempts": 1}
    simulate(pub, T0, 240)
    assert len(pub.sender.buffer) >= 3
    pub.sender.cloudwatch = real
    pub.sender.next_attempt = None
    pub.finish(T0 + timedelta(minutes=10))
    values = read(boto3.client("cloudwatch"), schema.GPU_UTILIZATION, {"InstanceId": "i-0pub"}, "SampleCount")
    assert values == [480.0] * 4  # four minutes, 60 samples x 8 GPUs each, none lost
