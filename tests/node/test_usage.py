"""Usage windows and the tracker: who held each GPU, busy and idle time, the record and the team series."""

import json
from datetime import datetime, timedelta, timezone

import pytest

from fakes import FakeCloudWatch, FakeLogs
from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import ProcessUse, SimulatedBackend
from gpufleet_node.podresources import Allocations
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import LogSender, Sender
from gpufleet_node.tracker import UsageTracker, merge_holders
from gpufleet_node.usage import Holder, UsageWindow, split_record, team_datums
from gpufleet_node.workload import POD, SLURM, UNIT, UNKNOWN_WORKLOAD, Workload

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)
TRAINER = Workload(POD, namespace="team-a", pod="trainer-0", container="main")
NOTEBOOK = Workload(POD, namespace="team-b", pod="notebook-1", container="jupyter")
JOB = Workload(SLURM, job_id="4242", user="alice")


def rows(window: UsageWindow):
    record = window.record("i-0node", "g5.12xlarge", "asg:train")
    names = {ref: Workload.from_record(doc).key for ref, doc in record["w"].items()}
    return {(r[0], names.get(r[1])): r[2:] for r in record["u"]}


def test_a_pod_that_requested_two_gpus_and_uses_one():
    w = UsageWindow(T0, 300, 2)
    for _ in range(300):
        w.add(0, 1.0, 90.0, [Holder(TRAINER, 30000.0, None, 1)])
        w.add(1, 1.0, 0.0, [Holder(TRAINER)])  # allocated by the kubelet, no process
    got = rows(w)
    assert got[(0, TRAINER.key)] == [300.0, 270.0, 0.0, 30000.0]
    assert got[(1, TRAINER.key)] == [300.0, 0.0, 300.0, 0.0]


@pytest.mark.parametrize(
    ("util", "holders", "expected"),
    [
        # nobody holds it: unallocated, idle when utilization <= IDLE_UTIL_PERCENT
        (3.0, [], {None: [1.0, 0.03, 1.0]}),
        # two pods time-slicing with per-process SM shares: busy follows each one's own share, capped at
        # the half of the time each holds (the trainer used 60 % of the GPU: counted fully busy, 0.5)
        (
            80.0,
            [Holder(TRAINER, 100, 60.0, 1), Holder(NOTEBOOK, 100, 2.0, 1)],
            {"t": [0.5, 0.5, 0.0], "n": [0.5, 0.02, 0.5]},
        ),
        # shares unknown: busy goes to the holders that run a process (capped); the allocated-only pod gets none
        (80.0, [Holder(TRAINER, 100, None, 1), Holder(NOTEBOOK)], {"t": [0.5, 0.5, 0.0], "n": [0.5, 0.0, 0.5]}),
        # one holder, shares unknown, busy GPU: all of it
        (50.0, [Holder(JOB, 100, None, 2)], {"j": [1.0, 0.5, 0.0]}),
    ],
)
def test_one_sample_is_split_between_holders(util, holders, expected):
    w = UsageWindow(T0, 300, 1)
    w.add(0, 1.0, util, holders)
    keys = {"t": TRAINER.key, "n": NOTEBOOK.key, "j": JOB.key, None: None}
    got = rows(w)
    for short, (held, busy, idle) in expected.items():
        assert got[(0, keys[short])][:3] == pytest.approx([held, busy, idle], abs=0.05)


def test_record_is_compact_and_readable_back():
    w = UsageWindow(T0, 300, 4)
    w.add(0, 300.0, 90.0, [Holder(TRAINER, 1000.0, None, 1)])
    w.add(2, 300.0, 50.0, [Holder(JOB, 500.0, None, 1)])
    w.add(3, 300.0, 0.0, [])
    w.unknown["allocations"] = "kubelet socket not found"
    record = w.record("i-0node", "g5.12xlarge", "asg:train")
    assert record["v"] == schema.USAGE_RECORD_VERSION and record["start"] == "2026-11-23T10:00:00Z"
    assert record["gpus"] == 4 and record["group"] == "asg:train" and record["gone"]
    assert len(record["u"]) == 3 and all(len(r) == len(schema.USAGE_ROW_FIELDS) for r in record["u"])
    assert {Workload.from_record(d).key for d in record["w"].values()} == {TRAINER.key, JOB.key}
    assert [r[1] for r in record["u"] if r[0] == 3] == [None]


