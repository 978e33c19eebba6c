"""Windows -> datums: exact distributions, statistics, counters, dimensions. Python >= 3.9."""

from datetime import datetime, timedelta, timezone

from fakes import FakeCloudWatch
from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)


def run(backend, seconds=60, identity=None, **kw):
    cw = FakeCloudWatch()
    identity = identity or Identity("i-0abc", "us-east-1", "g5.12xlarge", asg_name="train-spot")
    pub = Publisher(backend, identity, Sender(cw), **kw)
    pub.start(xid_thread=False)
    simulate(pub, T0, seconds)
    pub.finish(T0 + timedelta(seconds=seconds))
    return cw, pub


def dims(d):
    return {x["Name"]: x["Value"] for x in d["Dimensions"]}


def test_one_call_per_minute_for_eight_gpus_with_exact_distributions():
    backend = SimulatedBackend(gpus=8)
    for i in range(8):
        backend.set(i, utilization=10 * i, memory_percent=50)
    cw, _ = run(backend)
    assert len(cw.calls) == 1
    per_gpu = [d for d in cw.datums(schema.GPU_UTILIZATION.name) if "GpuIndex" in dims(d)]
    assert len(per_gpu) == 8
    gpu3 = next(d for d in per_gpu if dims(d)["GpuIndex"] == "3")
    assert gpu3["Values"] == [30.0] and gpu3["Counts"] == [60.0]  # 60 one-second samples
    assert gpu3["Timestamp"] == T0


def test_instance_and_group_series_merge_all_gpus_so_maximum_is_the_busiest():
    backend = SimulatedBackend(gpus=2)
    backend.set(0, 5, 3)
    backend.set(1, 95, 80)
    cw, _ = run(backend)
    util = cw.datums(schema.GPU_UTILIZATION.name)
    instance = next(d for d in util if dims(d) == {"InstanceId": "i-0abc"})
    group = next(d for d in util if dims(d) == {"AutoScalingGroupName": "train-spot"})
    for d in (instance, group):
        assert d["Values"] == [5.0, 95.0] and d["Counts"] == [60.0, 60.0]
    mem = next(d for d in cw.datums(schema.GPU_MEMORY_USED_PERCENT.name) if dims(d) == {"InstanceId": "i-0abc"})
    assert abs(mem["StatisticValues"]["Maximum"] - 80.0) < 1e-9


def test_eks_nodes_publish_under_cluster_and_nodegroup_not_their_asg():
    identity = Identity("i-1", "us-east-1", asg_name="eks-infer-abc", cluster_name="ml", nodegroup_name="infer-gpu")
    cw, _ = run(SimulatedBackend(gpus=1), identity=identity)
    groups = [dims(d) for d in cw.datums(schema.GPU_UTILIZATION.name) if "InstanceId" not in dims(d)]
    assert groups == [{"ClusterName": "ml", "NodegroupName": "infer-gpu"}]


def test_no_image_id_dimension_and_every_name_is_in_the_schema():
    cw, _ = run(SimulatedBackend(gpus=2))
    for d in cw.datums():
        assert d["MetricName"] in schema.METRICS_BY_NAME
        assert set(dims(d)) <= {"InstanceId", "GpuIndex", "AutoScalingGroupName", "ClusterName", "NodegroupName"}
        assert d["Unit"] == schema.METRICS_BY_NAME[d["MetricName"]].unit


def test_a_lost_gpu_is_counted_and_the_others_keep_reporting():
    backend = SimulatedBackend(gpus=2)
    backend.set(0, 50, 50)
    backend.lost.add(1)
    cw, _ = run(backend)
    lost = {dims(d).get("GpuIndex"): d["Value"] for d in cw.datums(schema.GPU_LOST.name) if "GpuIndex" in dims(d)}
    assert lost == {"0": 0.0, "1": 60.0}
    assert {dims(d)["GpuIndex"] for d in cw.datums(schema.GPU_UTILIZATION.name) if "GpuIndex" in dims(d)} == {"0"}


def test_xids_are_counted_per_gpu_with_explicit_zeros():
    backend = SimulatedBackend(gpus=2)
    cw = FakeCloudWatch()
    pub = Publisher(backend, Identity("i-1", "us-east-1"), Sender(cw))
    pub.start(xid_thread=False)
    pub.step(T0)
    pub.record_xid(1, 79)
    pub.record_xid(1, 79)
    pub.finish(T0 + timedelta(seconds=1))
    xid = {dims(d).get("GpuIndex", "instance"): d["Value"] for d in cw.datums(schema.GPU_XID_ERRORS.name)}
    assert xid == {"0": 0.0, "1": 2.0, "instance": 2.0}


def test_high_resolution_subset_every_10_seconds():
    backend = SimulatedBackend(gpus=1)
    backend.set(0, 40, 10)
    cw, _ = run(backend, seconds=60, high_resolution=True)
    hr = [d for d in cw.datums() if d.get("StorageResolution") == 1]
    assert {d["MetricName"] for d in hr} == {m.name for m in schema.HIGH_RESOLUTION_METRICS}
    assert len({d["Timestamp"] for d in hr}) == 6


def test_essential_detail_keeps_only_what_the_controller_reads():
    cw, _ = run(SimulatedBackend(gpus=2), detail="essential")
    names = {d["MetricName"] for d in cw.datums()}
    # GPUHealthEvents is sent only when non-zero, in every mode
    assert names == {m.name for m in schema.ESSENTIAL_METRICS} - {schema.GPU_HEALTH_EVENTS.name}
    full, _ = run(SimulatedBackend(gpus=2))
    assert len(cw.datums()) < len(full.datums()) * 0.7


def test_an_xid_between_windows_is_counted_in_the_next_one():
    cw = FakeCloudWatch()
    pub = Publisher(SimulatedBackend(gpus=1), Identity("i-1", "us-east-1"), Sender(cw))
    pub.start(xid_thread=False)
    pub.record_xid(0, 79)  # before the first window opened
    pub.step(T0)
    pub.finish(T0 + timedelta(seconds=1))
    [xid] = [d for d in cw.datums(schema.GPU_XID_ERRORS.name) if "GpuIndex" in dims(d)]
    assert xid["Value"] == 1.0
