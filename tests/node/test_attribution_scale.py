"""Node-side attribution at scale (issue 29): matching the kubelet's allocations to processes is linear in
time-sliced holders, and the attribution cache holds 10,000 live processes without thrashing. Work is
counted (touches of Workload objects, /proc reads), never timed. Python >= 3.9."""

import tracemalloc
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from gpufleet_node.attribution import ENTRY_BYTES, MAX_ENTRIES, Attributor
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import ProcessUse
from gpufleet_node.podresources import allocations_from
from gpufleet_node.sender import Sender
from gpufleet_node.tracker import UsageTracker
from gpufleet_node.workload import POD, Workload

GPUS = ["GPU-%08d-0000-4000-8000-000000000000" % i for i in range(8)]
T0 = datetime(2026, 11, 26, 10, 0, tzinfo=timezone.utc)


def kubelet_answer(pods):
    """A ListPodResourcesResponse's shape: pod i holds one time-slicing replica of each of the 8 GPUs."""
    listed = []
    for i in range(pods):
        ids = ["%s::%d" % (gpu, i) for gpu in GPUS]
        devices = [SimpleNamespace(resource_name="nvidia.com/gpu.shared", device_ids=ids)]
        container = SimpleNamespace(name="main", devices=devices)
        listed.append(SimpleNamespace(name="job-%d" % i, namespace="ci", containers=[container]))
    return SimpleNamespace(pod_resources=listed)


class Touches:
    """Counts every read of a Workload's fields and key and every comparison: what matching costs."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ("namespace", "pod", "container", "key"):
            original = getattr(Workload, name)
            setter = getattr(original, "__set__", None) if name != "key" else None
            monkeypatch.setattr(Workload, name, property(self._getter(original), setter))
        equal = Workload.__eq__

        def counted_eq(a, b):
            self.count += 1
            return equal(a, b)

        monkeypatch.setattr(Workload, "__eq__", counted_eq)

    def _getter(self, original):
        def get(workload):
            self.count += 1
            return original.__get__(workload, Workload)

        return get


class OneAnswer:
    def __init__(self, allocations):
        self.allocations = allocations

    def current(self):
        return self.allocations


class PodOwners:
    """Each process is its pod's, named but without its container (so it is placed by the allocations)."""

    def workload_of(self, pid):
        return Workload(POD, namespace="ci", pod="job-%d" % pid)

    def unknown(self):
        return {}


def one_round(pods):
    """One kubelet answer and one sampling round: pod i runs one process on GPU i % 8."""
    allocations = allocations_from(kubelet_answer(pods))
    tracker = UsageTracker(PodOwners(), OneAnswer(allocations), GPUS, Sender(None), Sender(None), 300, 1.0)
    tracker.begin(T0, Identity("i-0node", "us-east-1", "p5.48xlarge", asg_name="train"))
    held = {}
    for index in range(len(GPUS)):
        processes = [ProcessUse(pid, 100.0) for pid in range(index, pods, len(GPUS))]
        held[index] = tracker.holders(index, SimpleNamespace(processes=processes))
    return allocations, held


def test_5000_time_sliced_pods_x_8_ids_cost_linear_work(monkeypatch):
    touches = Touches(monkeypatch)
    costs = {}
    for pods in (500, 5000):
        touches.count = 0
        allocations, held = one_round(pods)
        costs[pods] = touches.count
        assert len(allocations.shared) == 8 and all(len(h) == pods for h in allocations.shared.values())
        assert all(len(holders) == pods for holders in held.values())  # every pod on every GPU, once
        busy = [h for h in held[3] if h.processes]
        assert len(busy) == len(range(3, pods, 8)) and all(h.workload.container == "main" for h in busy)  # placed
    ids = 5000 * len(GPUS)
    print("touches:", costs)
    assert costs[5000] <= 12 * ids  # a few touches per device id (quadratic: ~12,000 per id)
    assert costs[5000] <= 11 * costs[500]  # ten times the pods, about ten times the work


class MemoryProc(Attributor):
    """An Attributor over an in-memory /proc (a FAKE: pid -> cgroup), so 10,000 processes cost no files."""

    def __init__(self, pids, **kw):
        super().__init__(user_name=lambda uid: "u%d" % uid, clock=lambda: self.now, **kw)
        self.now = 0.0
        self.reads = 0  # processes read from "/proc" (cache misses)
        self.files = {}
        for pid in pids:
            self.files[pid] = {
                "stat": "%d (python3) S" % pid + " 0" * 18 + " 4242 0 0\n",
                "status": "Uid:\t1000\t1000\t1000\t1000\n",
                "cgroup": "0::/system.slice/trainer@%d.service\n" % pid,
            }

    def _read(self, pid, name):
        self.reads += name == "cgroup"
        return self.files[pid][name]


def test_10000_live_processes_stay_cached():
    pids = range(1, 10001)
    attr = MemoryProc(pids)
    assert MAX_ENTRIES >= 10000
    for _ in range(3):  # three samples of every live process
        attr.now += 1.0
        assert {attr.workload_of(pid).unit for pid in (1, 10000)} == {"trainer@1.service", "trainer@10000.service"}
        for pid in pids:
            attr.workload_of(pid)
    assert attr.reads == 10000  # each read once; the old 4,096-entry LRU read all 10,000 every sample


@pytest.mark.parametrize("live", [150, 400])
def test_more_live_processes_than_fit_do_not_thrash(live):
    pids = range(1, live + 1)
    attr = MemoryProc(pids, max_entries=100)
    rounds = 5
    for _ in range(rounds):
        attr.now += 1.0
        for pid in pids:
            attr.workload_of(pid)
    assert attr.reads == live + (rounds - 1) * (live - 100)  # the 100 kept keep hitting; only the rest re-read
    assert "more live GPU processes than the cache holds (100)" in attr.unknown()["processes"]


def test_gone_processes_make_room_after_keep_s():
    attr = MemoryProc(range(1, 201), max_entries=100, keep_s=60.0)
    for pid in range(1, 101):
        attr.workload_of(pid)
    attr.now += 61.0  # processes 1-100 exited a minute ago; nobody called prune()
    for _ in range(3):
        for pid in range(101, 201):
            attr.workload_of(pid)
    assert attr.reads == 200  # 101-200 took their places and then hit


def test_an_entry_costs_about_entry_bytes():
    """The memory figure Attributor's docstring gives (a pod's entry: the biggest kind)."""
    attr = MemoryProc(range(1, 2001))
    for pid in range(1, 2001):
        attr.files[pid]["cgroup"] = "0::/kubepods.slice/kubepods-pod%032x.slice/cri-containerd-%064x.scope\n" % (
            pid,
            pid,
        )
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for pid in range(1, 2001):
        attr.workload_of(pid)
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    print("bytes per entry:", grown / 2000)
    assert grown / 2000 <= ENTRY_BYTES * 1.5
