"""Tenants are bounded by tenant (issue 41, part 4), through the real scaler on moto server with the
cluster's Kubernetes API on loopback (gpufleet_tools.local_kube, EMULATED: Volcano's and Kueue's objects
in their CRDs' JSON, rehearsal/volcano_objects.py and rehearsal/kueue_objects.py). Any tenant may create
queued objects; each finding is one tenant's objects taking another's demand:

- a PodGroup of `minMember: 100000` in team-a took the whole queued budget: team-b's 4 x 8 gang was cut
  and its group stayed at 0. Now it cuts only team-a's demand, told once with the numbers, and team-b's
  group goes 0 -> 4;
- 40 PodGroups of 1 MiB made the cluster's Volcano demand unreadable (the page inflates past 32 MiB): the
  listing now halves its page until one fits, and the demand is read;
- a PodGroup nobody owns and no pod names launched nodes for nothing until the gang give-back: it is now
  not demand (told once), until its pods exist;
- a LocalQueue team-a points at team-b's ClusterQueue counted against team-b's quota: Kueue admits a
  Workload only from a namespace the ClusterQueue's namespaceSelector selects, and so does the reader.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain.notification import Notification
from gpufleet.runtime import build_scaler
from gpufleet.settings import ENV_KUBE_ENDPOINTS
from gpufleet_tools.invoke import LocalLambdaContext
from gpufleet_tools.local_kube import LocalKubeApi, local_kube_api
from rehearsal import fleet
from rehearsal import kueue_objects as kq
from rehearsal import volcano_objects as vc
from tests.integration.conftest import TABLE, Fleet, decisions, queued, tick

pytestmark = pytest.mark.integration
TOKEN = "gpufleet-local-token"
GROUP = "eks:ml/train-gpu"
ON_TRAIN = {"eks.amazonaws.com/nodegroup": "train-gpu"}
NOW = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
POLICY = """
groups:
  - {name: train-gpu, cluster: ml, kind: eks-nodegroup, min: 0, max: 6, scale_out_cooldown_s: 0,
     demand: {kubernetes: {}}}
"""


@pytest.fixture
def api() -> Iterator[tuple[LocalKubeApi, str]]:
    with local_kube_api(LocalKubeApi(tokens={TOKEN})) as served:
        yield served


@pytest.fixture
def train(aws: str, tmp_path: Path) -> Fleet:
    """ml/train-gpu: an EKS node group of p4d.24xlarge (8 GPUs), at 0 of max 6, tagged."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    backing = fleet.create_nodegroup(
        clients, "ml", "train-gpu", min_size=0, max_size=6, desired=0, tags=fleet.MANAGED_TAG,
        instance_type="p4d.24xlarge",
    )  # fmt: skip
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    return Fleet(clients=clients, policy_path=policy, endpoint=aws, backing_asg=backing)


def run_tick(f: Fleet, url: str, at: datetime = NOW, notify_queue: str | None = None) -> tuple[dict[str, Any], float]:
    """One reconcile tick of the real scaler, in process; train-gpu's decision and the tick's seconds."""
    env = f.env(notify_queue=notify_queue) | {ENV_KUBE_ENDPOINTS: json.dumps({"ml": {"url": url, "token": TOKEN}})}
    scaler, idem = build_scaler(Logger(service="tenant"), Metrics(namespace="GPUFleet/Test"), env=env)
    idem.register_lambda_context(LocalLambdaContext("scaler"))  # type: ignore[arg-type]
    started = time.monotonic()
    result = scaler.handle(tick(f"tenant-{at:%H%M%S}", at), at)
    took = time.monotonic() - started
    [d] = [d for d in decisions(result) if d["group"] == GROUP]
    return d, took


def nodegroup_desired(f: Fleet) -> int:
    ng = f.clients.eks.describe_nodegroup(clusterName="ml", nodegroupName="train-gpu")["nodegroup"]
    return int(ng["scalingConfig"]["desiredSize"])