def test_team_hours_and_their_series():
    w = UsageWindow(T0, 300, 2)
    w.add(0, 3600.0, 50.0, [Holder(TRAINER, 1.0, None, 1)])
    w.add(1, 3600.0, 0.0, [])
    hours = w.team_hours()
    assert hours == {"team-a": (1.0, 0.5), schema.TEAM_UNALLOCATED: (1.0, 0.0)}
    datums = team_datums(hours, T0)
    assert {(d["MetricName"], d["Dimensions"][0]["Value"]) for d in datums} == {
        (m.name, team) for m in schema.TEAM_METRICS for team in ("team-a", schema.TEAM_UNALLOCATED)
    }
    assert all([x["Name"] for x in d["Dimensions"]] == [schema.DIM_TEAM] for d in datums)  # fleet-wide series


def test_an_unnamed_process_on_a_gpu_allocated_to_one_pod_is_that_pods():
    unnamed = Workload(POD, pod_uid="0f1e", container_id="abc")
    merged = merge_holders([Holder(unnamed, 900.0, 40.0, 1), Holder(UNKNOWN_WORKLOAD, 100.0, 10.0, 1)], [TRAINER])
    assert [(h.workload.key, h.memory_mib, h.sm_util, h.processes) for h in merged] == [(TRAINER.key, 1000.0, 50.0, 2)]
    # two pods allocated (time-slicing): an unnamed process cannot be placed, it stays apart
    apart = merge_holders([Holder(unnamed, 900.0, None, 1)], [TRAINER, NOTEBOOK])
    assert {h.workload.key for h in apart} == {unnamed.key, TRAINER.key, NOTEBOOK.key}


class FakeAttributor:
    def __init__(self, owners):
        self.owners = owners

    def workload_of(self, pid):
        return self.owners.get(pid, UNKNOWN_WORKLOAD)

    def unknown(self):
        return {"processes": "pid 77 gone before it was read"} if 77 in self.owners else {}


class FakePods:
    """What PodResourcesReader.current() answers (podresources.Allocations), without a kubelet."""

    def __init__(self, by_device, unknown=None, shared=None):
        self.allocations = Allocations(by_device, unknown, shared)

    def current(self):
        return self.allocations


def tracked_publisher(logs, cloudwatch, pods):
    backend = SimulatedBackend(gpus=2)
    identity = Identity("i-0node", "us-east-1", "g5.12xlarge", cluster_name="prod", nodegroup_name="gpu-a")
    metrics = Sender(cloudwatch)
    usage = UsageTracker(
        FakeAttributor({101: TRAINER}),
        pods,
        [backend.describe(i).uuid for i in range(2)],
        LogSender(logs, schema.USAGE_LOG_GROUP, identity.instance_id),
        metrics,
        window_s=300,
        sample_s=10.0,
    )
    publisher = Publisher(backend, identity, metrics, detail="adaptive", usage=usage)
    publisher.start(xid_thread=False)
    backend.set(0, 90, 50)
    backend.set(1, 0, 0)
    backend.set_processes(0, [ProcessUse(101, 11000.0, 90.0)])
    backend.set_processes(1, [])
    return publisher, backend


def test_publisher_sends_one_record_per_window_and_team_series():
    logs, cloudwatch = FakeLogs(schema.USAGE_LOG_GROUP), FakeCloudWatch()
    uuids = SimulatedBackend(2).describe
    pods = FakePods({uuids(0).uuid: TRAINER}, shared={uuids(1).uuid: [TRAINER]})
    publisher, _ = tracked_publisher(logs, cloudwatch, pods)
    simulate(publisher, T0, 900, every_s=10.0)
    publisher.finish(T0 + timedelta(seconds=900))
    records = logs.records()
    assert [r["start"] for r in records] == ["2026-11-23T10:00:00Z", "2026-11-23T10:05:00Z", "2026-11-23T10:10:00Z"]
    assert all(r["group"] == "eks:prod/gpu-a" and r["node"] == "i-0node" for r in records)
    u = {r[0]: r[2:] for r in records[0]["u"]}
    assert u[0] == [300.0, 270.0, 0.0, 11000.0] and u[1] == [300.0, 0.0, 300.0, 0.0]
    allocated = sum(d["Value"] for d in cloudwatch.datums(schema.TEAM_GPU_HOURS_ALLOCATED.name))
    assert allocated == pytest.approx(2 * 900 / 3600, rel=1e-4)


