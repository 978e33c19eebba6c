"""Volcano PodGroups as demand (kubernetes/volcano.py): which phases count, the gang's pods from its Job's tasks
(as Volcano's calcPGMinResources counts them) or from minResources / minMember, the notes, the cap; and
that no document shape raises. Documents from rehearsal/volcano_objects.py (EMULATED, real format)."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.domain.models import QueuedSource
from gpufleet.kubernetes.queued import Limits, QueuedDemand
from gpufleet.kubernetes.volcano import VolcanoObjects, _Task, task_counts, volcano_demand
from rehearsal.volcano_objects import podgroup as bare_podgroup
from rehearsal.volcano_objects import podgroup_of, task, vcjob
from tests.profiles import examples

NOW = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
GPUS_8 = {"nvidia.com/gpu": "32", "requests.nvidia.com/gpu": "32", "cpu": "64", "pods": "4", "count/pods": "4"}


def podgroup(name: str, namespace: str = "default", **options: Any) -> dict[str, Any]:
    """A PodGroup with no Volcano Job, as Kubeflow's training operator makes it for a PyTorchJob (owned by
    it; the operator makes the pods only once the PodGroup is Inqueue): demand from its minResources. A
    PodGroup nobody owns is not (test_a_podgroup_nobody_owns_is_demand_only_once_its_pods_exist)."""
    doc = bare_podgroup(name, namespace, **options)
    doc["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": f"uid-{name}", "controller": True}
    ]
    return doc


def read(*pgs: dict[str, Any], jobs: list[dict[str, Any]] | None = None) -> QueuedDemand:
    return volcano_demand(VolcanoObjects(podgroups=list(pgs), jobs=jobs), NOW)


def shapes(got: QueuedDemand) -> list[tuple[str, float]]:
    return [(p.name, p.gpus) for p in got.waiting]


@pytest.mark.parametrize(
    ("phase", "running", "counted"),
    [
        ("", 0, True),  # the scheduler has not seen it yet: the Job controller treats it as Pending
        ("Pending", 0, True),  # waits to be enqueued: no pod exists (volcano#3804)
        ("Inqueue", 0, True),  # pods may exist and wait: they carry the gang key, merged() drops them
        ("Inqueue", 1, False),  # a pod runs: its pods are the demand, never the gang twice
        ("Running", 4, False),
        ("Unknown", 2, False),
        ("Completed", 0, False),
        ("Bogus", 0, False),
    ],
)
def test_which_phases_count(phase: str, running: int, counted: bool) -> None:
    got = read(podgroup("train", "ml", min_member=4, min_resources=GPUS_8, phase=phase, running=running))
    assert (got.gangs == {"volcano:ml/train"}) is counted
    assert len(got.waiting) == (4 if counted else 0) and got.notes == ()
    assert all(p.gang == "volcano:ml/train" for p in got.waiting)


def test_a_pending_gang_without_its_job_is_min_resources_over_min_member() -> None:
    got = read(podgroup("train", "ml", min_member=4, min_resources=GPUS_8))
    assert shapes(got) == [(f"train[{i}]", 8.0) for i in range(4)]
    assert got.waiting[0].requests == (("cpu", 16.0),)  # the quota keys (pods, count/pods) are not requests
    assert got.waiting[0].since == datetime(2026, 11, 27, 8, 0, tzinfo=UTC)  # created, not last tried


@pytest.mark.parametrize(
    ("min_resources", "min_member", "gpus_each"),
    [
        ({"nvidia.com/gpu": "30"}, 4, 8.0),  # 7.5 rounds up: a GPU is not split across pods
        ({"requests.nvidia.com/gpu": "16"}, 2, 8.0),  # only the quota key: read as the resource
        ({"nvidia.com/gpu": "1", "requests.nvidia.com/gpu": "1"}, 1, 1.0),
        ({"cpu": "64", "memory": "256Gi"}, 4, 0.0),  # no GPU: not GPU demand, nothing said
        ({}, 4, 0.0),
    ],
)
def test_min_resources_split_evenly(min_resources: dict[str, str], min_member: int, gpus_each: float) -> None:
    got = read(podgroup("g", "ml", min_member=min_member, min_resources=min_resources))
    assert [p.gpus for p in got.waiting] == ([gpus_each] * min_member if gpus_each else [])
    assert got.gangs == ({"volcano:ml/g"} if gpus_each else frozenset()) and got.notes == ()


def test_a_jobs_tasks_give_the_shapes_and_a_cpu_task_is_no_gpu_demand() -> None:
    job = vcjob("llm", "ml", tasks=[task("master", 1, gpus=0, requests={"cpu": "2"}), task("worker", 4, gpus=8)])
    pg = podgroup_of(job)
    assert pg["spec"]["minMember"] == 5 and pg["spec"]["minResources"]["nvidia.com/gpu"] == "32"
    got = read(pg, jobs=[job])
    key = f"volcano:ml/llm-{job['metadata']['uid']}"
    assert shapes(got) == [(f"llm-worker[{i}]", 8.0) for i in range(4)]
    assert got.gangs == {key} and {p.owner for p in got.waiting} == {"llm-worker"}
    assert read(pg, jobs=None).waiting != ()  # no Job listed: minResources / minMember instead, still counted


def test_tasks_of_different_shapes_keep_them() -> None:
    job = vcjob("mix", "ml", tasks=[task("big", 2, gpus=8), task("small", 3, gpus=1)])
    got = read(podgroup_of(job), jobs=[job])
    assert sorted(p.gpus for p in got.waiting) == [1.0, 1.0, 1.0, 8.0, 8.0]
    even = read(podgroup_of(job), jobs=[])  # without the Job: 19 GPUs over 5 pods, 4 each
    assert [p.gpus for p in even.waiting] == [4.0] * 5


def test_the_job_is_found_by_name_when_the_reference_has_no_uid() -> None:
    job = vcjob("llm", "ml", tasks=[task("worker", 2, gpus=4)])
    pg = podgroup_of(job)
    del pg["metadata"]["ownerReferences"][0]["uid"]
    assert shapes(read(pg, jobs=[job])) == [("llm-worker[0]", 4.0), ("llm-worker[1]", 4.0)]


def _tasks(*spec: tuple[int, int]) -> list[_Task]:
    return [_Task(f"t{i}", replicas, least, {}) for i, (replicas, least) in enumerate(spec)]


@pytest.mark.parametrize(
    ("tasks", "min_member", "counts"),
    [
        (((4, 4),), 4, [4]),
        (((1, 1), (4, 4)), 5, [1, 4]),
        (((1, 1), (4, 2)), 3, [1, 2]),  # each task's least
        (((2, 1), (4, 1)), 5, [2, 3]),  # each task's least, then the rest in task order
        (((4, 4), (4, 4)), 3, [3, 0]),  # minMember below the leasts: only minMember counts, first pods first
        (((2, 2), (4, 4)), 3, [2, 1]),
        (((2, 2), (1, 1)), 4, None),  # the replicas cannot make minMember: never starts
    ],
)
def test_task_counts_follow_volcanos_calc_pg_min_resources(
    tasks: tuple[tuple[int, int], ...], min_member: int, counts: list[int] | None
) -> None:
    assert task_counts(_tasks(*tasks), min_member) == counts


def test_min_task_member_of_the_podgroup_wins_over_the_tasks_min_available() -> None:
    job = vcjob("j", "ml", tasks=[task("a", 4, gpus=1, min_available=1), task("b", 4, gpus=2, min_available=1)])
    pg = podgroup_of(job)
    pg["spec"]["minMember"], pg["spec"]["minTaskMember"] = 4, {"a": 1, "b": 3}
    assert sorted(p.gpus for p in read(pg, jobs=[job]).waiting) == [1.0, 2.0, 2.0, 2.0]


def test_tasks_are_taken_by_template_priority_then_as_listed() -> None:
    job = vcjob("j", "ml", min_available=2, tasks=[task("low", 2, gpus=1), task("high", 2, gpus=4, priority=100)])
    got = read(podgroup_of(job), jobs=[job])
    assert [(p.gpus, p.priority) for p in got.waiting] == [(4.0, 100), (4.0, 100)]


@pytest.mark.parametrize(
    ("min_member", "resources", "note"),
    [
        (0, {"nvidia.com/gpu": "8"}, "absurd"),
        (-1, {"nvidia.com/gpu": "8"}, "absurd"),
        (10**9, {"nvidia.com/gpu": "8"}, "absurd"),
        (0, {"cpu": "8"}, None),  # asks for no GPU: nothing to say
    ],
)
def test_absurd_min_member_is_told_when_gpus_are_asked(min_member: int, resources: dict[str, str], note: str) -> None:
    got = read(podgroup("g", "ml", min_member=min_member, min_resources=resources))
    assert got.waiting == () and got.gangs == frozenset()
    assert [n.key for n in got.notes] == ([f"volcano:ml/g:{note}"] if note else [])
    assert all(f"minMember {min_member}" in n.text for n in got.notes)


def test_a_job_whose_replicas_cannot_make_min_member_is_told() -> None:
    job = vcjob("j", "ml", min_available=6, tasks=[task("w", 4, gpus=8)])
    got = read(podgroup_of(job), jobs=[job])
    assert got.waiting == () and len(got.notes) == 1
    assert "minMember 6" in got.notes[0].text and "have 4" in got.notes[0].text


def test_the_namespace_budget_keeps_whole_gangs_oldest_first_and_tells_the_rest() -> None:
    limits = Limits(pods_per_namespace=10)
    pgs = [
        podgroup(f"g{i}", "ml", min_member=4, min_resources={"nvidia.com/gpu": "4"}, since=f"2026-11-27T0{i}:00:00Z")
        for i in (3, 1, 2)
    ]
    got = volcano_demand(VolcanoObjects(podgroups=pgs), NOW, limits=limits)
    assert got.gangs == {"volcano:ml/g1", "volcano:ml/g2"} and len(got.waiting) == 8
    assert [(n.key, n.count) for n in got.notes] == [("volcano:cut:namespace:ml", 1)]
    assert "1 PodGroup of namespace ml (4 pods, 4 GPUs) not counted" in got.notes[0].text


def test_priority_is_the_templates_else_zero() -> None:
    job = vcjob("j", "ml", priority_class="high", tasks=[task("w", 1, gpus=1)])
    assert [p.priority for p in read(podgroup_of(job), jobs=[job]).waiting] == [0]  # the class is not resolved
    job["spec"]["tasks"][0]["template"]["spec"]["priority"] = 1000
    assert [p.priority for p in read(podgroup_of(job), jobs=[job]).waiting] == [1000]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(["metadata", "spec", "status", "tasks", "minMember", "minResources", "phase", "name"])
_doc = st.dictionaries(_keys, _json, max_size=5)


def _real() -> tuple[dict[str, Any], dict[str, Any]]:
    job = vcjob("j", "ml", tasks=[task("m", 1, gpus=0), task("w", 2, gpus=8, min_available=1)])
    return podgroup_of(job), job


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(_doc | _json, max_size=3), st.one_of(st.none(), st.lists(_doc | _json, max_size=3)))
def test_no_document_shape_raises(podgroups: list[Any], jobs: list[Any] | None) -> None:
    pg, job = _real()
    got = volcano_demand(VolcanoObjects([*podgroups, pg], None if jobs is None else [*jobs, job]), NOW)
    assert isinstance(got, QueuedDemand) and got.source is QueuedSource.VOLCANO
    assert all(p.gang in got.gangs for p in got.waiting)


_PATHS = [
    ("pg", ("metadata", "name")),
    ("pg", ("metadata", "creationTimestamp")),
    ("pg", ("metadata", "ownerReferences")),
    ("pg", ("metadata", "ownerReferences", 0, "uid")),
    ("pg", ("spec", "minMember")),
    ("pg", ("spec", "minTaskMember")),
    ("pg", ("spec", "minTaskMember", "w")),
    ("pg", ("spec", "minResources")),
    ("pg", ("spec", "minResources", "nvidia.com/gpu")),
    ("pg", ("status",)),
    ("pg", ("status", "phase")),
    ("pg", ("status", "conditions")),
    ("job", ("spec", "tasks")),
    ("job", ("spec", "tasks", 1, "replicas")),
    ("job", ("spec", "tasks", 1, "minAvailable")),
    ("job", ("spec", "tasks", 1, "template")),
    ("job", ("spec", "tasks", 1, "template", "spec", "priority")),
    ("job", ("metadata",)),
]


@settings(max_examples=examples(80), deadline=None)
@given(st.sampled_from(_PATHS), _json)
def test_one_field_of_a_real_document_replaced_by_anything_never_raises(
    path: tuple[str, tuple[Any, ...]], junk: Any
) -> None:
    pg, job = _real()
    doc: Any = pg if path[0] == "pg" else job
    for key in path[1][:-1]:
        doc = doc[key]
    doc[path[1][-1]] = copy.deepcopy(junk)
    got = volcano_demand(VolcanoObjects([pg], [job]), NOW)
    assert all(p.gpus in (4.0, 8.0) for p in got.waiting) or path[1][-1] in ("minResources", "nvidia.com/gpu")