def volcano(kube: LocalKubeApi) -> None:
    kube.install(vc.SCHEDULING, "podgroups")
    kube.install(vc.BATCH, "jobs")


def team_b_gang(kube: LocalKubeApi) -> None:
    """team-b's Volcano Job of 4 workers x 8 GPUs, its PodGroup Pending, no pod yet (volcano#3804)."""
    job = vc.vcjob("allreduce", "team-b", tasks=[vc.task("worker", 4, gpus=8)], since="2026-11-27T08:00:00Z")
    kube.add_object("jobs", job)
    kube.add_object("podgroups", vc.podgroup_of(job))


def kubeflow_owned(pg: dict[str, Any]) -> dict[str, Any]:
    """The PodGroup as Kubeflow's training operator makes it for a PyTorchJob (it owns it)."""
    name = pg["metadata"]["name"]
    pg["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": f"uid-{name}", "controller": True}
    ]
    return pg


def notes_about(queue_url: str, key: str) -> list[Notification]:
    return [n for n in queued(queue_url) if key in (n.incident_key or "")]


def test_one_tenants_huge_podgroup_cuts_only_its_own_demand(train: Fleet, api: tuple[LocalKubeApi, str]) -> None:
    """team-a's PodGroup (minMember 100,000, older) no longer takes team-b's gang's place: team-b's group
    goes 0 -> 4 (before: the 100,000 pods took the whole budget, team-b was cut, 0 -> 0), and team-a's
    cut is told once with the numbers. Its 100,000 pods are never built (the tick's time is measured and
    printed, not asserted)."""
    kube, url = api
    volcano(kube)
    flood = vc.podgroup("flood", "team-a", min_member=100_000, min_resources={"nvidia.com/gpu": "800000"},
                        since="2026-11-27T07:00:00Z")  # fmt: skip
    kube.add_object("podgroups", kubeflow_owned(flood))
    team_b_gang(kube)
    stack = fleet.create_notification_stack(slack_secret=None)
    d, took = run_tick(train, url, notify_queue=stack.queue_url)
    assert (d["action"], d["outcome"], d["current"], d["desired"]) == ("scale-out", "applied", 0, 4), d["reason"]
    assert nodegroup_desired(train) == 4
    run_tick(train, url, NOW + timedelta(minutes=1), notify_queue=stack.queue_url)
    told = notes_about(stack.queue_url, "volcano:cut:namespace:team-a")
    assert len({n.notification_id for n in told}) == 1, told  # one finding, however many ticks repeat it
    assert "1 PodGroup of namespace team-a (100000 pods, 800000 GPUs) not counted" in told[0].reason
    assert "at most 1000 gangs of 10000 pods" in told[0].reason
    assert notes_about(stack.queue_url, "team-b") == []
    print(f"\nthe tick with team-a's 100,000-pod PodGroup took {took:.2f} s")


def test_forty_podgroups_of_one_mib_are_read_by_halving_the_page(train: Fleet, api: tuple[LocalKubeApi, str]) -> None:
    """40 x 1 MiB PodGroups (team-a's, running: not demand) make a 40 MiB page, past the 32 MiB a page may
    inflate to. The listing asks again with half the limit until a page fits (before: the first page
    failed and Volcano's demand was unreadable, team-b's group stayed at 0)."""
    kube, url = api
    volcano(kube)
    blob = "x" * 2**20
    for i in range(40):
        pg = vc.podgroup(f"big-{i:02d}", "team-a", min_member=1, phase="Running", running=1)
        pg["metadata"]["annotations"] = {"team-a.example.com/notes": blob}
        kube.add_object("podgroups", kubeflow_owned(pg))
    team_b_gang(kube)
    d, took = run_tick(train, url)
    assert (d["action"], d["current"], d["desired"]) == ("scale-out", 0, 4), d["reason"]
    limits = [r["query"]["limit"] for r in kube.requests if r["path"].endswith("/podgroups")]
    assert limits[:6] == ["500", "250", "125", "62", "31", "31"], limits  # 31 x 1 MiB fits; then the rest
    print(f"\nthe tick reading 40 PodGroups of 1 MiB took {took:.2f} s ({len(limits)} GETs of podgroups)")