def test_unknown_allocations_are_said_in_the_record_and_nothing_stops():
    logs, cloudwatch = FakeLogs(schema.USAGE_LOG_GROUP), FakeCloudWatch()
    publisher, _ = tracked_publisher(logs, cloudwatch, FakePods({}, unknown="kubelet socket not found"))
    simulate(publisher, T0, 300, every_s=10.0)
    publisher.finish(T0 + timedelta(seconds=300))
    [record] = logs.records()
    assert record["gone"] == {"allocations": "kubelet socket not found"}
    assert {r[1] is None for r in record["u"] if r[0] == 1} == {True}  # no pod known: GPU 1 unallocated


def test_a_missing_log_group_backs_off_and_the_records_wait():
    logs = FakeLogs(schema.USAGE_LOG_GROUP, group_exists=False)
    sender = LogSender(logs, schema.USAGE_LOG_GROUP, "i-0node", max_buffer_age=timedelta(hours=2))
    event = {"timestamp": int(T0.timestamp() * 1000), "message": "{}"}
    sender.submit(T0, [event], T0)
    assert sender.failures == 1 and len(sender.buffer) == 1
    logs.group_exists = True
    assert sender.flush(T0 + timedelta(hours=1)) == 1
    assert logs.streams["i-0node"] == [event] and not sender.buffer


def test_a_stalled_loop_does_not_count_as_usage():
    logs, cloudwatch = FakeLogs(schema.USAGE_LOG_GROUP), FakeCloudWatch()
    publisher, _ = tracked_publisher(logs, cloudwatch, None)
    publisher.step(T0)
    publisher.step(T0 + timedelta(seconds=250))  # 25 intervals late: counted as at most 10
    publisher.finish(T0 + timedelta(seconds=260))
    [record] = logs.records()
    assert max(r[2] for r in record["u"]) == pytest.approx(10 + 100)


def test_a_lost_gpu_is_still_paid_for_and_said():
    logs, cloudwatch = FakeLogs(schema.USAGE_LOG_GROUP), FakeCloudWatch()
    publisher, backend = tracked_publisher(logs, cloudwatch, None)
    backend.lost.add(1)
    simulate(publisher, T0, 300, every_s=10.0)
    publisher.finish(T0 + timedelta(seconds=300))
    [record] = logs.records()
    lost = [r for r in record["u"] if r[0] == 1]
    assert lost == [[1, None, 300.0, 0.0, 300.0, 0.0]]  # unallocated and idle: nobody can use it
    assert "GPU 1 lost" in record["gone"]["lost"]
    assert 1 not in publisher.usage.current  # the endpoint no longer shows its last holders


def test_a_busy_gpu_allocated_to_a_pod_with_no_listed_process_is_busy():
    """Graphics work, or NVML not listing processes: the allocated pod gets the GPU's utilization."""
    w = UsageWindow(T0, 300, 1)
    w.add(0, 1.0, 90.0, [Holder(TRAINER)])
    assert rows(w)[(0, TRAINER.key)][:3] == pytest.approx([1.0, 0.9, 0.0])


def test_a_process_whose_container_is_unnamed_is_its_allocated_pods():
    """A pod with several containers whose log entry is missing: named pod, unnamed container."""
    unnamed_container = Workload(POD, namespace="team-a", pod="trainer-0", container_id="ab" * 32)
    [merged] = merge_holders([Holder(unnamed_container, 900.0, 95.0, 1)], [TRAINER])
    assert merged.workload == TRAINER and merged.processes == 1 and merged.sm_util == 95.0


def test_the_team_series_never_name_a_container_or_an_unnamed_pod():
    w = UsageWindow(T0, 300, 3)
    w.add(0, 3600.0, 50.0, [Holder(Workload(POD, pod_uid="0f1e", container_id="abc"), 1.0, None, 1)])
    w.add(1, 3600.0, 50.0, [Holder(Workload(UNIT, unit="docker-" + "ab" * 32 + ".scope"), 1.0, None, 1)])
    w.add(2, 3600.0, 50.0, [Holder(JOB, 1.0, None, 1)])
    assert set(w.team_hours()) == {schema.TEAM_UNKNOWN, "alice"}


