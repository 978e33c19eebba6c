"""Group kinds and what differs between them as data: the one traits table.

A group kind (an ASG, an EKS managed node group, a HyperPod instance group) is one adapter behind the
group seam (`gpufleet.aws.groups`) plus one row here. Code that must treat kinds differently reads the
row (`traits(kind)`), never tests the kind: a new kind is one adapter, one row and one registration.

`GroupKind` is the policy's word for a kind (`kind: asg`). It is a string, interned per word, so a kind
registered by a test or a later adapter validates in the policy and in stored records like the built-in
ones, and `kind is GroupKind.ASG` still holds for a kind read back from text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema

from gpufleet.domain.demand_sources import SourceName


class GroupKind(str):
    """One kind of group, by its policy word. Only registered words are kinds (`register`)."""

    __slots__ = ()
    _known: ClassVar[dict[str, GroupKind]] = {}
    ASG: ClassVar[GroupKind]
    EKS_NODEGROUP: ClassVar[GroupKind]
    HYPERPOD: ClassVar[GroupKind]

    def __new__(cls, word: object) -> GroupKind:
        found = cls._known.get(str(word)) if isinstance(word, str) else None
        if found is None:
            raise ValueError(f"not a group kind: {word!r} (one of {', '.join(sorted(cls._known))})")
        return found

    @classmethod
    def _define(cls, word: str) -> GroupKind:
        """The interned kind for `word`, made once (the traits table's `register` is the way in)."""
        if word not in cls._known:
            cls._known[word] = str.__new__(cls, word)
        return cls._known[word]

    @property
    def value(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"GroupKind({str(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (GroupKind, (str(self),))

    @classmethod
    def _validate(cls, word: object) -> GroupKind:
        """Pydantic's own enum wording, so a policy error reads as it did when kinds were an enum."""
        found = cls._known.get(word) if isinstance(word, str) else None
        if found is None:
            words = [f"'{w}'" for w in cls._known]
            expected = " or ".join([", ".join(words[:-1]), words[-1]] if len(words) > 1 else words)
            raise PydanticCustomError("enum", "Input should be {expected}", {"expected": expected})
        return found

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The kinds known when the schema is made, as the enum's schema said them."""
        return {"type": "string", "enum": list(cls._known)}

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls._validate, serialization=core_schema.plain_serializer_function_ser_schema(str, when_used="json")
        )


@dataclass(frozen=True)
class KindTraits:
    """What differs between group kinds, as data. Each field says what code reads it for."""

    kind: GroupKind
    key_prefix: str  # a group key is PREFIX:NAME or PREFIX:CLUSTER/NAME (`GroupRef.key`)
    label: str  # what a person calls one: "EKS managed node group"
    in_cluster: bool  # named by cluster and name (a policy rule with a name needs its cluster)
    # Metric dimensions of the group's own series, as the publisher sends them: (cluster's, name's).
    cluster_dimension: str | None
    name_dimension: str
    # Its instances sit in an Auto Scaling group (its own or a backing one): launch activities, instance
    # health and scale-in protection are Auto Scaling's.
    in_asg: bool
    # Who replaces a node whose GPU failed: its Auto Scaling group (told Unhealthy), or the service's own
    # recovery (HyperPod), in which case gpufleet only tells.
    replaced_by_asg: bool
    # Demand sources a group of this kind can read (policy checks; `policy.fleet.DemandSource`).
    demand_sources: frozenset[SourceName]
    knows_gpus_per_node: bool  # its GPUs per node follow from what it launches (else demand.gpus_per_node)
    own_cluster_pods: bool  # its pods are its own cluster's (demand.kubernetes.cluster is not for it)
    closes_own_nodes: bool  # its own scheduler can close nodes for attrition (Slurm drain), no cordon needed
    discoverable: bool  # found by the managed tag (else only a rule naming it exactly finds it)
    has_own_max: bool  # the service holds a max for it (else only the policy bounds its growth)
    console_path: str  # the console page of one group: {region}, {cluster}, {name} filled in (quoted)
    console_title: str

    @property
    def article(self) -> str:
        return "an" if self.label[:1].lower() in "aeiou" else "a"


_TRAITS: dict[GroupKind, KindTraits] = {}


def register(row: KindTraits) -> KindTraits:
    """Adds a kind's row; the kind's word becomes a `GroupKind`. Registering the same row twice is a no-op;
    a different row for a known kind, or a key prefix another kind uses, is refused."""
    known = _TRAITS.get(row.kind)
    if known is not None and known != row:
        raise ValueError(f"group kind {row.kind} is registered already, with other traits")
    clash = [k for k, t in _TRAITS.items() if t.key_prefix == row.key_prefix and k != row.kind]
    if clash:
        raise ValueError(f"key prefix {row.key_prefix!r} is group kind {clash[0]}'s already")
    _TRAITS[row.kind] = row
    return row


def forget(kind: GroupKind) -> None:
    """Takes a kind's row back out (a kind a test registered for its own run): its word is no kind then."""
    _TRAITS.pop(kind, None)
    GroupKind._known.pop(str(kind), None)


def traits(kind: GroupKind) -> KindTraits:
    return _TRAITS[kind]


def kinds() -> tuple[GroupKind, ...]:
    return tuple(_TRAITS)


def kind_of_prefix(prefix: str) -> GroupKind | None:
    """The kind whose group keys start with PREFIX: (None: no kind has it)."""
    return next((k for k, t in _TRAITS.items() if t.key_prefix == prefix), None)


def new_kind(word: str, **fields: Any) -> KindTraits:
    """Defines and registers a kind from its word and traits (how an adapter adds its row); a refused row
    leaves its word no kind."""
    fresh = word not in GroupKind._known
    try:
        return register(KindTraits(kind=GroupKind._define(word), **fields))
    except ValueError:
        if fresh:
            GroupKind._known.pop(word, None)
        raise


# ---- the built-in kinds: one row each ----
# Dimension names are the node publisher's (gpufleet_node.schema.group_dimensions): written out here so
# the table stays plain data; tests/unit/domain/test_kinds.py holds them equal.
GroupKind.ASG = new_kind(
    "asg",
    key_prefix="asg",
    label="Auto Scaling group",
    in_cluster=False,
    cluster_dimension=None,
    name_dimension="AutoScalingGroupName",
    in_asg=True,
    replaced_by_asg=True,
    demand_sources=frozenset(SourceName),
    knows_gpus_per_node=False,
    own_cluster_pods=False,
    closes_own_nodes=False,
    discoverable=True,
    has_own_max=True,
    console_path="/ec2/home?region={region}#AutoScalingGroupDetails:id={name};view=activity",
    console_title="Auto Scaling group",
).kind
GroupKind.EKS_NODEGROUP = new_kind(
    "eks-nodegroup",
    key_prefix="eks",
    label="EKS managed node group",
    in_cluster=True,
    cluster_dimension="ClusterName",
    name_dimension="NodegroupName",
    in_asg=True,
    replaced_by_asg=True,
    demand_sources=frozenset(SourceName),
    knows_gpus_per_node=True,
    own_cluster_pods=True,
    closes_own_nodes=False,
    discoverable=True,
    has_own_max=True,
    console_path="/eks/home?region={region}#/clusters/{cluster}/nodegroups/{name}",
    console_title="EKS node group",
).kind
GroupKind.HYPERPOD = new_kind(
    "hyperpod",
    key_prefix="hyperpod",
    label="HyperPod instance group",
    in_cluster=True,
    cluster_dimension="ClusterName",
    name_dimension="InstanceGroupName",
    in_asg=False,
    replaced_by_asg=False,
    demand_sources=frozenset({SourceName.SQS, SourceName.METRIC}),
    knows_gpus_per_node=True,
    own_cluster_pods=False,
    closes_own_nodes=True,
    discoverable=False,
    has_own_max=False,
    console_path="/sagemaker/home?region={region}#/cluster-management/{cluster}",
    console_title="HyperPod cluster",
).kind