def test_a_podgroup_nobody_owns_launches_nothing_until_its_pods_exist(
    train: Fleet, api: tuple[LocalKubeApi, str]
) -> None:
    """A PodGroup written by hand, with no owner and no pod naming it: nothing will make its pods, so it
    is not demand (before: 0 -> 4, nodes idle until the gang give-back), told once. Once a pod names it,
    its gang counts."""
    kube, url = api
    volcano(kube)
    kube.add_object("podgroups", vc.podgroup("bare", "team-a", min_member=4, min_resources={"nvidia.com/gpu": "32"}))
    stack = fleet.create_notification_stack(slack_secret=None)
    d, _ = run_tick(train, url, notify_queue=stack.queue_url)
    assert (d["action"], d["desired"]) == ("hold", 0), d["reason"]
    assert nodegroup_desired(train) == 0
    [told] = notes_about(stack.queue_url, "volcano:bare:team-a")
    assert "1 PodGroup has no owner in namespace team-a and no pod names them" in told.reason

    kube.add(vc.gang_pod("bare-worker-0", "team-a", "bare"))  # its pods come: the gang is demand
    d, _ = run_tick(train, url, NOW + timedelta(minutes=1))
    assert (d["action"], d["current"], d["desired"]) == ("scale-out", 0, 4), d["reason"]


def test_a_localqueue_pointed_at_another_teams_clusterqueue_takes_none_of_its_quota(
    train: Fleet, api: tuple[LocalKubeApi, str]
) -> None:
    """ClusterQueue team-b (32 GPUs) selects namespaces labelled team=b. team-a's LocalQueue points at it
    anyway, with an older 4 x 8 Workload. Kueue would never admit it there (namespaceSelector), so it is
    not counted and team-b's 2 x 8 Workload is: 0 -> 2 (before: team-a's took team-b's quota, 0 -> 4, and
    team-b's was told to wait for quota)."""
    kube, url = api
    kube.add_namespace("team-a", {"team": "a"})
    kube.add_namespace("team-b", {"team": "b"})
    kube.install(kq.API_VERSION, *kq.PLURALS)
    kube.add_object("resourceflavors", kq.resource_flavor("train", ON_TRAIN))
    queue = kq.cluster_queue("team-b", {"train": {"nvidia.com/gpu": 32, "cpu": 1000, "memory": "10Ti"}})
    queue["spec"]["namespaceSelector"] = {"matchLabels": {"team": "b"}}
    kube.add_object("clusterqueues", queue)
    kube.add_object(
        "localqueues", kq.local_queue("team-a", "borrowed", "team-b"), kq.local_queue("team-b", "q", "team-b")
    )
    kube.add_object("workloads", kq.workload("team-a", "grab", "borrowed", [kq.pod_set(count=4)],
                                             created="2026-11-27T07:00:00Z"))  # fmt: skip
    kube.add_object("workloads", kq.workload("team-b", "train", "q", [kq.pod_set(count=2)]))
    stack = fleet.create_notification_stack(slack_secret=None)
    d, _ = run_tick(train, url, notify_queue=stack.queue_url)
    assert (d["action"], d["current"], d["desired"]) == ("scale-out", 0, 2), d["reason"]
    assert any(r["path"] == "/api/v1/namespaces" for r in kube.requests)  # read: a selector has terms
    [told] = notes_about(stack.queue_url, "kueue:team-b:namespace")
    assert "1 Workload (32 GPUs) is queued to ClusterQueue team-b from namespace team-a" in told.reason
    assert "its namespaceSelector does not select" in told.reason
