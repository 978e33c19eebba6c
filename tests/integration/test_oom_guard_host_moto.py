"""Host memory through the whole path on moto server: the real publisher reads a leaking node's
/proc/meminfo (a file in tmp) and sends it in its minute's PutMetricData; the OOM guard screens the
group's fullest node on a host-screening minute, names the node and queues an OOM warning for its host."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3

from gpufleet.domain import defaults
from gpufleet.guard.service import OomGuard
from gpufleet_node.host import HostFeed, HostReader
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender
from rehearsal import fleet
from tests.integration.conftest import Fleet, queued
from tests.integration.test_oom_guard_moto import guard

_now = datetime.now(UTC).replace(second=0, microsecond=0)
NOW = _now - timedelta(minutes=_now.minute % defaults.HOST_SCREEN_EVERY_MIN)  # a host-screening minute


def publish_host(tmp: Path, instance_id: str, memory: list[float]) -> None:
    """One node of train-spot, a minute per reading ending at NOW, host memory as given (percent)."""
    meminfo = tmp / f"meminfo-{instance_id}"
    reader = HostReader(("/",), str(meminfo))
    backend = SimulatedBackend(gpus=1)
    backend.set(0, 60, 30)
    identity = Identity(instance_id, "us-east-1", asg_name="train-spot")
    pub = Publisher(backend, identity, Sender(boto3.client("cloudwatch")), detail="adaptive", host=HostFeed(reader))
    pub.start(xid_thread=False)
    start = NOW - timedelta(minutes=len(memory))
    for m, percent in enumerate(memory):
        meminfo.write_text(f"MemTotal: 1000000 kB\nMemAvailable: {int(10000 * (100 - percent))} kB\n")
        simulate(pub, start + timedelta(minutes=m), 60, every_s=30)
        pub.close_windows(start + timedelta(minutes=m, seconds=59))


def test_a_leaking_host_gets_an_oom_warning_naming_the_host(gpu_fleet: Fleet, tmp_path: Path) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    leaky, calm = gpu_fleet.instances()
    publish_host(tmp_path, leaky, [62.0 + 1.5 * m for m in range(15)])  # 83 % now, full in ~12 min
    publish_host(tmp_path, calm, [40.0] * 15)
    g: OomGuard = guard(gpu_fleet, stack.queue_url)
    result = g.evaluate(NOW, "tick-host")
    assert result["hosts"] == 1 and result["gpus"] == 0
    why = result["at_risk"][f"{leaky}/host"]
    assert why.startswith("warning: host memory 83.0% used") and "full in ~" in why
    [note] = queued(stack.queue_url)
    assert note.kind == "oom" and note.incident_key == f"asg:train-spot|oom|{leaky}/host"
    assert note.facts["instance"] == leaky and "GPU" not in note.facts
