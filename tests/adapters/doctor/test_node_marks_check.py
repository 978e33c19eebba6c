"""doctor's node-marks check (consolidation by attrition): on each cluster where a group drains by
attrition, one SelfSubjectAccessReview says whether nodes may be patched (the cordon's RBAC); a denial is
an error naming the manifest and the group; clusters without such a group are not asked."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import boto3
import pytest
from pydantic import SecretStr

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef
from gpufleet.policy.fleet import parse_policy
from gpufleet.settings import KubeEndpoint
from gpufleet_tools.doctor.core import DemandView, Level, _demand_finding
from gpufleet_tools.doctor.service import DemandProbe
from rehearsal.kube_api import KubeApi, kube_api

TOKEN = "gpufleet-local-token"
POLICY = parse_policy(
    "groups:\n"
    "  - {name: train, cluster: ml, kind: eks-nodegroup, consolidate: attrition, demand: {kubernetes: {}}}\n"
    "  - {name: infer, cluster: ml, kind: eks-nodegroup, consolidate: attrition, demand: {kubernetes: {}}}\n"
    "  - {name: batch, cluster: other, kind: eks-nodegroup, demand: {kubernetes: {}}}\n"
)


class Probe(DemandProbe):
    """The pod check stood in for (tested elsewhere): only the node-marks check talks to the API."""

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
    return [v for v in probe.check(POLICY, groups) if v.what.startswith("node marks")]


def test_a_cluster_that_lets_nodes_be_patched_checks_out_once_for_all_its_groups(served: tuple[KubeApi, str]) -> None:
    api, url = served
    views = check(url)
    assert [v.group for v in views] == ["eks:ml/train", "eks:ml/infer"]  # not batch: it does not drain
    assert all(v.problem is None and "nodes may be patched (the scaler's token" in v.found for v in views)
    reviews = [r for r in api.requests if r.get("method") == "POST"]
    assert [r["path"] for r in reviews] == ["/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"]


def test_a_cluster_that_denies_patch_is_an_error_naming_the_manifest_and_group(served: tuple[KubeApi, str]) -> None:
    api, url = served
    api.may = {"get", "list"}
    view = check(url)[0]
    finding = _demand_finding(view)
    assert finding.level is Level.ERROR
    assert "deploy/kubernetes/gpufleet-node-marks.yaml" in finding.text and defaults.NODE_MARKS_GROUP in finding.text
    assert "no node of the group drains" in finding.text
