"""UpdateCluster's instance group spec, built from DescribeCluster's answer member by member (issue 42):
checked against botocore's own SageMaker model, the one the client validates against before sending.
DescribeCluster's structures are not UpdateCluster's: AutoPatchConfig says CurrentPatchSchedule where
UpdateCluster takes PatchSchedule, a flexible group's InstanceRequirements CurrentInstanceTypes where it
takes InstanceTypes. Copied as they are, botocore refuses the call every tick and the group never grows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import botocore.session
import pytest
from botocore.exceptions import ParamValidationError
from botocore.model import Shape
from botocore.validate import validate_parameters

from gpufleet.aws.hyperpod import HyperPodFleet, build_spec, update_spec
from gpufleet.domain.models import Action
from tests.adapters.aws import test_hyperpod as base

MODEL = botocore.session.get_session().get_service_model("sagemaker")
DETAILS = MODEL.operation_model("DescribeCluster").output_shape.members["InstanceGroups"].member
UPDATE = MODEL.operation_model("UpdateCluster").input_shape
SPEC = UPDATE.members["InstanceGroups"].member
WHEN = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
ROLE = "arn:aws:iam::123456789012:role/hp"


def _unions(shape: Shape, seen: frozenset[str] = frozenset()) -> int:
    """The most alternatives any tagged union under `shape` has (1: none)."""
    if shape.name in seen:
        return 1
    seen = seen | {shape.name}
    if shape.type_name == "structure":
        own = len(shape.members) if getattr(shape, "is_tagged_union", False) else 1
        return max([own, *(_unions(m, seen) for m in shape.members.values())])
    if shape.type_name == "list":
        return _unions(shape.member, seen)
    if shape.type_name == "map":
        return _unions(shape.value, seen)
    return 1


def sample(shape: Shape, pick: int = 0, seen: frozenset[str] = frozenset()) -> Any:
    """A value of `shape`'s type with every member set, recursively (a tagged union: its `pick`-th member
    only, as the service answers one), within the model's min/max: what DescribeCluster could answer."""
    meta = shape.metadata
    kind = shape.type_name
    if kind == "structure":
        if shape.name in seen:  # a recursive shape: stop at the second visit
            return {}
        members = list(shape.members.items())
        if getattr(shape, "is_tagged_union", False):
            members = [members[pick % len(members)]]
        return {name: sample(m, pick, seen | {shape.name}) for name, m in members}
    if kind == "list":
        return [sample(shape.member, pick, seen) for _ in range(max(1, int(meta.get("min", 1))))]
    if kind == "map":
        return {sample(shape.key, pick, seen): sample(shape.value, pick, seen)}
    if kind == "string":
        if shape.enum:
            return shape.enum[0]
        if shape.name == "RoleArn":
            return ROLE
        size = max(1, int(meta.get("min", 1)))
        return "x" * min(size, int(meta.get("max", size)))
    if kind in ("integer", "long"):
        return max(1, int(meta.get("min", 1)))
    if kind in ("float", "double"):
        return float(max(1, meta.get("min", 1)))
    if kind == "boolean":
        return True
    if kind == "timestamp":
        return WHEN
    if kind == "blob":
        return b"x"
    raise AssertionError(f"no sample for {shape.name} ({kind})")


def answers() -> Iterator[dict[str, Any]]:
    """DescribeCluster instance groups holding every member of the model's output shape, once per
    alternative of its unions."""
    for pick in range(_unions(DETAILS)):
        yield sample(DETAILS, pick)


def _validate(spec: dict[str, Any]) -> None:
    """What botocore does before sending UpdateCluster (ParamValidationError when it refuses)."""
    validate_parameters({"ClusterName": "slurm-a", "InstanceGroups": [spec]}, UPDATE)


def test_every_member_describecluster_returns_gives_a_spec_botocore_accepts() -> None:
    full = list(answers())
    assert set(full[0]) == set(DETAILS.members), "the sample holds every member DescribeCluster may answer"
    assert {"AutoPatchConfig", "InstanceRequirements"} <= set(full[0])
    for answer in full:
        spec, left = build_spec(answer, 7)
        _validate(spec)
        assert left == ()
        # Every spec member is fed (under its name, MinCount's, or Desired/Current's): nothing left out is changed.
        assert set(spec) == set(SPEC.members)
        assert spec["InstanceCount"] == 7 and spec["MinInstanceCount"] == answer["MinCount"]
        assert spec["ImageId"] == answer["DesiredImageId"]


def test_the_spec_members_nested_structures_keep_every_member_the_input_shape_has() -> None:
    """Recursively: a nested spec member is carried whenever DescribeCluster says it (the sample says all)."""
    spec = update_spec(sample(DETAILS), 3)

    def members(value: Any, into: Shape, path: str) -> None:
        if into.type_name == "structure" and not getattr(into, "is_tagged_union", False):
            assert set(value) == set(into.members), path
            for name, m in into.members.items():
                members(value[name], m, f"{path}.{name}")
        elif into.type_name == "list":
            for item in value:
                members(item, into.member, f"{path}[]")

    members(spec, SPEC, "spec")


def _group(**extra: Any) -> dict[str, Any]:
    return {**base.GROUP, **extra}


