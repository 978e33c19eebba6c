"""The Kubernetes node marker against a Kubernetes API on loopback (rehearsal.kube_api, EMULATED): cordon
with gpufleet's annotation and back, idempotent; a node someone else cordoned is never claimed nor
uncordoned, even when the cordon lands between our read and our patch; the node listing's marks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from functools import cache
from typing import Any

import boto3
import pytest
from pydantic import SecretStr

from gpufleet.domain.defaults import DRAIN_ANNOTATION, DRAIN_LABEL, NODE_MARKS_GROUP
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, InstanceObservation
from gpufleet.kubernetes.client import Connection
from gpufleet.kubernetes.cluster import ClusterAccess, PodReader
from gpufleet.kubernetes.marks import KubernetesMarker, MarkFailed, may_patch_nodes
from gpufleet.kubernetes.pods import NodeListing
from gpufleet.settings import KubeEndpoint
from rehearsal.kube_api import KubeApi, kube_api, node, pod

TOKEN = "gpufleet-local-token"
NOW = datetime(2026, 11, 27, 9, 0, tzinfo=UTC)
NAMES = {"i-a": "ip-10-0-0-1.ec2.internal", "i-b": "ip-10-0-0-2.ec2.internal", "i-c": "ip-10-0-0-3.ec2.internal"}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as found:  # one server for the module (its shutdown takes 0.5 s)
        yield found


@pytest.fixture
def served(server: tuple[KubeApi, str]) -> tuple[KubeApi, str]:
    """The module's API with a fresh cluster: three plain nodes, no pods, every verb granted."""
    api, url = server
    api._nodes.clear()
    api._pods.clear()
    api.patches.clear()
    api.may, api.interfere = {"get", "list", "patch"}, None
    api.add_node(*(node(n) for n in NAMES.values()))
    return api, url


@cache
def _clients() -> tuple[boto3.Session, Any]:
    """One session and EKS client for the module (never called: the override gives URL and token)."""
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    return session, session.client("eks")


def access(url: str) -> ClusterAccess:
    session, eks = _clients()
    return ClusterAccess(eks, session, {"ml": KubeEndpoint(url=url, token=SecretStr(TOKEN))})


def group(named: bool = True) -> GroupObservation:
    instances = tuple(InstanceObservation(instance_id=i, node_name=n if named else None) for i, n in NAMES.items())
    ref = GroupRef(kind=GroupKind.EKS_NODEGROUP, name="gpu", cluster="ml")
    return GroupObservation(ref=ref, min_size=0, max_size=9, desired=3, instances=instances)


def marker(url: str) -> KubernetesMarker:
    return KubernetesMarker(access(url), now=lambda: NOW)


def cordoned(api: KubeApi, name: str) -> bool:
    return api.node_doc(name)["spec"].get("unschedulable") is True


def ours(api: KubeApi, name: str) -> bool:
    return DRAIN_ANNOTATION in api.node_doc(name)["metadata"].get("annotations", {})


def test_close_then_reopen_round_trips_and_says_what_it_did(served: tuple[KubeApi, str]) -> None:
    api, url = served
    said = marker(url).close(group(), ["i-a", "i-b"], "surplus: 2 GPUs held of 16")
    assert "cordoned: i-a (ip-10-0-0-1.ec2.internal), i-b (ip-10-0-0-2.ec2.internal)" in said
    for iid in ("i-a", "i-b"):
        assert cordoned(api, NAMES[iid]) and ours(api, NAMES[iid])
    assert not cordoned(api, NAMES["i-c"])
    note = json.loads(api.node_doc(NAMES["i-a"])["metadata"]["annotations"][DRAIN_ANNOTATION])
    assert note == {"at": "2026-11-27T09:00:00+00:00", "reason": "surplus: 2 GPUs held of 16"}
    # A merge patch that carries the resourceVersion read just before it (the precondition).
    assert [p["content_type"] for p in api.patches] == ["application/merge-patch+json"] * 2
    assert all(p["body"]["metadata"]["resourceVersion"] for p in api.patches)
    said = marker(url).reopen(group(), ["i-a", "i-b"])
    assert "uncordoned: i-a" in said
    for iid in ("i-a", "i-b"):
        assert not cordoned(api, NAMES[iid]) and not ours(api, NAMES[iid])


def test_closing_and_reopening_twice_changes_nothing_the_second_time(served: tuple[KubeApi, str]) -> None:
    api, url = served
    marker(url).close(group(), ["i-a"], "surplus")
    assert "already: i-a" in marker(url).close(group(), ["i-a"], "surplus")
    marker(url).reopen(group(), ["i-a"])
    assert "not cordoned: i-a" in marker(url).reopen(group(), ["i-a"])
    assert len(api.patches) == 2  # one cordon, one uncordon


