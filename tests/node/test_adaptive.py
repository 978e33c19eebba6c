"""`detail: adaptive`, phase by phase: the series a node sends while quiet (the always-on set), a GPU's
own series appearing above the memory threshold and disappearing only below the lower one, counters
silent at zero and sent when something happens, detail switched on for the instance. Python >= 3.9."""

from datetime import datetime, timedelta, timezone

import pytest

from fakes import FakeCloudWatch
from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import THROTTLE_HW_SLOWDOWN, THROTTLE_SW_POWER_CAP, SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)
ALWAYS_ON = {m.name + "@instance" for m in schema.ADAPTIVE_INSTANCE_METRICS} | {
    m.name + "@group" for m in schema.ADAPTIVE_GROUP_METRICS
}
GAUGES = {m.name for m in schema.DETAIL_GPU_METRICS if m.aggregation != schema.COUNTER}


class Node:
    """An 8-GPU node publishing in adaptive mode, minute by minute (10 s samples, simulated clock)."""

    def __init__(self, identity=None, **kw):
        self.backend = SimulatedBackend(gpus=8)
        for i in range(8):
            self.backend.set(i, utilization=10 * i, memory_percent=30 + i)
        self.cw = FakeCloudWatch()
        identity = identity or Identity("i-0abc", "us-east-1", "p4d.24xlarge", asg_name="train-spot")
        self.pub = Publisher(self.backend, identity, Sender(self.cw), detail="adaptive", **kw)
        self.pub.start(xid_thread=False)
        self.t = T0

    def minute(self, during=None):
        """One minute; returns the series its window sent as {"Name@gpuN|instance|group"}."""
        before = len(self.cw.calls)
        simulate(self.pub, self.t, 30, every_s=10)
        if during:
            during()
        simulate(self.pub, self.t + timedelta(seconds=30), 30, every_s=10)
        self.pub.close_windows(self.t + timedelta(seconds=59))
        self.t += timedelta(minutes=1)
        return {label(d) for call in self.cw.calls[before:] for d in call["MetricData"]}

    def last(self, name, where):
        for call in reversed(self.cw.calls):
            for d in call["MetricData"]:
                if label(d) == name + "@" + where:
                    return d
        raise AssertionError("%s@%s not sent" % (name, where))


def label(datum):
    dims = {x["Name"]: x["Value"] for x in datum["Dimensions"]}
    if "GpuIndex" in dims:
        return "%s@gpu%s" % (datum["MetricName"], dims["GpuIndex"])
    return datum["MetricName"] + ("@instance" if "InstanceId" in dims else "@group")


def per_gpu(sent):
    return {s.split("@gpu")[1] for s in sent if "@gpu" in s}


def test_a_quiet_node_sends_only_the_always_on_aggregates():
    node = Node()
    for _ in range(3):
        assert node.minute() == ALWAYS_ON  # 3 instance series + 2 shared by the group, nothing per GPU
    util = node.last("GPUUtilization", "instance")
    assert util["Values"] == [float(10 * i) for i in range(8)] and sum(util["Counts"]) == 48  # 8 GPUs x 6
    memory = node.last("GPUMemoryUsedPercent", "instance")["StatisticValues"]
    assert abs(memory["Maximum"] - 37.0) < 1e-9  # the fullest GPU (GPU 7)
    assert abs(memory["Minimum"] - 30.0) < 1e-9
    assert node.last("NVMLUp", "instance")["Value"] == 1.0


def test_a_gpu_above_the_memory_threshold_sends_its_own_series_with_hysteresis():
    node = Node()
    steps = [50, 72, 65, 61, 58, 65, 69, 70, 40]  # GPU 3's memory, minute by minute
    seen = []
    for percent in steps:
        node.backend.set(3, utilization=80, memory_percent=percent)
        sent = node.minute()
        seen.append(per_gpu(sent))
        assert sent >= ALWAYS_ON
        if per_gpu(sent):
            assert {s.split("@")[0] for s in sent if s.endswith("@gpu3")} == GAUGES
    #       50    72     65     61     58    65    69    70     40
    assert seen == [set(), {"3"}, {"3"}, {"3"}, set(), set(), set(), {"3"}, set()]


def test_detail_thresholds_come_from_the_schema_and_can_be_changed():
    assert (schema.DETAIL_MEMORY_ON_PERCENT, schema.DETAIL_MEMORY_OFF_PERCENT) == (70.0, 60.0)
    node = Node(memory_on_percent=50, memory_off_percent=40)
    node.backend.set(0, utilization=0, memory_percent=55)
    assert per_gpu(node.minute()) == {"0"}
    with pytest.raises(ValueError, match="hysteresis"):
        Node(memory_on_percent=50, memory_off_percent=50)


