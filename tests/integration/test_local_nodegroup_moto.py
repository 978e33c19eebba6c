"""`gpufleet local nodegroup` on moto server: an EKS managed node group made on the local stack gets its
backing Auto Scaling group as EKS makes it (moto names one but never creates it: before, every scale of
such a group failed with a moto 500 until the user made the ASG by hand), and the scaler scales it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet_tools import local_kube, local_stack
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet
from tests.integration.test_invoke_events import gpufleet
from tests.integration.test_scaler_moto import eks_low_alarm_on_one_idle_node

pytestmark = pytest.mark.integration


def test_a_local_nodegroup_has_its_backing_asg_and_scales(aws: str, tmp_path: Path) -> None:
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    state = tmp_path / "state"
    state.mkdir()
    try:
        proc = gpufleet(
            "local", "nodegroup", "ml/infer-gpu", "--min", "1", "--max", "5", "--desired", "2", "--dir", str(state),
            extra_env={"AWS_ENDPOINT_URL": aws},
        )  # fmt: skip
    finally:
        local_kube.stop_all(state)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.removeprefix("export GPUFLEET_KUBE_ENDPOINTS=").strip().strip("'"))["ml"]["token"]
    ng = clients.eks.describe_nodegroup(clusterName="ml", nodegroupName="infer-gpu")["nodegroup"]
    backing = ng["resources"]["autoScalingGroups"][0]["name"]
    assert ng["tags"] == fleet.MANAGED_TAG
    [asg] = clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[backing])["AutoScalingGroups"]
    tags = {t["Key"]: t["Value"] for t in asg["Tags"]}
    assert tags == local_stack.eks_backing_asg_tags("ml", "infer-gpu") == fleet.eks_backing_asg_tags("ml", "infer-gpu")
    assert (asg["MinSize"], asg["MaxSize"], asg["DesiredCapacity"], len(asg["Instances"])) == (1, 5, 2, 2)

    policy = tmp_path / "policy.yaml"
    policy.write_text("defaults: {scale_in_step: 1}\n")
    on = Fleet(clients, policy, aws, backing)
    d, busy, idle = eks_low_alarm_on_one_idle_node(on, backing, "local-low")
    assert (d["action"], d["outcome"], d["victims"]) == ("scale-in", "applied", [idle]), d
    assert on.instances(backing) == [busy] and on.nodegroup_desired() == 1
    assert local_stack.sync_nodegroups(aws) == []  # the scale-in decremented the ASG itself: already equal
