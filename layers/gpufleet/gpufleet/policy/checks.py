"""Static checks of a fleet policy beyond its schema (pure): mistakes that parse but bite later - a
schedule window outside its rule's bounds, a rule no group ever reaches because an earlier rule takes all
its groups, a spot or fallback group written without its kind or that no rule names, a cron field out of
range. `gpufleet validate-policy` reports them; the controller does not refuse a policy for them (a fleet
keeps running on the policy it has). Problems are named by rule, not only by position.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from gpufleet.domain.demand_sources import SourceName
from gpufleet.domain.kinds import GroupKind, traits
from gpufleet.domain.models import GroupRef
from gpufleet.policy.fleet import Consolidation, FleetPolicy, GroupRule, GroupSettings, Owner
from gpufleet_node.schema import NAMESPACE as NODE_NAMESPACE
from gpufleet_node.schema import SLURM_NAMESPACE, SLURM_NAMESPACE_PREFIX


def policy_problems(policy: FleetPolicy) -> list[str]:
    """Every static mistake found, one line each, in policy order."""
    return [
        *_schedule_problems(policy),
        *_shadowed_rules(policy.groups),
        *_spot_group_problems(policy),
        *_demand_problems(policy),
        *_hyperpod_problems(policy),
        *_asg_rule_problems(policy.groups),
        *_consolidation_problems(policy),
    ]


# The ASG EKS makes for a managed node group: eks-NODEGROUP-UUID (older node groups: eks-UUID).
_BACKING_ASG = re.compile(r"eks-(?:.+-)?[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}")


def rule_label(index: int, rule: GroupRule) -> str:
    """'groups[1] (train-*)': position and what the rule selects."""
    what = rule.name or ", ".join(f"{k}={v}" for k, v in rule.tags.items())
    where = f"{rule.cluster}/" if rule.cluster and rule.name else ""
    return f"groups[{index}] ({where}{what})"


def _setting(rule: GroupSettings, defaults: GroupSettings, name: str) -> Any:
    """What a rule's group gets for `name`: the rule's own value where it sets one, else the defaults'."""
    return getattr(rule, name) if name in rule.model_fields_set else getattr(defaults, name)


def _bound(rule: GroupSettings, defaults: GroupSettings, name: str) -> int | None:
    value: int | None = _setting(rule, defaults, name)
    return value


def _schedule_problems(policy: FleetPolicy) -> list[str]:
    problems = []
    rules: list[tuple[str, GroupSettings]] = [("defaults", policy.defaults)]
    rules += [(rule_label(i, r), r) for i, r in enumerate(policy.groups)]
    for label, rule in rules:
        top = _bound(rule, policy.defaults, "max")
        for window in rule.schedules:
            for name in ("min", "desired"):
                value = getattr(window, name)
                if top is not None and value is not None and value > top:
                    problems.append(
                        f"{label}: schedule '{window.name}' {name} {value} is above the rule's max {top} "
                        "(bounds never exceed the rule's; raise max or lower the window)"
                    )
    return problems


def covers(earlier: GroupRule, later: GroupRule) -> bool:
    """Every group `later` selects is selected by `earlier` first (so `later` never applies)."""
    if earlier.kind is not None and earlier.kind is not later.kind:
        return False
    if earlier.cluster is not None and earlier.cluster != later.cluster:
        return False
    if not earlier.tags.items() <= later.tags.items():
        return False
    if earlier.name is None or earlier.name == "*":
        return True
    if later.name is None:
        return False
    if any(ch in later.name for ch in "*?["):
        return later.name == earlier.name
    return fnmatch.fnmatchcase(later.name, earlier.name)


def _shadowed_rules(rules: tuple[GroupRule, ...]) -> list[str]:
    problems = []
    for j, later in enumerate(rules):
        first = next((i for i in range(j) if covers(rules[i], later)), None)
        if first is not None:
            problems.append(
                f"{rule_label(j, later)} never applies: {rule_label(first, rules[first])} comes first and "
                "selects every group it does (rules apply first match; move the specific one up)"
            )
    return problems


