"""The busy table kept as scale-in protection (aws/busy_marks.py), against fakes of DynamoDB and Auto
Scaling: one ASG that refuses changes no other, our record is written before the protection, a mark of a
node still held by some Auto Scaling group (another group, a warm pool) is never deleted as gone."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.aws.busy_marks import BusyMarks
from gpufleet.domain.busy import OWNED_PREFIX
from tests.unit.test_busy_marks import group, mark

NOW = datetime(2026, 12, 4, 3, 0, tzinfo=UTC)


class FakeTable:
    """DynamoDB as the glue calls it [fake]: a Scan that pages, PutItem, DeleteItem; every call logged."""

    def __init__(self, items: list[dict[str, str]]) -> None:
        self.items = {i["node"]: i for i in items}
        self.calls: list[tuple[str, str]] = []

    def scan(self, **kw: Any) -> dict[str, Any]:
        assert kw["ConsistentRead"] is True
        return {"Items": [{k: {"S": v} for k, v in i.items()} for i in self.items.values()]}

    def put_item(self, TableName: str, Item: dict[str, Any]) -> None:  # noqa: N803 (boto3's names)
        self.calls.append(("put", Item["node"]["S"]))
        self.items[Item["node"]["S"]] = {k: v["S"] for k, v in Item.items()}

    def delete_item(self, TableName: str, Key: dict[str, Any]) -> None:  # noqa: N803
        self.calls.append(("delete", Key["node"]["S"]))
        self.items.pop(Key["node"]["S"], None)


class FakeAutoScaling:
    """SetInstanceProtection, refused for the ASGs in `refuse` (not tagged managed: AccessDenied)."""

    def __init__(self, table: FakeTable, refuse: set[str], held: Collection[str] = ()) -> None:
        self.table, self.refuse, self.held = table, refuse, held
        self.protected: dict[str, bool] = {}

    def set_instance_protection(
        self,
        InstanceIds: list[str],  # noqa: N803 (boto3's names)
        AutoScalingGroupName: str,  # noqa: N803
        ProtectedFromScaleIn: bool,  # noqa: N803
    ) -> None:
        if AutoScalingGroupName in self.refuse:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "SetInstanceProtection")
        for iid in InstanceIds:
            assert not ProtectedFromScaleIn or ("put", OWNED_PREFIX + iid) in self.table.calls  # record first
            self.protected[iid] = ProtectedFromScaleIn

    def describe_auto_scaling_instances(self, InstanceIds: list[str]) -> dict[str, Any]:  # noqa: N803
        return {"AutoScalingInstances": [{"InstanceId": i} for i in InstanceIds if i in self.held]}


def test_one_refusing_asg_changes_no_other() -> None:
    table = FakeTable([mark("i-a", asg="untagged"), mark("i-b", asg="jobs")])
    autoscaling = FakeAutoScaling(table, refuse={"untagged"})
    groups = [group("untagged", ("i-a", False, "InService")), group("jobs", ("i-b", False, "InService"))]
    kept = BusyMarks(table, autoscaling).keep(groups, NOW, prepare=lambda obs: None)
    assert autoscaling.protected == {"i-b": True}
    assert len(kept.failed) == 1 and kept.failed[0].startswith("untagged: ClientError"), kept.failed
    assert [i.protected_from_scale_in for g in kept.groups for i in g.instances] == [False, True]


def test_a_mark_is_deleted_only_once_no_auto_scaling_group_holds_its_node() -> None:
    table = FakeTable([mark("i-gone"), mark("i-warm"), mark("i-here")])
    autoscaling = FakeAutoScaling(table, refuse=set(), held={"i-warm"})  # a warm pool's instance
    BusyMarks(table, autoscaling).keep([group("jobs", ("i-here", True, "InService"))], NOW, prepare=lambda obs: None)
    assert sorted(table.items) == sorted(["AROAWORKERROLEID:i-warm", "AROAWORKERROLEID:i-here"])
