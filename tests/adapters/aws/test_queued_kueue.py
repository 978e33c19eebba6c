"""Kueue Workloads read through the pod reader from a Kubernetes API on loopback (rehearsal.kube_api and
rehearsal.kueue_objects, EMULATED): a pending Workload is one gang of waiting pods; an admitted
Workload's pods count once, as pods; a Workload waiting for quota is told; 403 names the ClusterRole."""

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
from rehearsal.kueue_objects import API_VERSION, PLURALS, cluster_queue, local_queue, pod_set, resource_flavor
from rehearsal.kueue_objects import workload as kueue_workload

TOKEN = "gpufleet-local-token"
NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as found:
        yield found


@pytest.fixture
def served(server: tuple[KubeApi, str]) -> tuple[KubeApi, str]:
    """A fresh cluster with Kueue installed: flavor a100, ClusterQueue team-a (32 GPUs), LocalQueue ml/team-a."""
    api, url = server
    api._pods.clear()
    api._objects.clear()
    api.refuse.clear()
    api.install(API_VERSION, *PLURALS)
    api.add_object("resourceflavors", resource_flavor("a100", {"node.kubernetes.io/instance-type": "p4d.24xlarge"}))
    api.add_object("clusterqueues", cluster_queue("team-a", {"a100": {GPU: 32, "cpu": 1000, "memory": "10Ti"}}))
    api.add_object("localqueues", local_queue("ml", "team-a", "team-a"))
    return api, url


@cache
def _clients() -> tuple[boto3.Session, Any]:
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    return session, session.client("eks")


def reader(url: str, page_size: int = 1) -> PodReader:
    session, eks = _clients()
    return PodReader(eks, session, {"ml": KubeEndpoint(url=url, token=SecretStr(TOKEN))}, page_size=page_size)


def read(url: str) -> Any:
    return reader(url).read("ml", queued=(QueuedSource.KUEUE,), now=NOW)


def test_a_pending_workload_of_4_x_8_gpus_is_one_gang_of_4_pods(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.add_object("workloads", kueue_workload("ml", "train", "team-a", [pod_set(count=4, gpus=8)]))
    found = read(url)
    assert [p.gpus for p in found.waiting] == [8, 8, 8, 8]
    assert found.queued_gangs == {"kueue:ml/job-train-5c8f2"} and {p.gang for p in found.waiting} == found.queued_gangs
    assert {p.node_selector for p in found.waiting} == {(("node.kubernetes.io/instance-type", "p4d.24xlarge"),)}
    assert found.queue_notes == () and found.queued_unreadable == ()


def test_an_admitted_workloads_pods_count_once_as_pods(served: tuple[KubeApi, str]) -> None:
    api, url = served
    admitted = kueue_workload(
        "ml", "train", "team-a", [pod_set(count=2)], state="admitted", cluster_queue="team-a", flavor="a100"
    )
    api.add_object("workloads", admitted)
    api.add(pod("train-0", "ml", gpus=8), pod("train-1", "ml", gpus=8))  # its Job unsuspended: the pods wait
    found = read(url)
    assert sorted(p.name for p in found.waiting) == ["train-0", "train-1"]
    assert all(p.gang == "" for p in found.waiting) and found.queued_gangs == frozenset()


def test_workloads_waiting_for_quota_are_told_across_pages(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.add_object("clusterqueues", cluster_queue("team-a", {"a100": {GPU: 32}}, {"a100": {GPU: 32}}))
    api.add_object(
        "workloads",
        *(kueue_workload("ml", f"t{i}", "team-a", [pod_set(gpus=4, cpu="0", memory="0")]) for i in range(3)),
    )
    found = read(url)  # page size 1: three pages of Workloads
    assert found.waiting == ()
    [note] = found.queue_notes
    assert note.count == 3 and note.text.startswith("3 Workloads (12 GPUs) wait for quota in ClusterQueue team-a")


def test_403_on_workloads_names_the_role_and_the_pods_still_read(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.add(pod("infer-0", "ml", gpus=1))
    api.refuse.add("workloads")
    found = read(url)
    assert [p.name for p in found.waiting] == ["infer-0"]
    [why] = found.queued_unreadable
    assert why.startswith("kueue: 403 Forbidden listing workloads") and "gpufleet-queued-jobs.yaml" in why


def test_kueue_not_installed_says_nothing(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api._objects.clear()
    api.add(pod("infer-0", "ml", gpus=1))
    found = read(url)
    assert [p.name for p in found.waiting] == ["infer-0"] and found.queued_unreadable == () and found.queue_notes == ()


def test_a_cluster_serving_only_v1beta2_is_read_there(server: tuple[KubeApi, str]) -> None:
    """Kueue's newer API (v1beta1 deprecated at Kueue's HEAD): the same documents under v1beta2 are read,
    not taken for 'not installed'."""
    api, url = server
    api._pods.clear()
    api._objects.clear()
    api.refuse.clear()
    newer = "kueue.x-k8s.io/v1beta2"

    def moved(doc: dict[str, Any]) -> dict[str, Any]:
        return {**doc, "apiVersion": newer}

    api.install(newer, *PLURALS)
    api.add_object("resourceflavors", moved(resource_flavor("a100", {})))
    api.add_object("clusterqueues", moved(cluster_queue("team-a", {"a100": {GPU: 32, "cpu": 1000, "memory": "10Ti"}})))
    api.add_object("localqueues", moved(local_queue("ml", "team-a", "team-a")))
    api.add_object("workloads", moved(kueue_workload("ml", "train", "team-a", pod_sets=[pod_set(count=2)])))
    found = read(url)
    gangs = [p.gang for p in found.waiting]
    assert len(gangs) == 2 and len(set(gangs)) == 1 and gangs[0].startswith("kueue:ml/")
    assert not found.queued_unreadable
