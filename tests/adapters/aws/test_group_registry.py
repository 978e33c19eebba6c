"""The group registry: one adapter per kind, registered once; the fleet reader asks each group's own
adapter and keeps the groups in the order it was given them."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime

import pytest

from gpufleet.aws.fleet import FleetActuator, FleetReader, GroupRegistry
from gpufleet.aws.groups.asg import AsgGroups, AutoScalingReads
from gpufleet.aws.groups.hyperpod import HyperPodGroups
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Decision,
    GroupObservation,
    GroupRef,
    InstanceObservation,
    MarkChannel,
    Trigger,
    TriggerKind,
)
from gpufleet.policy.fleet import Discovery

NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class MarkingHyperPod(HyperPodGroups):
    """The HyperPod adapter with its Slurm read replaced: every node it is handed runs work."""

    def __init__(self) -> None:
        super().__init__(None)  # type: ignore[arg-type]  # its fleet is never read here
        self.asked: list[list[str]] = []

    def work_marks(
        self, observations: Sequence[GroupObservation], now: datetime, candidates: Mapping[str, Collection[str]] | None
    ) -> list[GroupObservation]:
        self.asked.append([o.ref.key for o in observations])
        return [o.model_copy(update={"instances": _busy(o)}) for o in observations]


def _busy(obs: GroupObservation) -> tuple[InstanceObservation, ...]:
    return tuple(i.model_copy(update={"runs_work": True}) for i in obs.instances)


def _obs(ref: GroupRef) -> GroupObservation:
    return GroupObservation(
        ref=ref, min_size=0, max_size=4, desired=1, instances=(InstanceObservation(instance_id="i-0123456789abcdef0"),)
    )


def test_a_kind_has_one_adapter() -> None:
    registry = GroupRegistry([MarkingHyperPod()])
    with pytest.raises(ValueError, match="has an adapter already"):
        registry.register(MarkingHyperPod())


def test_a_group_of_a_kind_without_an_adapter_is_told_not_guessed() -> None:
    registry = GroupRegistry([MarkingHyperPod()])
    with pytest.raises(LookupError, match="not wired for Auto Scaling groups"):
        registry.provider(GroupKind.ASG)
    assert FleetReader(registry).observe_one(GroupRef(kind=GroupKind.ASG, name="a")) is None


def test_work_marks_ask_each_kinds_adapter_and_keep_the_order() -> None:
    hyperpod = MarkingHyperPod()
    registry = GroupRegistry([AsgGroups(AutoScalingReads(None)), hyperpod])  # type: ignore[arg-type]
    groups = [
        _obs(GroupRef(kind=GroupKind.HYPERPOD, cluster="c", name="g1")),
        _obs(GroupRef(kind=GroupKind.ASG, name="a")),
        _obs(GroupRef(kind=GroupKind.HYPERPOD, cluster="c", name="g2")),
    ]
    marked = FleetReader(registry).work_marks(groups, NOW)
    assert [o.ref.key for o in marked] == ["hyperpod:c/g1", "asg:a", "hyperpod:c/g2"]
    assert hyperpod.asked == [["hyperpod:c/g1", "hyperpod:c/g2"]]  # one read for all of its kind
    assert [o.instances[0].runs_work for o in marked] == [True, False, True]


class OneAsg:
    """DescribeAutoScalingGroups answering with one ASG, tagged as given."""

    def __init__(self, tags: list[dict[str, str]]) -> None:
        self.tags = tags

    def describe_auto_scaling_groups(self, **_: object) -> dict[str, object]:
        group = {"AutoScalingGroupName": "g", "MinSize": 0, "MaxSize": 2, "DesiredCapacity": 0, "Tags": self.tags}
        return {"AutoScalingGroups": [group]}


def test_a_named_asg_is_skipped_only_when_it_names_the_node_group_it_backs() -> None:
    """A rule-named ASG with an empty eks:nodegroup-name backs no node group: it is sized (as before the
    seam); one that names its node group is not (it would be sized twice)."""
    named = [GroupRef(kind=GroupKind.ASG, name="g")]
    empty = AsgGroups(AutoScalingReads(OneAsg([{"Key": "eks:nodegroup-name", "Value": ""}])))  # type: ignore[arg-type]
    assert [o.ref.key for o in empty.observe(Discovery(enabled=False), named)] == ["asg:g"]
    backing = AsgGroups(AutoScalingReads(OneAsg([{"Key": "eks:nodegroup-name", "Value": "ng"}])))  # type: ignore[arg-type]
    assert backing.observe(Discovery(enabled=False), named) == []


class Reopener:
    def __init__(self) -> None:
        self.reopened: list[str] = []

    def reopen(self, obs: GroupObservation, instance_ids: Sequence[str]) -> str:
        self.reopened += instance_ids
        return "reopened"

    def close(self, obs: GroupObservation, instance_ids: Sequence[str], reason: str) -> str:
        return "closed"


def test_a_kind_this_function_is_not_wired_for_still_gets_its_nodes_reopened_first() -> None:
    """As before the seam: marks are applied, then the capacity change fails, naming the group."""
    marker = Reopener()
    actuator = FleetActuator(GroupRegistry([]), {MarkChannel.SLURM: marker})
    obs = _obs(GroupRef(kind=GroupKind.HYPERPOD, cluster="c", name="g")).model_copy(update={"marks": MarkChannel.SLURM})
    decision = Decision(
        group=obs.ref.key, action=Action.SCALE_OUT, current=1, desired=2, reason="r",
        trigger=Trigger(kind=TriggerKind.DEMAND), event_id="e", at=NOW, undrain=("i-0123456789abcdef0",),
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="hyperpod:c/g: this function is not wired for HyperPod instance groups"):
        actuator.apply(decision, obs, "token")
    assert marker.reopened == ["i-0123456789abcdef0"]
