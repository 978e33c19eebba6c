"""Kueue Workloads as demand (kubernetes/kueue.py): which Workloads count, as one gang each with the flavor
Kueue would assign, and which are told instead; any document shape reads without raising."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.kubernetes.kueue import KueueObjects, kueue_demand
from gpufleet.kubernetes.queued import QueuedDemand
from rehearsal.kueue_objects import cluster_queue, local_queue, pod_set, resource_flavor, workload
from tests.profiles import examples

NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"
TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


def objects(*workloads: dict[str, Any], quota: int = 32, used: int = 0, **queue: Any) -> KueueObjects:
    """ml/team-a -> ClusterQueue team-a with flavor a100 (tainted, tolerated by the flavor)."""
    flavors = [resource_flavor("a100", {"gpu": "a100"}, node_taints=[TAINT], tolerations=[TAINT])]
    quotas: dict[str, dict[str, str | int]] = {"a100": {GPU: quota, "cpu": 1000, "memory": "10Ti"}}
    cq = cluster_queue("team-a", quotas, {"a100": {GPU: used}}, **queue)
    return KueueObjects(list(workloads), [cq], [local_queue("ml", "team-a", "team-a")], flavors)


def read(found: KueueObjects) -> QueuedDemand:
    return kueue_demand(found, NOW)


def test_a_pending_workload_is_one_gang_with_the_flavors_labels_and_tolerations() -> None:
    got = read(objects(workload("ml", "train", "team-a", [pod_set(count=4, gpus=8)], priority=100)))
    assert len(got.waiting) == 4 and {p.gpus for p in got.waiting} == {8}
    assert got.gangs == {"kueue:ml/job-train-5c8f2"} and {p.gang for p in got.waiting} == got.gangs
    pod = got.waiting[0]
    assert ("gpu", "a100") in pod.node_selector and any(t.key == GPU for t in pod.tolerations)
    assert pod.priority == 100 and pod.owner == "train" and pod.since == datetime(2026, 11, 27, 8, 31, tzinfo=UTC)
    assert got.notes == ()


@pytest.mark.parametrize(
    ("state", "extra"),
    [
        ("admitted", {"cluster_queue": "team-a", "flavor": "a100"}),  # its pods exist: counted as pods
        ("finished", {"cluster_queue": "team-a", "flavor": "a100"}),
        ("pending", {"active": False}),  # deactivated
        ("evicted", {"requeue_at": "2026-11-27T09:05:00Z"}),  # backing off until after now
    ],
)
def test_not_demand_and_nothing_said(state: str, extra: dict[str, Any]) -> None:
    got = read(objects(workload("ml", "train", "team-a", [pod_set(count=2)], state=state, **extra)))
    assert (got.waiting, got.gangs, got.notes) == ((), frozenset(), ())


def test_a_requeue_time_passed_counts_again() -> None:
    got = read(
        objects(workload("ml", "t", "team-a", [pod_set(count=2)], state="evicted", requeue_at="2026-11-27T08:59:00Z"))
    )
    assert len(got.waiting) == 2


def test_quota_used_up_is_told_with_numbers_not_counted() -> None:
    work = [workload("ml", f"t{i}", "team-a", [pod_set(count=1, gpus=4)]) for i in range(3)]
    got = read(objects(*work, quota=32, used=32))
    assert got.waiting == ()
    [note] = got.notes
    assert note.count == 3 and note.key == "kueue:team-a:quota"
    assert note.text.startswith("3 Workloads (12 GPUs) wait for quota in ClusterQueue team-a: nvidia.com/gpu 32 of 32")
    assert "more nodes would not admit them" in note.text


def test_counted_workloads_take_quota_in_kueue_order() -> None:
    """24 GPUs left: the higher priority 16-GPU Workload counts, the 16-GPU one after it waits for quota."""
    low = workload("ml", "low", "team-a", [pod_set(count=2, gpus=8)], priority=1)
    high = workload("ml", "high", "team-a", [pod_set(count=2, gpus=8)], priority=10)
    got = read(objects(low, high, quota=32, used=8))
    assert got.gangs == {"kueue:ml/job-high-5c8f2"}
    assert [n.count for n in got.notes] == [1] and "24 of 32" in got.notes[0].text


def test_first_flavor_with_quota_left_is_chosen_in_order() -> None:
    flavors = [resource_flavor("a100", {"gpu": "a100"}), resource_flavor("h100", {"gpu": "h100"})]
    cq = cluster_queue("team-a", {"a100": {GPU: 8}, "h100": {GPU: 16}}, {"a100": {GPU: 8}})
    work = workload("ml", "t", "team-a", [pod_set(count=2, gpus=8, cpu="0", memory="0")])
    got = read(KueueObjects([work], [cq], [local_queue("ml", "team-a", "team-a")], flavors))
    assert {p.node_selector for p in got.waiting} == {(("gpu", "h100"),)}


def test_an_untolerated_flavor_taint_or_other_selector_skips_the_flavor() -> None:
    flavors = [
        resource_flavor("spot", {"gpu": "a100", "life": "spot"}, node_taints=[TAINT]),  # pod does not tolerate
        resource_flavor("other", {"gpu": "h100"}),  # pod selects gpu=a100
        resource_flavor("ondemand", {"gpu": "a100", "life": "ondemand"}),
    ]
    quotas = {f: {GPU: 8} for f in ("spot", "other", "ondemand")}
    cq = cluster_queue("team-a", quotas)
    work = workload("ml", "t", "team-a", [pod_set(gpus=8, cpu="0", memory="0", node_selector={"gpu": "a100"})])
    got = read(KueueObjects([work], [cq], [local_queue("ml", "team-a", "team-a")], flavors))
    assert dict(got.waiting[0].node_selector) == {"gpu": "a100", "life": "ondemand"}


@pytest.mark.parametrize(
    ("queues", "key", "words"),
    [
        ({"local": []}, "kueue:ml/team-a:localqueue", "LocalQueue ml/team-a, which does not exist"),
        ({"cluster": []}, "kueue:team-a:clusterqueue", "ClusterQueue team-a, which does not exist"),
        ({"stop_policy": "Hold"}, "kueue:team-a:clusterqueue", "is stopPolicy Hold"),
        ({"active": False}, "kueue:team-a:clusterqueue", "is not Active (FlavorNotFound)"),
        ({"local_active": False}, "kueue:ml/team-a:localqueue", "is not Active (ClusterQueueDoesNotExist)"),
    ],
)
def test_queues_that_take_nothing_are_told(queues: dict[str, Any], key: str, words: str) -> None:
    kw = {k: v for k, v in queues.items() if k in ("stop_policy", "active")}
    found = objects(workload("ml", "t", "team-a", [pod_set(count=2)]), **kw)
    if "local" in queues:
        found = KueueObjects(found.workloads, found.cluster_queues, [], found.flavors)
    if "cluster" in queues:
        found = KueueObjects(found.workloads, [], found.local_queues, found.flavors)
    if "local_active" in queues:
        found = KueueObjects(
            found.workloads, found.cluster_queues, [local_queue("ml", "team-a", "x", active=False)], found.flavors
        )
    got = read(found)
    assert got.waiting == () and [n.key for n in got.notes] == [key] and words in got.notes[0].text


@pytest.mark.parametrize(
    ("checks", "key", "words"),
    [
        ({"prov-req": "Pending"}, "kueue:team-a:checks", "admission checks (prov-req Pending)"),
        ({"prov-req": "Retry", "quota": "Ready"}, "kueue:team-a:checks", "(prov-req Retry)"),
        ({"prov-req": "Rejected"}, "kueue:team-a:rejected", "rejected by admission checks (prov-req Rejected)"),
    ],
)
def test_quota_reserved_but_not_admitted_is_told(checks: dict[str, str], key: str, words: str) -> None:
    work = workload(
        "ml", "t", "team-a", [pod_set(count=4)], state="reserved", cluster_queue="team-a", flavor="a100", checks=checks
    )
    got = read(objects(work))
    assert got.waiting == () and [n.key for n in got.notes] == [key] and words in got.notes[0].text
    assert got.notes[0].text.startswith("1 Workload (32 GPUs)")


def test_a_resource_no_group_covers_is_told() -> None:
    work = workload("ml", "t", "team-a", [pod_set(gpus=1, gpu_resource="amd.com/gpu")])
    got = kueue_demand(objects(work), NOW, {GPU: 1.0, "amd.com/gpu": 1.0})
    assert [n.key for n in got.notes] == ["kueue:team-a:uncovered"] and "amd.com/gpu" in got.notes[0].text


def test_pod_sets_are_one_gang_and_a_cpu_only_workload_is_not_gpu_demand() -> None:
    two = workload("ml", "mpi", "team-a", [pod_set("launcher", 1, gpus=0, cpu="1", memory="1Gi"), pod_set("worker", 3)])
    cpu = workload("ml", "etl", "team-a", [pod_set(count=5, gpus=0)])
    got = read(objects(two, cpu))
    assert len(got.waiting) == 3 and got.gangs == {"kueue:ml/job-mpi-5c8f2"}
    assert {p.name for p in got.waiting} == {f"job-mpi-5c8f2/worker[{i}]" for i in range(3)}


def test_a_workload_past_its_namespaces_pod_budget_is_cut_and_told() -> None:
    """100,001 pods in one Workload: past the namespace's 10,000 (defaults.QUEUED_PODS_PER_NAMESPACE),
    cut before a pod is built, told once with the numbers; it takes no quota."""
    work = workload("ml", "huge", "team-a", [pod_set(count=100_001, gpus=1, cpu="0", memory="0")])
    got = read(objects(work, quota=10**6))
    assert got.waiting == () and [n.key for n in got.notes] == ["kueue:cut:namespace:ml"]
    assert "1 Workload of namespace ml (100001 pods, 100001 GPUs) not counted" in got.notes[0].text
    assert "at most 1000 gangs of 10000 pods" in got.notes[0].text


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_KEYS = ["metadata", "spec", "status", "podSets", "conditions", "resourceGroups", "flavors", "nodeTaints"]
_keys = st.sampled_from([*_KEYS, "admission", "requeueState", "count", "template", "queueName", "name"])
_doc = st.dictionaries(_keys, _json, max_size=5)


@settings(max_examples=examples(40), deadline=None)
@given(
    st.lists(_doc | _json, max_size=3),
    st.lists(_doc | _json, max_size=2),
    st.lists(_doc, max_size=2),
    st.lists(_doc, max_size=2),
    st.integers(0, 4),
)
def test_no_document_shape_raises(
    works: list[Any], cqs: list[Any], lqs: list[Any], flavors: list[Any], which: int
) -> None:
    base = objects(workload("ml", "t", "team-a", [pod_set(count=2)]))
    mixed = KueueObjects(
        works + base.workloads[: which % 2], cqs + base.cluster_queues, lqs + base.local_queues, flavors + base.flavors
    )
    got = kueue_demand(mixed, NOW)
    assert isinstance(got, QueuedDemand) and all(p.gang in got.gangs for p in got.waiting)


_PATHS = [
    ("workloads", ("spec", "podSets", 0, "template", "spec")),
    ("workloads", ("spec", "podSets", 0, "count")),
    ("workloads", ("spec", "priority")),
    ("workloads", ("status", "conditions", 0)),
    ("workloads", ("status", "requeueState")),
    ("workloads", ("metadata", "creationTimestamp")),
    ("workloads", ("metadata", "ownerReferences")),
    ("cluster_queues", ("spec", "resourceGroups", 0, "flavors", 0, "resources")),
    ("cluster_queues", ("spec", "resourceGroups", 0, "coveredResources")),
    ("cluster_queues", ("status", "flavorsReservation", 0, "resources", 0, "total")),
    ("local_queues", ("spec", "clusterQueue")),
    ("flavors", ("spec", "nodeTaints")),
    ("flavors", ("spec", "tolerations", 0)),
    ("flavors", ("spec", "nodeLabels")),
]


@settings(max_examples=examples(50), deadline=None)
@given(st.sampled_from(_PATHS), _json)
def test_one_field_of_a_real_document_replaced_by_anything_never_raises(
    path: tuple[str, tuple[Any, ...]], junk: Any
) -> None:
    found = objects(workload("ml", "t", "team-a", [pod_set(count=2)]))
    plural, keys = path
    doc: Any = getattr(found, plural)[0]
    for key in keys[:-1]:
        doc = doc[key]
    doc[keys[-1]] = junk
    got = kueue_demand(found, NOW)
    assert len(got.waiting) in (0, 2) or keys[-1] == "count"
