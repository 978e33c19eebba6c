"""IAM conformance for the call issue 30 added to the scaler's demand path: a self-managed ASG's node shape
reads its launch template (ec2:DescribeLaunchTemplateVersions), made for real on moto server and checked
against the scaler's role in the expanded template; without the action the role denies exactly it."""

from __future__ import annotations

import pytest

from gpufleet.aws.asg_shape import asg_node_shape
from rehearsal import fleet
from rehearsal.calls import CallRecord
from tests.conftest import RECORDER, ROOT
from tests.iam.test_conformance import denials

pytestmark = pytest.mark.integration
GRANT = "- ec2:DescribeLaunchTemplateVersions  # a self-managed ASG's instance type"


@pytest.fixture
def shape_calls(aws: str) -> list[CallRecord]:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "gpu-spot", min_size=0, max_size=2, desired=0, tags={"kubernetes.io/cluster/ml": "owned"})
    before = len(RECORDER.records)
    assert asg_node_shape(clients.autoscaling, clients.ec2, "gpu-spot").gpus == 4
    return RECORDER.records[before:]


def test_the_scalers_role_allows_the_self_managed_shapes_calls(shape_calls: list[CallRecord]) -> None:
    actions = {(r.function, r.action) for r in shape_calls}
    assert ("scaler", "ec2:DescribeLaunchTemplateVersions") in actions, actions
    assert denials(shape_calls) == []


def test_a_scaler_role_without_it_is_denied(shape_calls: list[CallRecord]) -> None:
    template = (ROOT / "template.yaml").read_text()
    scaler_at = template.index("  ScalerFunction:\n")
    head, tail = template[:scaler_at], template[scaler_at:]
    assert GRANT in tail
    found = denials(shape_calls, head + tail.replace(GRANT, "- ec2:DescribeImages  #", 1))
    assert found and all(line.startswith("scaler: ec2:DescribeLaunchTemplateVersions on ") for line in found), found
