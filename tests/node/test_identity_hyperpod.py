"""A SageMaker HyperPod node's identity from HyperPod's resource configuration file (real format: see
hyperpod_config.py) and IMDSv2, against a fake IMDS on 127.0.0.1. Python >= 3.9."""

import copy
import json

from hyperpod_config import RESOURCE_CONFIG

from fakes import FakeImds
from gpufleet_node.identity import Identity, Imds, TagRefresher, discover

META = {"instance-id": "i-0a2", "placement/region": "us-west-2", "instance-type": "ml.p5.48xlarge",
        "local-ipv4": "10.1.28.65"}  # fmt: skip


def no_ec2(region):
    raise AssertionError("a HyperPod node's group comes from its resource file, not from EC2 tags")


def write(tmp_path, doc):
    path = tmp_path / "resource_config.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_hyperpod_node_is_its_cluster_and_instance_group(tmp_path):
    config = write(tmp_path, RESOURCE_CONFIG)
    with FakeImds(META, instance_tags=None) as imds:
        identity = discover(Imds(imds.url), no_ec2, resource_config=config)
    assert identity.group_dimensions() == {"ClusterName": "ml-cluster", "InstanceGroupName": "gpu-a"}
    assert identity.group_key() == "hyperpod:ml-cluster/gpu-a"
    assert (identity.instance_id, identity.region, identity.tags_known) == ("i-0a2", "us-west-2", True)
    assert not any("tags" in r for r in imds.requests)


def test_without_instance_ids_in_the_file_the_node_is_found_by_its_ip(tmp_path):
    doc = copy.deepcopy(RESOURCE_CONFIG)
    for group in doc["InstanceGroups"]:
        for inst in group["Instances"]:
            del inst["InstanceId"]
    with FakeImds(META, instance_tags=None) as imds:
        identity = discover(Imds(imds.url), no_ec2, resource_config=write(tmp_path, doc))
    assert identity.group_key() == "hyperpod:ml-cluster/gpu-a"
    assert "GET /latest/meta-data/local-ipv4" in imds.requests


def test_a_file_that_does_not_list_the_node_falls_back_to_tags(tmp_path):
    meta = dict(META, **{"instance-id": "i-other", "local-ipv4": "10.9.9.9"})
    with FakeImds(meta, instance_tags={"aws:autoscaling:groupName": "train"}) as imds:
        identity = discover(Imds(imds.url), no_ec2, resource_config=write(tmp_path, RESOURCE_CONFIG))
    assert identity.group_dimensions() == {"AutoScalingGroupName": "train"}


def test_a_node_without_the_file_is_unchanged(tmp_path):
    """Not HyperPod: the ASG / EKS tags as before, no local-ipv4 asked."""
    tags = {"eks:cluster-name": "ml", "eks:nodegroup-name": "infer-gpu"}
    with FakeImds(META, instance_tags=tags) as imds:
        identity = discover(Imds(imds.url), no_ec2, resource_config=str(tmp_path / "absent.json"))
    assert identity.group_dimensions() == {"ClusterName": "ml", "NodegroupName": "infer-gpu"}
    assert identity.group_key() == "eks:ml/infer-gpu" and not identity.is_hyperpod
    assert "GET /latest/meta-data/local-ipv4" not in imds.requests


def test_the_hyperpod_identity_is_cached_and_a_stale_tag_cache_is_not_trusted(tmp_path):
    cache = str(tmp_path / "identity.json")
    config = write(tmp_path, RESOURCE_CONFIG)
    with FakeImds(META, instance_tags={}) as imds:
        discover(Imds(imds.url), no_ec2, cache, resource_config=str(tmp_path / "absent.json"))  # before the file
        assert not discover(Imds(imds.url), no_ec2, cache, resource_config=str(tmp_path / "absent.json")).is_hyperpod
        identity = discover(Imds(imds.url), no_ec2, cache, resource_config=config)  # the file is there now
        assert identity.is_hyperpod
        asked = len(imds.requests)
        again = discover(Imds(imds.url), no_ec2, cache, resource_config=config)
    assert len(imds.requests) == asked and again.group_key() == "hyperpod:ml-cluster/gpu-a"


def test_tags_read_again_keep_the_instance_group_and_no_refresher_runs(tmp_path):
    identity = Identity("i-0a2", "us-west-2", hyperpod_cluster="ml-cluster", instance_group="gpu-a")
    assert identity.with_tags({"gpufleet:detail": "on"}).group_key() == "hyperpod:ml-cluster/gpu-a"

    class NoReader:
        def read(self):
            raise AssertionError("no tags to read on HyperPod")

    refresher = TagRefresher(NoReader(), identity, lambda new: None)  # type: ignore[arg-type]
    refresher.start()
    assert not refresher._thread.is_alive()
