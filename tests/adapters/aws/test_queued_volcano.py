"""Volcano PodGroups read through the pod reader from a Kubernetes API on loopback (rehearsal.kube_api and
rehearsal.volcano_objects, EMULATED): a Pending gang with no pod is one gang of waiting pods (volcano#3804);
an Inqueue gang's waiting pods count once, as the gang; a gang with a pod running is left to its pods;
without the Jobs (not installed, or 403) the shapes come from minResources; 403 on PodGroups names the
ClusterRole and the pods stay read."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache
from typing import Any

import boto3
import pytest
from pydantic import SecretStr

from gpufleet.domain.models import QueuedSource
from gpufleet.kubernetes.cluster import PodReader
from gpufleet.settings import KubeEndpoint
from rehearsal.kube_api import KubeApi, kube_api, pod
from rehearsal.volcano_objects import BATCH, SCHEDULING, gang_pod, podgroup, podgroup_of, task, vcjob

TOKEN = "gpufleet-local-token"
NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as found:
        yield found


@pytest.fixture
def served(server: tuple[KubeApi, str]) -> tuple[KubeApi, str]:
    """A fresh cluster with Volcano installed (PodGroups and Jobs), no object, no pod."""
    api, url = server
    api._pods.clear()
    api._objects.clear()
    api.refuse.clear()
    api.install(SCHEDULING, "podgroups")
    api.install(BATCH, "jobs")
    return api, url


@cache
def _clients() -> tuple[boto3.Session, Any]:
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    return session, session.client("eks")


def read(url: str) -> Any:
    session, eks = _clients()
    reader = PodReader(eks, session, {"ml": KubeEndpoint(url=url, token=SecretStr(TOKEN))}, page_size=1)
    return reader.read("ml", queued=(QueuedSource.VOLCANO,), now=NOW)


def llm(phase: str = "Pending", running: int = 0) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A Volcano Job of 1 CPU master and 4 workers of 8 GPUs, its PodGroup, and the gang's key."""
    job = vcjob("llm", "ml", tasks=[task("master", 1, gpus=0, requests={"cpu": "2"}), task("worker", 4, gpus=8)])
    pg = podgroup_of(job, phase=phase, running=running)
    return job, pg, f"volcano:ml/{pg['metadata']['name']}"


def test_a_pending_gang_with_no_pod_is_demand(served: tuple[KubeApi, str]) -> None:
    api, url = served
    job, pg, key = llm()
    api.add_object("jobs", job)
    other = podgroup("other", "ml", min_member=2, min_resources={"nvidia.com/gpu": "2"})
    # an operator's PodGroup (Kubeflow's): owned, so demand before its pods exist (issue 41)
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "other", "uid": "uid-other"}
    other["metadata"]["ownerReferences"] = [dict(owner, controller=True)]
    api.add_object("podgroups", pg, other)
    found = read(url)  # page size 1: both PodGroups over two pages
    assert sorted((p.name, p.gpus) for p in found.waiting if p.gang == key) == [
        (f"llm-worker[{i}]", 8.0) for i in range(4)
    ]
    assert found.queued_gangs == {key, "volcano:ml/other"} and len(found.waiting) == 6
    assert found.queue_notes == () and found.queued_unreadable == ()


def test_an_inqueue_gangs_waiting_pods_count_once(served: tuple[KubeApi, str]) -> None:
    api, url = served
    job, pg, key = llm(phase="Inqueue")
    api.add_object("jobs", job)
    api.add_object("podgroups", pg)
    api.add(*(gang_pod(f"llm-worker-{i}", "ml", pg["metadata"]["name"]) for i in range(2)))
    api.add(pod("infer-0", "ml"))  # a pod of no gang: counted as before
    found = read(url)
    assert sorted(p.name for p in found.waiting) == ["infer-0", *(f"llm-worker[{i}]" for i in range(4))]
    assert found.queued_gangs == {key}


def test_a_gang_with_a_pod_running_is_left_to_its_pods(served: tuple[KubeApi, str]) -> None:
    api, url = served
    job, pg, _ = llm(phase="Inqueue", running=1)
    api.add_object("jobs", job)
    api.add_object("podgroups", pg)
    api.add(gang_pod("llm-worker-3", "ml", pg["metadata"]["name"]))
    found = read(url)
    # the pod, not the gang: a pod on its own (review R5: a Running gang's extra replicas start one by one)
    assert [(p.name, p.gang) for p in found.waiting] == [("llm-worker-3", "")]
    assert found.queued_gangs == frozenset()


@pytest.mark.parametrize("jobs", ["not installed", "forbidden"])
def test_without_the_jobs_the_shapes_come_from_min_resources(served: tuple[KubeApi, str], jobs: str) -> None:
    api, url = served
    job, pg, key = llm()
    if jobs == "forbidden":
        api.add_object("jobs", job)
        api.refuse.add("jobs")
    else:
        api._objects.pop((BATCH, "jobs"))
    api.add_object("podgroups", pg)
    found = read(url)
    # minResources: 32 GPUs and 2 cpu, minMember 5: 32 does not split into whole GPUs over 5 pods, so the
    # fewest pods of 8 that hold them (the launcher asks for none): 4 pods of 8 (review R1; was 5 of 7)
    assert [(p.name, p.gpus) for p in found.waiting] == [(f"{pg['metadata']['name']}[{i}]", 8.0) for i in range(4)]
    assert found.queued_gangs == {key} and found.queued_unreadable == ()


def test_podgroups_forbidden_names_the_role_and_the_pods_stay(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.add_object("podgroups", llm()[1])
    api.refuse.add("podgroups")
    api.add(pod("infer-0", "ml"))
    found = read(url)
    [why] = found.queued_unreadable
    assert why.startswith("volcano: 403 Forbidden listing podgroups") and "gpufleet-queued-jobs.yaml" in why
    assert [p.name for p in found.waiting] == ["infer-0"] and found.queued_gangs == frozenset()


def test_volcano_not_installed_says_nothing(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api._objects.clear()
    api.add(pod("infer-0", "ml"))
    found = read(url)
    assert [p.name for p in found.waiting] == ["infer-0"]
    assert found.queued_unreadable == () and found.queue_notes == () and found.queued_gangs == frozenset()


def test_an_absurd_podgroup_is_told(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.add_object("podgroups", podgroup("zero", "ml", min_member=0, min_resources={"nvidia.com/gpu": "8"}))
    found = read(url)
    assert found.waiting == () and [n.key for n in found.queue_notes] == ["volcano:ml/zero:absurd"]
