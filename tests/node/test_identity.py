"""IMDSv2 identity against a fake IMDS on 127.0.0.1 (never 169.254.169.254). Python >= 3.9."""

import json
import logging
import os

import pytest

from fakes import FakeEc2, FakeImds
from gpufleet_node.identity import IdentityUnavailable, Imds, TagReader, TagRefresher, discover

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


def test_a_failed_describe_tags_is_retried_and_the_group_is_cached(tmp_path):
    cache = str(tmp_path / "identity.json")
    ec2 = FakeEc2({"aws:autoscaling:groupName": "train-spot"}, fail_next=1)
    with FakeImds(META, instance_tags=None) as imds:
        identity = discover(Imds(imds.url), lambda region: ec2, cache)  # retried after 1 s
    assert identity.group_dimensions() == {"AutoScalingGroupName": "train-spot"}
    assert ec2.calls == 2
    with open(cache) as f:
        assert json.load(f)["asg_name"] == "train-spot"


def test_no_identity_is_cached_without_its_group_and_the_refresher_finds_it_later(tmp_path):
    cache = str(tmp_path / "identity.json")
    ec2 = FakeEc2({"aws:autoscaling:groupName": "train-spot"}, fail_next=3)
    with FakeImds(META, instance_tags=None) as imds:
        identity = discover(Imds(imds.url), lambda region: ec2, cache, attempts=3, pause_s=0)
        assert identity.group_dimensions() is None and not identity.tags_known
        assert not os.path.exists(cache)  # the next start asks again instead of trusting a failure
        changes = []
        reader = TagReader(Imds(imds.url), lambda: ec2, identity.instance_id)
        refresher = TagRefresher(reader, identity, changes.append, cache)
        assert refresher.refresh()
    assert [c.group_dimensions() for c in changes] == [{"AutoScalingGroupName": "train-spot"}]
    again = discover(Imds("http://127.0.0.1:9", timeout_s=0.5), no_ec2, cache)  # from the cache now
    assert again.group_dimensions() == {"AutoScalingGroupName": "train-spot"}


def test_an_imds_500_on_a_tag_falls_back_to_describe_tags():
    broken = "/latest/meta-data/tags/instance/eks:cluster-name"
    ec2 = FakeEc2(EKS_TAGS)
    with FakeImds(META, instance_tags=EKS_TAGS, errors={broken: 500}) as imds:
        identity = discover(Imds(imds.url), lambda region: ec2)
        assert imds.requests.count("GET " + broken) == 3  # retried before giving up on IMDS tags
    assert identity.group_dimensions() == {"ClusterName": "ml", "NodegroupName": "infer-gpu"}
    assert ec2.calls == 1


def test_a_cache_written_before_tags_were_guaranteed_is_read_again(tmp_path):
    cache = tmp_path / "identity.json"
    cache.write_text(json.dumps({"instance_id": "i-0123", "region": "eu-west-1", "asg_name": None}))
    ec2 = FakeEc2({"aws:autoscaling:groupName": "train-spot"})
    with FakeImds(META, instance_tags=None) as imds:
        identity = discover(Imds(imds.url), lambda region: ec2, str(cache))
    assert identity.group_dimensions() == {"AutoScalingGroupName": "train-spot"}


def test_the_detail_tag_is_read_with_the_group_tags():
    tags = dict(EKS_TAGS, **{"gpufleet:detail": "on"})
    with FakeImds(META, instance_tags=tags) as imds:
        identity = discover(Imds(imds.url), no_ec2)
    assert identity.detail_on()
    ec2 = FakeEc2(dict(tags, **{"gpufleet:detail": "off"}))
    with FakeImds(META, instance_tags=None) as imds:
        assert not discover(Imds(imds.url), lambda region: ec2).detail_on()


def test_the_describe_tags_fallback_asks_for_its_own_instance_only_and_is_said_once(caplog):
    """IAM cannot narrow DescribeTags (no resource types, no condition keys): the call itself does."""
    caplog.set_level(logging.INFO, logger="gpufleet.publisher")
    seen = []

    class Recording(FakeEc2):
        def describe_tags(self, Filters):
            seen.append({f["Name"]: f["Values"] for f in Filters})
            return super().describe_tags(Filters)

    ec2 = Recording({"aws:autoscaling:groupName": "train-spot", "Owner": "someone"})
    with FakeImds(META, instance_tags=None) as imds:
        reader = TagReader(Imds(imds.url), lambda: ec2, "i-0123")
        assert reader.read() == {"aws:autoscaling:groupName": "train-spot"}
        assert reader.read() is not None
    assert all(f["resource-id"] == ["i-0123"] and "Owner" not in f["key"] for f in seen) and len(seen) == 2
    assert caplog.text.count("InstanceMetadataTags") == 1
