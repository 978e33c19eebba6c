"""IMDSv2 identity against a fake IMDS on 127.0.0.1 (never 169.254.169.254). Python >= 3.9."""

import json

import pytest

from fakes import FakeEc2, FakeImds
from gpufleet_node.identity import IdentityUnavailable, Imds, discover

META = {"instance-id": "i-0123", "placement/region": "eu-west-1", "instance-type": "g5.12xlarge"}
EKS_TAGS = {"eks:cluster-name": "ml", "eks:nodegroup-name": "infer-gpu", "aws:autoscaling:groupName": "eks-x"}


def no_ec2(region):
    raise AssertionError("EC2 must not be asked when instance metadata tags are enabled")


def test_imdsv2_token_on_every_request_and_tags_from_instance_metadata():
    with FakeImds(META, instance_tags=EKS_TAGS) as imds:
        identity = discover(Imds(imds.url), no_ec2)
    assert (identity.instance_id, identity.region, identity.instance_type) == ("i-0123", "eu-west-1", "g5.12xlarge")
    assert identity.group_dimensions() == {"ClusterName": "ml", "NodegroupName": "infer-gpu"}
    assert imds.unauthorized == 0
    assert imds.requests[0] == "PUT /latest/api/token"
    assert sum(r.startswith("PUT") for r in imds.requests) == 1  # one token, reused


def test_without_metadata_tags_the_group_comes_from_ec2_describe_tags():
    ec2 = FakeEc2({"aws:autoscaling:groupName": "train-spot", "Name": "x"})
    with FakeImds(META, instance_tags=None) as imds:
        identity = discover(Imds(imds.url), lambda region: ec2)
    assert identity.group_dimensions() == {"AutoScalingGroupName": "train-spot"}
    assert ec2.calls == 1


def test_identity_is_cached_between_restarts(tmp_path):
    cache = str(tmp_path / "identity.json")
    with FakeImds(META, instance_tags={}) as imds:
        discover(Imds(imds.url), no_ec2, cache)
        asked = len(imds.requests)
        again = discover(Imds(imds.url), no_ec2, cache)
    assert len(imds.requests) == asked
    assert again.instance_id == "i-0123"
    with open(cache) as f:
        assert json.load(f)["region"] == "eu-west-1"


def test_unreachable_imds_is_a_clear_error():
    with pytest.raises(IdentityUnavailable, match="IMDSv2"):
        discover(Imds("http://127.0.0.1:9", timeout_s=0.5), no_ec2)
