"""doctor's queued-jobs check (issue 32, access): AmazonEKSViewPolicy covers no custom resources, so on each
cluster whose groups count queued jobs, doctor asks the API which systems are installed (discovery) and,
for each resource the scaler lists, whether it may be listed (one SelfSubjectAccessReview each). A system
not installed is nothing to read; a denial names the resources, the manifest and the group; on EKS an
access entry must carry the group."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import boto3
import pytest
from pydantic import SecretStr

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef
from gpufleet.policy.fleet import parse_policy
from gpufleet.settings import KubeEndpoint
from gpufleet_tools.doctor.core import DemandView, Level, ResourceAccess, _demand_finding, queued_jobs_view
from gpufleet_tools.doctor.queued_access import group_holders
from gpufleet_tools.doctor.service import DemandProbe
from rehearsal.kube_api import KubeApi, kube_api

TOKEN = "gpufleet-local-token"
KUEUE = "kueue.x-k8s.io/v1beta1"
POLICY = parse_policy(
    "groups:\n"
    "  - {name: train, cluster: ml, kind: eks-nodegroup, demand: {kubernetes: {}}}\n"
    "  - {name: infer, cluster: ml, kind: eks-nodegroup, demand: {kubernetes: {queued: [kueue]}}}\n"
    "  - {name: batch, cluster: other, kind: eks-nodegroup, demand: {kubernetes: {queued: []}}}\n"
)


class Probe(DemandProbe):
    """The pod check stood in for (tested elsewhere): only the queued-jobs check talks to the API."""

    def _cluster(self, cluster: str) -> DemandView:
        return DemandView(group="", source=f"cluster {cluster}", found="the API answers")


@pytest.fixture
def served() -> Iterator[tuple[KubeApi, str]]:
    with kube_api(KubeApi(tokens={TOKEN})) as found:
        yield found


def check(url: str) -> list[DemandView]:
    session = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
    endpoint = KubeEndpoint(url=url, token=SecretStr(TOKEN))
    probe = Probe(session.client("eks"), None, None, session, datetime(2026, 11, 27, tzinfo=UTC), {"ml": endpoint})
    groups = [
        GroupObservation(
            ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster=c, name=n), min_size=0, max_size=2, desired=0
        )
        for c, n in (("ml", "train"), ("ml", "infer"), ("other", "batch"))
    ]
    return [v for v in probe.check(POLICY, groups) if v.what.startswith("queued jobs")]


def install_kueue(api: KubeApi) -> None:
    api.install(KUEUE, "workloads", "clusterqueues", "localqueues", "resourceflavors")


def reviews(api: KubeApi) -> list[str]:
    return [r["path"] for r in api.requests if r.get("method") == "POST"]


def test_systems_not_installed_are_nothing_to_read_and_no_review_is_made(served: tuple[KubeApi, str]) -> None:
    api, url = served
    views = check(url)
    # train counts kueue and volcano (the default), infer kueue only, batch neither: one check per system
    assert [(v.group, v.what) for v in views] == [
        ("eks:ml/train", "queued jobs (kueue)"),
        ("eks:ml/train", "queued jobs (volcano)"),
        ("eks:ml/infer", "queued jobs (kueue)"),
    ]
    assert all(_demand_finding(v).level is Level.OK and "is not installed: nothing to read" in v.found for v in views)
    assert reviews(api) == []
    discovered = [r["path"] for r in api.requests if r.get("method") is None]
    assert discovered == ["/apis/kueue.x-k8s.io/v1beta1", "/apis/scheduling.volcano.sh/v1beta1"]


def test_an_installed_system_readable_checks_out_with_one_review_per_resource(served: tuple[KubeApi, str]) -> None:
    api, url = served
    install_kueue(api)
    kueue = check(url)[0]
    assert kueue.problem is None and kueue.doubt is None
    assert "list allowed on workloads.kueue.x-k8s.io, clusterqueues.kueue.x-k8s.io" in kueue.found
    assert "(the scaler's token)" in kueue.found
    assert len(reviews(api)) == 4  # four resources, once for both groups of the cluster


def test_a_refused_resource_is_an_error_naming_it_the_manifest_and_the_group(served: tuple[KubeApi, str]) -> None:
    api, url = served
    install_kueue(api)
    api.refuse = {"workloads", "resourceflavors"}
    finding = _demand_finding(check(url)[0])
    assert finding.level is Level.ERROR
    assert "may not list workloads.kueue.x-k8s.io, resourceflavors.kueue.x-k8s.io:" in finding.text
    assert "clusterqueues" not in finding.text.split(":")[1]  # only what is missing is named
    assert "kubectl apply -f deploy/kubernetes/gpufleet-queued-jobs.yaml" in finding.text
    assert defaults.QUEUED_JOBS_GROUP in finding.text and "counts a queued job only once its pods exist" in finding.text


def test_volcano_jobs_refused_is_a_warning_podgroups_refused_an_error(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.install("scheduling.volcano.sh/v1beta1", "podgroups")
    api.install("batch.volcano.sh/v1alpha1", "jobs")
    api.refuse = {"jobs"}
    volcano = check(url)[1]
    assert _demand_finding(volcano).level is Level.WARNING
    assert "not on jobs.batch.volcano.sh" in (volcano.doubt or "")
    api.refuse = {"podgroups"}
    assert _demand_finding(check(url)[1]).level is Level.ERROR


def test_volcano_without_its_batch_group_reviews_podgroups_only(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.install("scheduling.volcano.sh/v1beta1", "podgroups")
    volcano = check(url)[1]
    assert volcano.found.startswith("list allowed on podgroups.scheduling.volcano.sh (")
    assert len(reviews(api)) == 1


ALLOWED = (ResourceAccess(resource="workloads.kueue.x-k8s.io", allowed=True),)


@pytest.mark.parametrize(
    ("holders", "level", "says"),
    [
        (None, Level.OK, "list allowed on workloads.kueue.x-k8s.io (your credentials)"),
        (("gpufleet-scaler",), Level.OK, "is on the access entry of gpufleet-scaler"),
        ((), Level.ERROR, "no access entry carries the Kubernetes group gpufleet-queued-jobs"),
    ],
)
def test_on_eks_an_access_entry_must_carry_the_group(holders: tuple[str, ...] | None, level: Level, says: str) -> None:
    """The caller may be an admin whose review allows everything: the scaler's role is in the group only
    through an access entry, so one that carries it is looked for."""
    view = queued_jobs_view("ml", "kueue", True, ALLOWED, "your credentials", holders)
    finding = _demand_finding(view)
    assert finding.level is level and says in finding.text
    if level is Level.ERROR:
        assert "--kubernetes-groups gpufleet-node-marks gpufleet-queued-jobs" in finding.text


class FakeEks:
    """Access entries as EKS lists and describes them (ListAccessEntries, DescribeAccessEntry)."""

    def __init__(self, groups: dict[str, list[str]]) -> None:
        self.groups = groups

    def list_access_entries(self, **_: Any) -> dict[str, Any]:
        return {"accessEntries": list(self.groups)}

    def describe_access_entry(self, **kwargs: Any) -> dict[str, Any]:
        arn = kwargs["principalArn"]
        return {"accessEntry": {"principalArn": arn, "kubernetesGroups": self.groups[arn]}}


def test_the_holders_are_the_entries_whose_groups_name_it() -> None:
    arn = "arn:aws:iam::123456789012:role/"
    eks = FakeEks({arn + "scaler": ["gpufleet-node-marks", "gpufleet-queued-jobs"], arn + "spot": []})
    assert group_holders(eks, "ml", defaults.QUEUED_JOBS_GROUP) == ("scaler",)
    assert group_holders(eks, "ml", "nobody") == ()


def test_a_cluster_the_pod_check_cannot_read_is_not_asked_again() -> None:
    """The cluster's problem is said once, by the pod check: no queued-jobs view repeats it."""

    class Unreachable(DemandProbe):
        def _cluster(self, cluster: str) -> DemandView:
            return DemandView(group="", source=f"cluster {cluster}", problem="the endpoint does not answer")

    probe = Unreachable(None, None, None, Any, datetime(2026, 11, 27, tzinfo=UTC))
    group = GroupObservation(
        ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="train"), min_size=0, max_size=2, desired=0
    )
    assert [v.what for v in probe.check(POLICY, [group])] == ["demand source"]
