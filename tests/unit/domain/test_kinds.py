"""The traits table: one row per group kind, read wherever kinds differ; its words and dimension names
are the ones the policy and the node publisher use."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gpufleet.domain.kinds import GroupKind, KindTraits, kinds, new_kind, register, traits
from gpufleet.domain.models import GroupRef
from gpufleet_node import schema


def test_the_built_in_kinds_and_their_policy_words() -> None:
    assert [str(k) for k in kinds()][:3] == ["asg", "eks-nodegroup", "hyperpod"]
    assert GroupKind("eks-nodegroup") is GroupKind.EKS_NODEGROUP


@pytest.mark.parametrize(
    ("ref", "dimensions"),
    [
        (GroupRef(kind=GroupKind.ASG, name="a"), schema.group_dimensions(asg_name="a")),
        (
            GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="c", name="n"),
            schema.group_dimensions(cluster_name="c", nodegroup_name="n"),
        ),
        (
            GroupRef(kind=GroupKind.HYPERPOD, cluster="c", name="g"),
            schema.group_dimensions(cluster_name="c", instance_group_name="g"),
        ),
    ],
)
def test_each_rows_dimensions_are_the_publishers(ref: GroupRef, dimensions: dict[str, str]) -> None:
    assert ref.metric_dimensions == dimensions


@given(st.sampled_from(kinds()[:3]), st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True))
def test_keys_round_trip(kind: GroupKind, name: str) -> None:
    ref = GroupRef(kind=kind, name=name, cluster="ml" if traits(kind).in_cluster else None)
    assert GroupRef.parse_key(ref.key) == ref


def test_a_kind_read_back_is_the_same_object() -> None:
    ref = GroupRef.model_validate_json('{"kind": "hyperpod", "name": "g", "cluster": "c"}')
    assert ref.kind is GroupKind.HYPERPOD
    assert copy.deepcopy(ref).kind is GroupKind.HYPERPOD
    assert pickle.loads(pickle.dumps(ref)).kind is GroupKind.HYPERPOD
    assert ref.model_dump(mode="json")["kind"] == "hyperpod"


def test_an_unknown_word_is_refused_in_pydantics_enum_wording() -> None:
    with pytest.raises(ValidationError, match="Input should be 'asg', 'eks-nodegroup' or 'hyperpod'"):
        GroupRef(kind="gke", name="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a group kind: 'gke'"):
        GroupKind("gke")


def test_a_kind_is_registered_once_and_its_prefix_is_its_own() -> None:
    row = traits(GroupKind.ASG)
    assert register(row) is row  # the same row again: no-op
    with pytest.raises(ValueError, match="registered already"):
        register(KindTraits(**{**row.__dict__, "label": "something else"}))
    clash = {**row.__dict__, "label": "x"}
    clash.pop("kind")
    with pytest.raises(ValueError, match="key prefix 'asg'"):
        new_kind("other-asg", **clash)
    with pytest.raises(ValueError, match="not a group kind"):
        GroupKind("other-asg")  # the refused row left its word no kind


def test_articles_follow_the_label() -> None:
    assert traits(GroupKind.ASG).article == "an"
    assert traits(GroupKind.HYPERPOD).article == "a"


def test_a_ref_without_what_its_kind_is_named_by_has_no_series() -> None:
    with pytest.raises(ValueError, match="a group is an ASG name"):
        _ = GroupRef(kind=GroupKind.EKS_NODEGROUP, name="ng").metric_dimensions


def test_the_policy_still_has_a_json_schema_with_the_kinds() -> None:
    from gpufleet.policy.fleet import FleetPolicy

    assert "hyperpod" in str(FleetPolicy.model_json_schema())