def _spot_group_problems(policy: FleetPolicy) -> list[str]:
    problems = []
    for i, spot in enumerate(policy.spot.groups):
        keys = [(f"spot.groups[{i}].group", spot.group)]
        if spot.fallback is not None:
            keys.append((f"spot.groups[{i}].fallback.group", spot.fallback.group))
        for where, key in keys:
            try:
                ref = GroupRef.parse_key(key)
            except ValueError as exc:
                problems.append(f"{where}: {exc}")
                continue
            if ":" not in key:
                problems.append(f"{where}: {key!r} has no kind: write 'asg:{key}' (or 'eks:CLUSTER/NODEGROUP')")
            named = any(rule.matches(ref, rule.tags) for rule in policy.groups)
            if where.endswith("fallback.group") and not named:
                problems.append(
                    f"{where}: no rule selects {ref.key}: give it one with `target: {{enabled: false}}` so only "
                    "spot_watch and bounds move it (and tag it managed)"
                )
    return problems


def _demand_problems(policy: FleetPolicy) -> list[str]:
    """A demand source the group's kind cannot use: pods are read for EKS node groups and for ASGs whose
    nodes join an EKS cluster (self-managed node groups; a HyperPod instance group or a rule of no kind
    cannot say it joins one), and an ASG's queue or metric needs its GPUs per node (an EKS group's comes
    from its instance type)."""
    problems = []
    rules: list[tuple[str, GroupSettings, GroupKind | None]] = [("defaults", policy.defaults, None)]
    rules += [(rule_label(i, r), r, r.kind) for i, r in enumerate(policy.groups)]
    for label, rule, kind in rules:
        demand = rule.demand
        if demand is None:
            continue
        row = traits(kind) if kind is not None else None
        if demand.kubernetes is not None and (row is None or SourceName.KUBERNETES not in row.demand_sources):
            problems.append(
                f"{label}: demand.kubernetes reads an EKS cluster's pods: give the rule kind: eks-nodegroup, or "
                "kind: asg for a self-managed node group (other groups use demand.sqs or demand.metric)"
            )
        if demand.kubernetes is not None and demand.kubernetes.cluster and row is not None and row.own_cluster_pods:
            problems.append(
                f"{label}: demand.kubernetes.cluster is for self-managed ASGs: a managed node group's pods are "
                "read from its own cluster (drop it)"
            )
        if demand.kubernetes is None and demand.gpus_per_node is None and (row is None or not row.knows_gpus_per_node):
            needs = "needs demand.gpus_per_node (GPUs per instance of the ASG)"
            problems.append(f"{label}: demand.{demand.source.name} {needs}")
        if demand.metric is not None and node_writable(demand.metric.namespace):
            problems.append(
                f"{label}: demand.metric.namespace {demand.metric.namespace!r} is one every GPU node may write "
                f"(NodePublisherPolicy allows PutMetricData in {NODE_NAMESPACE!r}): any node could steer this "
                "group's size; publish the backlog in another namespace. IAM scopes PutMetricData by namespace "
                "only, so whoever's role allows PutMetricData there can set it (CloudWatchAgentServerPolicy allows "
                "every namespace): on HyperPod write namespace: Slurm, which gpufleet reads only from the "
                "controller group's own Slurm/<role id>:SageMaker (a role no other group shares)"
            )
        if demand.metric is not None and kind is GroupKind.HYPERPOD and not slurm_report(demand.metric.namespace):
            problems.append(
                f"{label}: demand.metric.namespace {demand.metric.namespace!r} on a hyperpod group is read as named: "
                "any role allowed PutMetricData there (CloudWatchAgentServerPolicy: every namespace) can size "
                f"this group; write namespace: {SLURM_NAMESPACE} (read only from the controller node's own "
                "Slurm/<role id>:SageMaker, which IAM lets only its role write: give it a role of its own)"
            )
    return problems