def test_auto_patching_is_sent_as_updatecluster_takes_it() -> None:
    """The issue's case: `Unknown parameter in InstanceGroups[0].AutoPatchConfig: "CurrentPatchSchedule"`."""
    patch = {
        "PatchingStrategy": "WhenIdle",
        "CurrentPatchSchedule": {"NextPatchDate": WHEN},
        "IdleWaitWindowInSeconds": 3600,
        "DrainPolicy": {"DrainTimeoutInSeconds": 900, "OnDrainTimeout": "Skip"},
    }
    spec = update_spec(_group(AutoPatchConfig=patch), 5)
    _validate(spec)
    assert spec["AutoPatchConfig"] == {
        "PatchingStrategy": "WhenIdle",
        "PatchSchedule": {"NextPatchDate": WHEN},
        "IdleWaitWindowInSeconds": 3600,
        "DrainPolicy": {"DrainTimeoutInSeconds": 900, "OnDrainTimeout": "Skip"},
    }
    later = datetime(2026, 12, 8, 3, 0, tzinfo=UTC)  # a schedule change HyperPod has not applied yet wins
    asked = update_spec(_group(AutoPatchConfig={**patch, "DesiredPatchSchedule": {"NextPatchDate": later}}), 5)
    assert asked["AutoPatchConfig"]["PatchSchedule"] == {"NextPatchDate": later}
    with pytest.raises(ParamValidationError, match="CurrentPatchSchedule"):  # what the copy as it was gave
        _validate({**spec, "AutoPatchConfig": patch})


@pytest.mark.skipif(
    "InstanceRequirements" not in DETAILS.members, reason="this botocore's model has no flexible instance groups"
)
def test_a_flexible_instance_group_sends_its_instance_types() -> None:
    flexible = {k: v for k, v in base.GROUP.items() if k != "InstanceType"}
    current = {"CurrentInstanceTypes": ["ml.p5.48xlarge", "ml.p4d.24xlarge"]}
    spec = update_spec({**flexible, "InstanceRequirements": current}, 4)
    _validate(spec)
    assert spec["InstanceRequirements"] == {"InstanceTypes": ["ml.p5.48xlarge", "ml.p4d.24xlarge"]}
    desired = {**current, "DesiredInstanceTypes": ["ml.p5.48xlarge"]}
    assert update_spec({**flexible, "InstanceRequirements": desired}, 4)["InstanceRequirements"] == {
        "InstanceTypes": ["ml.p5.48xlarge"]
    }


def test_a_structure_without_a_member_updatecluster_requires_is_left_out_and_said() -> None:
    """UpdateCluster requires PatchingStrategy in AutoPatchConfig; an answer without it cannot be sent
    back: the rest of the spec goes, and the scale-out's result says what was left out."""
    group = _group(AutoPatchConfig={"CurrentPatchSchedule": {"NextPatchDate": WHEN}})
    spec, left = build_spec(group, 5)
    _validate(spec)
    assert "AutoPatchConfig" not in spec
    assert left == ("AutoPatchConfig (DescribeCluster gave it without PatchingStrategy)",)

    class Patched(base.FakeSageMaker):
        def describe_cluster(self, **kw: Any) -> dict[str, Any]:
            out = super().describe_cluster(**kw)
            out["InstanceGroups"][0] = {**out["InstanceGroups"][0], "AutoPatchConfig": group["AutoPatchConfig"]}
            return out

    sm = Patched([])
    fleet = HyperPodFleet(sm, base.FakeCloudWatch({}), now=lambda: base.NOW, iam=sm)
    [obs] = fleet.observe([base.REF])
    text = fleet.apply(base._decision(Action.SCALE_OUT, 5), obs)
    assert text == f"UpdateCluster {base.REF.key} InstanceCount = 5; left out {left[0]}"
    [(_, sent)] = [c for c in sm.calls if c[0] == "UpdateCluster"]
    _validate(sent["InstanceGroups"][0])


def test_the_scale_out_sends_a_spec_botocore_accepts_for_a_patched_flexible_group() -> None:
    """Through the adapter: what set_count hands the client passes the client's own validation."""
    group = _group(
        AutoPatchConfig={"PatchingStrategy": "DrainFirst", "CurrentPatchSchedule": {"NextPatchDate": WHEN}},
        InstanceRequirements={"CurrentInstanceTypes": ["ml.p5.48xlarge"]},
        CurrentImageId="ami-0old",
        Status="InService",
        ActiveOperations={"Scaling": 1},
    )

    class Patched(base.FakeSageMaker):
        def describe_cluster(self, **kw: Any) -> dict[str, Any]:
            out = super().describe_cluster(**kw)
            out["InstanceGroups"][0] = dict(group)
            return out

    sm = Patched([])
    fleet = HyperPodFleet(sm, base.FakeCloudWatch({}), now=lambda: base.NOW, iam=sm)
    [obs] = fleet.observe([base.REF])
    assert fleet.apply(base._decision(Action.SCALE_OUT, 6), obs) == f"UpdateCluster {base.REF.key} InstanceCount = 6"
    [(_, sent)] = [c for c in sm.calls if c[0] == "UpdateCluster"]
    [spec] = sent["InstanceGroups"]
    _validate(spec)
    assert spec["AutoPatchConfig"]["PatchSchedule"] == {"NextPatchDate": WHEN}
    assert spec["ImageId"] == "ami-0123" and "ActiveOperations" not in spec and "Status" not in spec