def test_counters_are_silent_at_zero_and_a_critical_xid_puts_its_gpu_in_detail_for_an_hour():
    node = Node()
    assert not any(name.split("@")[0] in {m.name for m in schema.EVENT_COUNTERS} for name in node.minute())
    sent = node.minute(during=lambda: node.pub.record_xid(1, 79))
    assert {"GPUXidErrors@gpu1", "GPUXidErrors@instance", "GPUXidErrors@group"} <= sent
    assert {"GPUHealthEvents@instance", "GPUHealthEvents@group"} <= sent
    assert node.last("GPUHealthEvents", "instance")["Value"] == 1.0
    assert per_gpu(sent) == {"1"}
    held = [node.minute() for _ in range(59)]
    assert all(per_gpu(s) == {"1"} and "GPUXidErrors@gpu1" not in s for s in held)  # no zeros, still detail
    assert node.minute() == ALWAYS_ON  # an hour after the event: back to the aggregates


def test_an_application_xid_is_counted_but_is_no_health_event():
    node = Node()
    sent = node.minute(during=lambda: node.pub.record_xid(2, 13))  # graphics engine exception: the job's bug
    assert "GPUXidErrors@gpu2" in sent and "GPUHealthEvents@instance" not in sent
    assert {s for s in sent if "@gpu" in s} == {"GPUXidErrors@gpu2"}  # the counter, no detail series
    assert node.minute() == ALWAYS_ON


def test_throttling_hardware_slowdown_is_an_event_power_cap_is_detail_only():
    node = Node()
    node.backend.set(5, utilization=90, memory_percent=40, throttle_reasons=THROTTLE_HW_SLOWDOWN)
    node.backend.set(6, utilization=95, memory_percent=40, throttle_reasons=THROTTLE_SW_POWER_CAP)
    node.backend.set(7, utilization=95, memory_percent=80, throttle_reasons=THROTTLE_SW_POWER_CAP)
    sent = node.minute()
    assert {"GPUThrottleHardwareSlowdown@gpu5", "GPUThrottleHardwareSlowdown@instance"} <= sent
    assert "GPUThrottleHardwareSlowdown@group" not in sent
    assert not any(s.startswith("GPUThrottlePowerCap") and not s.endswith("@gpu7") for s in sent)
    assert "GPUThrottlePowerCap@gpu7" in sent  # GPU 7 is in detail (80 % memory)
    assert per_gpu(sent) == {"5", "7"} and {s for s in sent if s.endswith("@gpu5")} == {
        "GPUThrottleHardwareSlowdown@gpu5"
    }


def test_detail_switched_on_by_config_or_instance_tag_and_off_again():
    everything = {"%s@gpu%d" % (name, i) for name in GAUGES for i in range(8)}
    by_config = Node(detail_gpus="always")
    assert by_config.minute() == ALWAYS_ON | everything
    tagged = Identity("i-0abc", "us-east-1", asg_name="train-spot", detail="on")
    node = Node(identity=tagged)
    assert node.minute() == ALWAYS_ON | everything
    node.pub.set_identity(Identity("i-0abc", "us-east-1", asg_name="train-spot"))  # tag removed
    assert node.minute() == ALWAYS_ON


def test_a_group_found_later_gets_its_series_from_then_on():
    node = Node(identity=Identity("i-0abc", "us-east-1", tags_known=False))
    assert node.minute() == {m.name + "@instance" for m in schema.ADAPTIVE_INSTANCE_METRICS}
    node.pub.set_identity(Identity("i-0abc", "us-east-1", cluster_name="ml", nodegroup_name="infer-gpu"))
    node.minute()
    group = node.last("GPUUtilization", "group")
    assert {x["Name"]: x["Value"] for x in group["Dimensions"]} == {"ClusterName": "ml", "NodegroupName": "infer-gpu"}


def test_high_resolution_subset_follows_the_detail_rule():
    node = Node(high_resolution=True)
    node.backend.set(2, utilization=50, memory_percent=90)
    node.minute()  # GPU 2 enters detail when the first minute closes
    before = len(node.cw.calls)
    node.minute()
    hr = {label(d) for c in node.cw.calls[before:] for d in c["MetricData"] if d.get("StorageResolution") == 1}
    names = {m.name for m in schema.HIGH_RESOLUTION_METRICS}
    assert hr == {"%s@%s" % (n, w) for n in names for w in ("instance", "group", "gpu2")}


def test_every_adaptive_metric_is_in_the_schema_with_a_description():
    for metric in set(schema.ADAPTIVE_INSTANCE_METRICS + schema.DETAIL_GPU_METRICS + schema.EVENT_COUNTERS):
        assert schema.METRICS_BY_NAME[metric.name] is metric and metric.description
    assert schema.GPU_HEALTH_EVENTS.aggregation == schema.COUNTER
    assert schema.DEFAULT_DETAIL == "adaptive" and set(schema.DETAIL_MODES) == {"adaptive", "essential", "full"}
