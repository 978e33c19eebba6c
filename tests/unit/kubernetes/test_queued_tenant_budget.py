"""Tenants bounded by tenant (issue 41 part 4), the pure readers: the per-namespace budget (gangs and
pods), the shared queue and cluster bounds that cut the namespaces holding the most first, a PodGroup
nobody owns (demand only while a pod names it), and Kueue's ClusterQueue namespaceSelector (absent:
no namespace, `{}`: every one, terms: the Namespace's labels). The integration test
(tests/integration/test_queued_tenant_moto.py) runs the same through the real scaler."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from gpufleet.domain.models import QueuedSource
from gpufleet.kubernetes.kueue import KueueObjects, kueue_demand, namespace_labels, needs_namespaces
from gpufleet.kubernetes.queued import Ask, Budget, Limits
from gpufleet.kubernetes.volcano import VolcanoObjects, volcano_demand
from rehearsal.kueue_objects import cluster_queue, local_queue, pod_set, resource_flavor, workload
from rehearsal.volcano_objects import podgroup as bare_podgroup
from tests.unit.events.test_volcano import podgroup

NOW = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)
GPU = "nvidia.com/gpu"


def gang(ns: str, name: str, pods: int = 4, queue: str = "q") -> Ask:
    return Ask(f"volcano:{ns}/{name}", ns, queue, pods, 8.0 * pods)


def test_a_namespace_past_its_pods_or_gangs_is_cut_whole_and_told_once_with_numbers() -> None:
    budget = Budget(QueuedSource.VOLCANO, "PodGroup", "Queue", Limits(jobs_per_namespace=2, pods_per_namespace=10))
    took = [budget.take(a) for a in (gang("a", "huge", 11), gang("a", "g1"), gang("a", "g2"), gang("a", "g3"))]
    assert took == [False, True, True, False]  # too big alone; then the third gang of a namespace of 2
    assert budget.take(gang("b", "g1"))  # another namespace's budget is its own
    [note] = budget.notes()
    assert (note.key, note.count) == ("volcano:cut:namespace:a", 2)
    assert note.text.startswith("cut: 2 PodGroups of namespace a (15 pods, 120 GPUs) not counted")
    assert "at most 2 gangs of 10 pods in all; 8 of its pods are within it" in note.text


def test_past_the_clusters_bound_the_namespace_holding_the_most_is_cut_first() -> None:
    """team-a's three older gangs and team-b's one, 10 pods allowed: each namespace's first pods go first,
    so team-b's gang stays and team-a's later ones are cut (first come would have cut team-b's)."""
    budget = Budget(QueuedSource.VOLCANO, "PodGroup", "Queue", Limits(pods=10))
    asks = [gang("team-a", "a1"), gang("team-a", "a2"), gang("team-a", "a3"), gang("team-b", "b1")]
    assert [budget.take(a) for a in asks] == [True] * 4
    assert [a.key for a in budget.shared(asks)] == ["volcano:team-a/a1", "volcano:team-b/b1"]
    [note] = budget.notes()
    assert (note.key, note.count) == ("volcano:cut:cluster:team-a", 2) and "at most 10 pods" in note.text


def test_a_queues_bound_is_shared_the_same_way_and_other_queues_are_untouched() -> None:
    budget = Budget(QueuedSource.KUEUE, "Workload", "ClusterQueue", Limits(pods_per_queue=8))
    asks = [
        gang("team-a", "a1", queue="shared"),
        gang("team-a", "a2", queue="shared"),
        gang("team-b", "b1", queue="shared"),
    ]
    asks.append(gang("team-a", "own", queue="team-a"))
    assert [a.key for a in budget.shared(asks)] == ["volcano:team-a/a1", "volcano:team-b/b1", "volcano:team-a/own"]
    [note] = budget.notes()
    assert note.key == "kueue:cut:queue:shared:team-a" and "ClusterQueue shared's queued jobs" in note.text


def test_a_huge_podgroup_is_cut_before_its_pods_are_built_and_leaves_the_others() -> None:
    flood = podgroup("flood", "team-a", min_member=100_000, min_resources={GPU: "800000"}, since="2026-11-27T07:00:00Z")
    team_b = podgroup("train", "team-b", min_member=4, min_resources={GPU: "32"})
    got = volcano_demand(VolcanoObjects(podgroups=[flood, team_b]), NOW)
    assert got.gangs == {"volcano:team-b/train"} and len(got.waiting) == 4
    assert [n.key for n in got.notes] == ["volcano:cut:namespace:team-a"]


def test_a_podgroup_nobody_owns_is_demand_only_once_its_pods_exist() -> None:
    bare = bare_podgroup("bare", "ml", min_member=4, min_resources={GPU: "32"})
    alone = volcano_demand(
        VolcanoObjects(podgroups=[bare, copy.deepcopy(bare) | {"metadata": {"name": "b2", "namespace": "ml"}}]), NOW
    )
    assert alone.waiting == () and alone.gangs == frozenset()
    [note] = alone.notes
    assert (note.key, note.count) == ("volcano:bare:ml", 2)
    assert note.text.startswith("idle: 2 PodGroups have no owner in namespace ml and no pod names them")
    named = volcano_demand(VolcanoObjects(podgroups=[bare], pod_gangs=frozenset({"volcano:ml/bare"})), NOW)
    assert named.gangs == {"volcano:ml/bare"} and len(named.waiting) == 4 and named.notes == ()
    cpu_only = bare_podgroup("etl", "ml", min_member=2, min_resources={"cpu": "4"})
    assert volcano_demand(VolcanoObjects(podgroups=[cpu_only]), NOW).notes == ()  # no GPU asked: nothing to say


def kueue(selector: Any, namespaces: dict[str, Any] | None = None, unreadable: str = "") -> KueueObjects:
    """team-b's ClusterQueue with `selector` (absent when ...), a Workload of 2 x 8 GPUs from team-a."""
    quotas: dict[str, dict[str, str | int]] = {"f": {GPU: 64, "cpu": 1000, "memory": "10Ti"}}
    cq = cluster_queue("team-b", quotas)
    if selector is ...:
        del cq["spec"]["namespaceSelector"]
    else:
        cq["spec"]["namespaceSelector"] = selector
    work = workload("team-a", "grab", "lq", [pod_set(count=2)])
    return KueueObjects(
        [work], [cq], [local_queue("team-a", "lq", "team-b")], [resource_flavor("f")], namespaces, unreadable
    )


def test_a_clusterqueues_namespace_selector_is_kueues() -> None:
    counted = {"kueue:team-a/job-grab-5c8f2"}
    assert kueue_demand(kueue({}), NOW).gangs == counted  # {}: every namespace, no labels needed
    absent = kueue_demand(kueue(...), NOW)  # absent (null): no namespace
    assert absent.gangs == frozenset() and "has no namespaceSelector (it selects no namespace)" in absent.notes[0].text
    team_b = {"matchLabels": {"team": "b"}}
    labels = namespace_labels([{"metadata": {"name": "team-a", "labels": {"team": "a"}}}])
    foreign = kueue_demand(kueue(team_b, labels), NOW)
    assert foreign.gangs == frozenset() and [n.key for n in foreign.notes] == ["kueue:team-b:namespace"]
    assert foreign.notes[0].text == (
        "1 Workload (16 GPUs) is queued to ClusterQueue team-b from namespace team-a, which its namespaceSelector"
        " does not select; Kueue will not admit them there, so they take none of its quota"
    )
    either = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]}
    assert kueue_demand(kueue(either, labels), NOW).gangs == counted
    unknown = kueue_demand(kueue(team_b, None, "403 Forbidden listing namespaces"), NOW)
    assert (
        unknown.gangs == frozenset() and "cannot be checked (403 Forbidden listing namespaces)" in unknown.notes[0].text
    )


def test_namespaces_are_listed_only_for_a_selector_with_terms() -> None:
    queues = [cluster_queue("a", {"f": {GPU: 1}}), {"spec": {}}, {"spec": {"namespaceSelector": None}}]
    assert not needs_namespaces(queues)
    queues[0]["spec"]["namespaceSelector"] = {"matchLabels": {"team": "a"}}
    assert needs_namespaces(queues)