def _asg_rule_problems(rules: tuple[GroupRule, ...]) -> list[str]:
    """An ASG has no cluster: a kind: asg rule with `cluster` selects no group (a self-managed group's
    cluster is demand.kubernetes.cluster). A rule naming the ASG EKS made for a managed node group is not
    sized (the fleet reader skips it: it would be sized twice): its node group is to be named instead."""
    problems = []
    for i, rule in enumerate(rules):
        if rule.kind is not GroupKind.ASG:
            continue
        if rule.cluster is not None:
            problems.append(
                f"{rule_label(i, rule)}: an ASG has no cluster, so this rule selects no group: drop cluster "
                f"(to read cluster {rule.cluster}'s pods for it, set demand.kubernetes.cluster: {rule.cluster})"
            )
        if rule.name and _BACKING_ASG.fullmatch(rule.name):
            problems.append(
                f"{rule_label(i, rule)}: {rule.name} looks like the ASG EKS made for a managed node group, which "
                "is not sized as an ASG: write kind: eks-nodegroup, cluster: C, name: NODEGROUP instead"
            )
    return problems


def _consolidation_problems(policy: FleetPolicy) -> list[str]:
    """`consolidate: attrition` removes a node only once gpufleet closed it, so a group whose nodes it
    cannot close (no Kubernetes source, not HyperPod) would never scale in; and under `owner: external`
    another autoscaler sizes the group, so gpufleet's drains would only ever be advice."""
    problems = []
    for i, rule in enumerate(policy.groups):
        if _setting(rule, policy.defaults, "consolidate") is not Consolidation.ATTRITION:
            continue
        label = rule_label(i, rule)
        demand = _setting(rule, policy.defaults, "demand")
        closes_own = rule.kind is not None and traits(rule.kind).closes_own_nodes
        if not closes_own and (demand is None or demand.kubernetes is None):
            problems.append(
                f"{label}: consolidate: attrition needs nodes gpufleet can close: a demand: {{kubernetes: ...}} "
                "source (cordon) or a hyperpod group (Slurm drain); without one this group would never scale in"
            )
        if _setting(rule, policy.defaults, "owner") is Owner.EXTERNAL:
            problems.append(f"{label}: consolidate: attrition under owner: external only advises: set one of them")
    d = policy.defaults
    if (
        d.consolidate is Consolidation.ATTRITION
        and policy.discovery.enabled
        and (d.demand is None or d.demand.kubernetes is None)
    ):
        problems.append(
            "defaults: consolidate: attrition reaches every tag-discovered group, and without a demand: "
            "{kubernetes: ...} source in the defaults gpufleet cannot close their nodes: they would never scale "
            "in (set it per rule, on groups with a Kubernetes source)"
        )
    return problems


def _hyperpod_problems(policy: FleetPolicy) -> list[str]:
    """HyperPod instance groups are read only where a rule names one (cluster and exact name: there is
    no tag discovery), and have no max of their own: without the rule's (or the defaults') max nothing
    bounds their growth but the account's quotas."""
    problems = []
    for i, rule in enumerate(policy.groups):
        if rule.kind is None or traits(rule.kind).discoverable:
            continue
        label = rule_label(i, rule)
        if rule.explicit_ref() is None:
            problems.append(
                f"{label}: a hyperpod rule finds only the instance group it names: give cluster and the exact "
                "instance group name (no globs, no tags)"
            )
        if not traits(rule.kind).has_own_max and _bound(rule, policy.defaults, "max") is None:
            problems.append(f"{label}: a HyperPod instance group has no max of its own: set max on the rule")
    return problems


def slurm_report(namespace: str) -> bool:
    """Whether a HyperPod group's demand.metric names Slurm's report (`Slurm`, `Slurm/...`): read from the
    controller node's own namespace only (aws.groups.hyperpod.HyperPodGroups.metric_namespace)."""
    return namespace == SLURM_NAMESPACE or namespace.startswith(SLURM_NAMESPACE_PREFIX)


def node_writable(namespace: str) -> bool:
    """Whether the GPU nodes' own policy lets them write this CloudWatch namespace.

    IAM scopes PutMetricData by namespace only (no dimension key), so a demand metric there is a number any
    node of any group can set: docs/security.md."""
    return namespace == NODE_NAMESPACE or namespace.startswith(NODE_NAMESPACE + "/")