def test_a_buffer_as_short_as_one_window_still_sends_the_record():
    logs, cloudwatch = FakeLogs(schema.USAGE_LOG_GROUP), FakeCloudWatch(fail_next=1)
    backend = SimulatedBackend(gpus=1)
    identity = Identity("i-0node", "us-east-1", "g5.xlarge", asg_name="train")
    sender = LogSender(logs, schema.USAGE_LOG_GROUP, "i-0node", max_buffer_age=timedelta(seconds=300))
    usage = UsageTracker(FakeAttributor({}), None, ["GPU-0"], sender, Sender(cloudwatch), 300, 10.0)
    usage.begin(T0, identity)
    usage.add(0, backend.sample(0))
    usage.begin(T0 + timedelta(seconds=301), identity)  # the window closes 301 s after it started
    assert len(logs.records()) == 1 and sender.dropped_windows == 0


def test_reasons_in_the_record_are_counted_kinds_not_pids():
    class Forgetful(FakeAttributor):
        def unknown(self):
            return {"processes": "process 10010 exited before /proc/10010/cgroup was read"}

    logs = FakeLogs(schema.USAGE_LOG_GROUP)
    identity = Identity("i-0node", "us-east-1", "g5.xlarge", asg_name="train")
    sender = LogSender(logs, schema.USAGE_LOG_GROUP, "i-0node")
    usage = UsageTracker(Forgetful({}), None, ["GPU-0"], sender, Sender(FakeCloudWatch()), 300, 10.0)
    usage.begin(T0, identity)
    usage.add(0, SimulatedBackend(1).sample(0))
    usage.close(T0 + timedelta(seconds=300), identity)
    assert logs.records()[0]["gone"] == {"processes": "process N exited before /proc/N/cgroup was read"}


def test_mig_allocations_are_said_not_guessed():
    mig = Workload(POD, namespace="team-c", pod="small-0", container="main")
    logs = FakeLogs(schema.USAGE_LOG_GROUP)
    identity = Identity("i-0node", "us-east-1", "p4d.24xlarge", asg_name="train")
    sender = LogSender(logs, schema.USAGE_LOG_GROUP, "i-0node")
    pods = FakePods({"MIG-5a1c0f6e-0000-0000-0000-000000000000": mig})
    usage = UsageTracker(FakeAttributor({}), pods, ["GPU-0"], sender, Sender(FakeCloudWatch()), 300, 10.0)
    usage.begin(T0, identity)
    usage.add(0, SimulatedBackend(1).sample(0))
    usage.close(T0 + timedelta(seconds=300), identity)
    [record] = logs.records()
    assert record["gone"]["allocations mig"].startswith("MIG devices allocated")
    assert [r[1] for r in record["u"]] == [None]


def test_a_record_too_big_for_one_log_event_is_split_without_losing_a_row():
    """CloudWatch Logs refuses events over 256 KB: a node with many time-sliced pods could pass it."""
    w = UsageWindow(T0, 300, 8)
    pods = [Workload(POD, namespace="ci", pod="job-%d" % i, container="runner") for i in range(64)]
    for gpu in range(8):
        w.add(gpu, 300.0, 50.0, [Holder(p, 10.0, 1.0, 1) for p in pods[gpu * 8 : gpu * 8 + 8]])
    record = w.record("i-0node", "p4d.24xlarge", "asg:ci")
    parts = [json.loads(text) for text in split_record(record, max_bytes=4000)]
    assert len(parts) > 1 and all(len(json.dumps(p, separators=(",", ":"))) <= 4000 for p in parts)
    assert sorted(r for p in parts for r in p["u"]) == sorted(record["u"])
    for p in parts:
        assert {r[1] for r in p["u"]} == set(p["w"]) and p["start"] == record["start"]
    assert split_record(record) == [json.dumps(record, separators=(",", ":"))]  # the real limit: one part


def test_big_records_go_in_calls_within_put_log_events_byte_limit():
    logs = FakeLogs(schema.USAGE_LOG_GROUP)
    sender = LogSender(logs, schema.USAGE_LOG_GROUP, "i-0node")
    stamp = int(T0.timestamp() * 1000)
    sender.submit(T0, [{"timestamp": stamp, "message": "x" * 190_000} for _ in range(12)], T0)
    # 5 + 5 + 2 under 1 MB each, after the first call found no stream and created it
    assert logs.calls == 4 and len(logs.streams["i-0node"]) == 12 and sender.calls == 3