def test_a_node_someone_else_cordoned_is_never_claimed_nor_uncordoned(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.cordon(NAMES["i-c"])  # kubectl cordon: no annotation
    said = marker(url).close(group(), ["i-c"], "surplus")
    assert "someone else's cordon, left alone: i-c" in said
    assert marker(url).reopen(group(), ["i-c"]).endswith("not ours, left alone: i-c (ip-10-0-0-3.ec2.internal)")
    assert cordoned(api, NAMES["i-c"]) and not ours(api, NAMES["i-c"])
    assert api.patches == []


def test_a_cordon_that_lands_between_our_read_and_our_patch_is_not_claimed(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.interfere = lambda a, name: a.cordon(name) if not a.patches else None  # once, before the first patch
    said = marker(url).close(group(), ["i-a"], "surplus")
    assert [p["code"] for p in api.patches] == [409]  # the precondition caught it; read again, left alone
    assert "someone else's cordon, left alone: i-a" in said
    assert cordoned(api, NAMES["i-a"]) and not ours(api, NAMES["i-a"])
    marker(url).reopen(group(), ["i-a"])
    assert cordoned(api, NAMES["i-a"])


def test_an_instance_without_a_node_name_is_skipped_with_a_note_and_the_others_are_marked(
    served: tuple[KubeApi, str],
) -> None:
    api, url = served
    assert marker(url).close(group(named=False), ["i-a", "i-b"], "surplus") == (
        "no Kubernetes node name, skipped: i-a, i-b"
    )
    assert api.patches == [] and not cordoned(api, NAMES["i-a"])
    # One unregistered instance (its kubelet has not joined) does not fail the batch: the named one closes.
    unnamed = InstanceObservation(instance_id="i-new")
    obs = group().model_copy(update={"instances": (*group().instances, unnamed)})
    said = marker(url).close(obs, ["i-new", "i-a"], "surplus")
    assert said == f"cluster ml: cordoned: i-a ({NAMES['i-a']}); no Kubernetes node name, skipped: i-new"
    assert cordoned(api, NAMES["i-a"])
    assert "skipped: i-new" in marker(url).reopen(obs, ["i-new", "i-a"])
    assert not cordoned(api, NAMES["i-a"])


def labelled(api: KubeApi, name: str) -> bool:
    return bool(api.node_doc(name)["metadata"].get("labels", {}).get(DRAIN_LABEL) == "true")


def test_the_drain_label_goes_on_with_the_cordon_and_off_with_it(served: tuple[KubeApi, str]) -> None:
    api, url = served
    marker(url).close(group(), ["i-a"], "surplus")
    assert cordoned(api, NAMES["i-a"]) and ours(api, NAMES["i-a"]) and labelled(api, NAMES["i-a"])
    marker(url).reopen(group(), ["i-a"])
    assert not cordoned(api, NAMES["i-a"]) and not ours(api, NAMES["i-a"]) and not labelled(api, NAMES["i-a"])


def _older_cordon(api: KubeApi, name: str) -> None:
    """A node an older gpufleet cordoned: its annotation, no label."""
    doc = api.node_doc(name)
    doc["spec"]["unschedulable"] = True
    doc["metadata"]["annotations"][DRAIN_ANNOTATION] = '{"reason": "older"}'
    api.add_node(doc)


def test_an_older_cordon_with_the_annotation_alone_is_still_ours(served: tuple[KubeApi, str]) -> None:
    api, url = served
    _older_cordon(api, NAMES["i-a"])
    _older_cordon(api, NAMES["i-b"])
    found = reader(url).read("ml", nodes=NodeListing.ALL)  # the full listing (a group consolidates) knows it
    assert found.nodes is not None and found.nodes[NAMES["i-a"]].ours
    assert "already: i-a" in marker(url).close(group(), ["i-a"], "surplus")
    assert labelled(api, NAMES["i-a"])  # closed again: it gets the label, so the cheap listing finds it
    marker(url).reopen(group(), ["i-b"])
    assert not cordoned(api, NAMES["i-b"]) and not ours(api, NAMES["i-b"])


def reader(url: str, page_size: int = 2) -> PodReader:
    session, eks = _clients()
    return PodReader(eks, session, {"ml": KubeEndpoint(url=url, token=SecretStr(TOKEN))}, page_size=page_size)


def test_the_drained_listing_asks_only_for_gpufleets_labelled_nodes(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.cordon(NAMES["i-c"])  # someone else's: not labelled, not listed
    marker(url).close(group(), ["i-a"], "surplus")
    api.requests.clear()
    found = reader(url, page_size=1).read("ml", nodes=NodeListing.DRAINED)
    assert found.nodes is not None
    assert {n: (s.unschedulable, s.ours) for n, s in found.nodes.items()} == {NAMES["i-a"]: (True, True)}
    asked = [r["query"] for r in api.requests if r["path"] == "/api/v1/nodes"]
    assert asked and all(q.get("labelSelector") == DRAIN_LABEL for q in asked)
    marker(url).reopen(group(), ["i-a"])
    assert reader(url).read("ml", nodes=NodeListing.DRAINED).nodes == {}


@pytest.mark.parametrize(
    ("selector", "listed"),
    [
        ("", {"a", "b", "c"}),
        ("gpufleet.io/drained", {"a"}),
        ("!gpufleet.io/drained", {"b", "c"}),
        ("gpufleet.io/drained=true", {"a"}),
        ("gpufleet.io/drained==true", {"a"}),
        ("pool!=x", {"a", "c"}),  # != also matches a node without the key
        ("pool in (x, y)", {"b", "c"}),
        ("pool notin (x),!gpufleet.io/drained", {"c"}),
    ],
)
def test_the_loopback_api_honours_a_label_selector_on_the_node_list(
    served: tuple[KubeApi, str], selector: str, listed: set[str]
) -> None:
    api, _ = served
    api._nodes.clear()
    labels = {"a": {DRAIN_LABEL: "true"}, "b": {"pool": "x"}, "c": {"pool": "y"}}
    for name, extra in labels.items():
        doc = node(name)
        doc["metadata"]["labels"] |= extra
        api.add_node(doc)
    code, page = api.list_nodes({"labelSelector": selector} if selector else {})
    assert code == 200 and {n["metadata"]["name"] for n in page["items"]} == listed


def test_the_loopback_api_refuses_a_label_selector_it_cannot_parse(served: tuple[KubeApi, str]) -> None:
    api, _ = served
    code, answer = api.list_nodes({"labelSelector": "pool in x"})
    assert code == 400 and answer["reason"] == "BadRequest"


def test_a_refused_patch_names_the_group_the_access_entry_needs(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.may = {"get", "list"}
    with pytest.raises(MarkFailed, match=f"403 Forbidden.*{NODE_MARKS_GROUP}") as raised:
        marker(url).close(group(), ["i-a"], "surplus")
    assert TOKEN not in str(raised.value)


def test_a_node_that_is_gone_is_said_not_failed(served: tuple[KubeApi, str]) -> None:
    _, url = served
    obs = group().model_copy(update={"instances": (InstanceObservation(instance_id="i-z", node_name="gone"),)})
    assert "gone: i-z (gone)" in marker(url).close(obs, ["i-z"], "surplus")


def test_the_access_review_says_whether_nodes_may_be_patched(served: tuple[KubeApi, str]) -> None:
    api, url = served
    server = access(url).server("ml")
    connection = Connection(server, 2.0, 5.0)
    try:
        assert may_patch_nodes(connection)[0] is True
        api.may = {"get", "list"}
        assert may_patch_nodes(connection) == (False, "")
    finally:
        connection.close()


def test_the_node_listing_gives_each_nodes_cordon_and_instance(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.cordon(NAMES["i-c"])
    marker(url).close(group(), ["i-a"], "surplus")
    api.add(pod("train-0", gpus=2))
    api.bind("default", "train-0", NAMES["i-b"])
    session, eks = _clients()
    override = {"ml": KubeEndpoint(url=url, token=SecretStr(TOKEN))}
    found = PodReader(eks, session, override, page_size=2).read("ml", nodes=NodeListing.ALL)
    assert found.nodes is not None and found.nodes_unreadable is None
    states = {n: (s.unschedulable, s.ours, bool(s.instance_id)) for n, s in found.nodes.items()}
    assert states == {
        NAMES["i-a"]: (True, True, True),
        NAMES["i-b"]: (False, False, True),
        NAMES["i-c"]: (True, False, True),
    }
    assert found.gpus_held == {NAMES["i-b"]: 2.0}
    api.may = {"get"}  # list refused: the pods still read, the marks are unknown and say why
    refused = PodReader(eks, session, override).read("ml", nodes=NodeListing.ALL)
    assert refused.nodes is None and "403" in str(refused.nodes_unreadable)
    assert refused.gpus_held == {NAMES["i-b"]: 2.0}
    assert PodReader(eks, session, override).read("ml").nodes is None  # not asked: not read


def test_a_self_managed_asg_whose_rule_names_the_cluster_is_marked_in_that_cluster() -> None:
    from gpufleet.domain.kinds import GroupKind
    from gpufleet.domain.models import GroupObservation, GroupRef
    from gpufleet.kubernetes.marks import _default_cluster

    asg = GroupObservation(ref=GroupRef(kind=GroupKind.ASG, name="gpu-spot"), min_size=0, max_size=4, desired=1)
    assert _default_cluster(asg) is None  # no tag names it
    assert _default_cluster(asg.model_copy(update={"cluster": "ml"})) == "ml"  # the demand source read it there
