"""What a node of a self-managed node group offers a pod: an ASG whose nodes join an EKS cluster (eksctl's
unmanaged node groups, groups Cluster Autoscaler sizes). Such a group needs no gpufleet shape configuration:
its instance types come from its launch template or mixed-instances overrides, and what Cluster Autoscaler
is told through the ASG's tags is read the way Cluster Autoscaler reads it.

Its cluster (`cluster_of`, pure): the ASG's `kubernetes.io/cluster/NAME` tag with value owned or shared (the
tag eksctl's unmanaged node groups carry, eksctl pkg/cfn/builder/nodegroup.go), `eks:cluster-name`, or
eksctl's `alpha.eksctl.io/cluster-name` (pkg/apis/eksctl.io/v1alpha5/types.go `ClusterNameTag`). Tags that
name two clusters, or none: unknown (the group's demand is then unreadable, fail closed).

Cluster Autoscaler's node-template tags (`node_template`, pure), as kubernetes/autoscaler reads them in
cluster-autoscaler/cloudprovider/aws/aws_manager.go:
- `k8s.io/cluster-autoscaler/node-template/label/KEY` = value: a node label (`extractLabelsFromAsg`); it
  wins over the labels the instance type gives (`buildNodeFromTemplate` joins them last);
- `.../taint/KEY` = `VALUE:EFFECT`, EFFECT one of NoSchedule, NoExecute, PreferNoSchedule
  (`extractTaintsFromAsg`: the value split at its first ':'; a value without an effect is no taint there,
  and is told here);
- `.../resources/NAME` = a Kubernetes quantity (`extractAllocatableResourcesFromAsg`): what a node offers of
  that resource, replacing the computed value (Cluster Autoscaler uses it as capacity and allocatable);
  `nvidia.com/gpu` sets the node's GPUs (an instance type EC2 says has none, or a share of them);
- `.../autoscaling-options/*` (scale-down thresholds and times, `extractAutoscalingOptionsFromTags`) are
  Cluster Autoscaler's own scale-in rules: not read (gpufleet's scale-in is by GPU activity and pods).
Cluster Autoscaler also reads `eks:*` tags as labels (for managed node groups' backing ASGs); not here.
eksctl labels every node of a node group `alpha.eksctl.io/cluster-name` and `alpha.eksctl.io/nodegroup-name`
(pkg/apis/eksctl.io/v1alpha5/defaults.go `setDefaultNodeLabels`) and tags the ASG with the same keys and
values: those tags are read as the same labels. Its other node labels reach the ASG as node-template tags
only with `propagateASGTags` (off by default); Cluster Autoscaler then takes them from a live node of the
group, which gpufleet cannot (its access entry, AmazonEKSViewPolicy, does not read nodes): such an
eksctl ASG without node-template label tags is told once (`shape_notes`), as are tags that say nothing
usable (a taint tag without its effect, which is how propagateASGTags writes taints).

Weighted groups (`weighted_why`): mixed-instances overrides with a WeightedCapacity other than 1 make the
ASG's desired, min and max count weight units, not instances; gpufleet counts instances, so it does not
size such a group by demand nor remove its nodes (told in one line; the group fails closed).

Instance types (`asg_node_shape`): a mixed-instances policy's overrides (every type listed; the least of
them shapes the node, as for a managed node group, where Cluster Autoscaler takes the first), else the
launch template's InstanceType (DescribeLaunchTemplateVersions at the ASG's version). Instance
requirements (attribute-based selection) and launch configurations are not read: told in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.aws.eks_nodes import ShapeUnknown, checked_overrides, instance_types, least, quantity_problem, type_labels
from gpufleet.aws.eks_shape import NVIDIA_GPU, InstanceType, allocatable
from gpufleet.domain import defaults
from gpufleet.domain.errors import one_line
from gpufleet.domain.nodes import NodeShape
from gpufleet.domain.quantity import is_quantity, parse_quantity

TEMPLATE_PREFIX = "k8s.io/cluster-autoscaler/node-template/"
LABEL_PREFIX = TEMPLATE_PREFIX + "label/"
TAINT_PREFIX = TEMPLATE_PREFIX + "taint/"
RESOURCES_PREFIX = TEMPLATE_PREFIX + "resources/"
OPTIONS_PREFIX = TEMPLATE_PREFIX + "autoscaling-options/"
CLUSTER_TAG_PREFIX = "kubernetes.io/cluster/"
CLUSTER_TAG_VALUES = ("owned", "shared")
EKSCTL_CLUSTER_TAG = "alpha.eksctl.io/cluster-name"
EKSCTL_NODEGROUP_TAG = "alpha.eksctl.io/nodegroup-name"
EKSCTL_NODE_LABELS = (EKSCTL_CLUSTER_TAG, EKSCTL_NODEGROUP_TAG)  # tags on the ASG, labels on its nodes
WEIGHTED = "weighted capacity"  # how `weighted_why`'s reason starts
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "PreferNoSchedule")


@dataclass(frozen=True)
class NodeTemplate:
    """What an ASG's Cluster Autoscaler tags say of its nodes, and the tags that say nothing usable."""

    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)
    resources: dict[str, float] = field(default_factory=dict)  # resource -> amount (cpu in cores, bytes)
    ignored: tuple[str, ...] = ()  # one line per tag not used, and why
    invalid: tuple[str, ...] = ()  # resource tags no node can offer (infinite, too big): the shape fails


def cluster_of(tags: Mapping[str, str]) -> tuple[str | None, str]:
    """The EKS cluster an ASG's nodes join, from its tags: (name, "") or (None, why not)."""
    found: dict[str, str] = {}  # cluster -> the tag that names it
    for key, value in sorted(tags.items()):
        if key.startswith(CLUSTER_TAG_PREFIX) and key[len(CLUSTER_TAG_PREFIX) :]:
            if str(value).strip().lower() in CLUSTER_TAG_VALUES:
                found.setdefault(key[len(CLUSTER_TAG_PREFIX) :], key)
        elif key in (defaults.TAG_EKS_CLUSTER, EKSCTL_CLUSTER_TAG) and str(value).strip():
            found.setdefault(str(value).strip(), key)
    if len(found) == 1:
        return next(iter(found)), ""
    if not found:
        return None, (
            f"no cluster: the ASG has no {CLUSTER_TAG_PREFIX}NAME (owned or shared), {defaults.TAG_EKS_CLUSTER} "
            f"or {EKSCTL_CLUSTER_TAG} tag; set demand.kubernetes.cluster"
        )
    named = ", ".join(f"{c} ({t})" for c, t in sorted(found.items()))
    return None, f"its tags name {len(found)} clusters: {named}; set demand.kubernetes.cluster"


def node_template(tags: Mapping[str, str]) -> NodeTemplate:
    """Cluster Autoscaler's node-template labels, taints and resources from an ASG's tags, and eksctl's
    node labels from its ASG tags of the same keys (a node-template label tag wins)."""
    labels = {k: str(tags[k]) for k in EKSCTL_NODE_LABELS if str(tags.get(k, "")).strip()}
    taints: list[tuple[str, str, str]] = []
    resources: dict[str, float] = {}
    ignored: list[str] = []
    invalid: list[str] = []
    for key, raw in sorted(tags.items()):
        value = str(raw)
        if key.startswith(LABEL_PREFIX) and key[len(LABEL_PREFIX) :]:
            labels[key[len(LABEL_PREFIX) :]] = value
        elif key.startswith(TAINT_PREFIX) and key[len(TAINT_PREFIX) :]:
            taint_value, colon, effect = value.partition(":")
            if colon and effect in TAINT_EFFECTS:
                taints.append((key[len(TAINT_PREFIX) :], taint_value, effect))
            else:
                ignored.append(
                    f"{key}={value!r}: no taint, not VALUE:EFFECT with EFFECT one of {', '.join(TAINT_EFFECTS)} "
                    "(eksctl's propagateASGTags writes the value alone)"
                )
        elif key.startswith(RESOURCES_PREFIX) and key[len(RESOURCES_PREFIX) :]:
            name = key[len(RESOURCES_PREFIX) :]
            amount = parse_quantity(value.strip()) if is_quantity(value.strip()) else None
            why = "not a Kubernetes quantity" if amount is None else quantity_problem(name, amount)
            if amount is not None and why is None:
                resources[name] = amount
            else:
                (ignored if amount is None else invalid).append(f"{key}={value!r}: {why}")
        elif key.startswith(OPTIONS_PREFIX):
            ignored.append(f"{key}: Cluster Autoscaler's own scale-down option, not read")
    return NodeTemplate(
        labels=labels, taints=tuple(taints), resources=resources, ignored=tuple(ignored), invalid=tuple(invalid)
    )


def shape_notes(tags: Mapping[str, str], template: NodeTemplate) -> list[str]:
    """What a person should be told once of an ASG's tags (pure): tags not used, and an eksctl node group
    whose own node labels are not on its ASG (a pod selecting one of them is judged to fit no node)."""
    notes = list(template.ignored)
    if EKSCTL_NODEGROUP_TAG in tags and not any(k.startswith(LABEL_PREFIX) for k in tags):
        notes.append(
            f"made by eksctl without node-template label tags: only {', '.join(EKSCTL_NODE_LABELS)} are known "
            "of its nodes' labels (set propagateASGTags: true, or tag "
            f"{LABEL_PREFIX}KEY for each label pods select)"
        )
    return notes


def weighted_why(group: Mapping[str, Any]) -> str | None:
    """Why a DescribeAutoScalingGroups item is not sized by instances (pure): its mixed-instances overrides
    weigh instances (WeightedCapacity other than 1), so its desired, min and max count weight units; None
    when every instance counts one."""
    overrides = ((group.get("MixedInstancesPolicy") or {}).get("LaunchTemplate") or {}).get("Overrides") or []
    weights = sorted({str(o["WeightedCapacity"]).strip() for o in overrides if o.get("WeightedCapacity")})
    if not [w for w in weights if _weight(w) != 1.0]:
        return None
    return (
        f"{WEIGHTED}: its mixed-instances overrides weigh instances (WeightedCapacity {', '.join(weights)}), so "
        "its desired capacity counts weight units, not instances: gpufleet does not size it by demand nor "
        "remove its nodes (set every WeightedCapacity to 1, or leave the group out of the policy)"
    )


def _weight(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def template_shape(
    asg: str,
    types: Sequence[str],
    described: Mapping[str, InstanceType],
    template: NodeTemplate,
    zones: Sequence[str] = (),
    region: str = "",
    overrides: Mapping[str, str] | None = None,
) -> NodeShape:
    """A node of the ASG (pure): the least of its instance types, then the node-template tags, then the
    policy's `demand.kubernetes.allocatable` (`overrides`). ShapeUnknown when its GPUs cannot be told."""
    missing = [t for t in types if t not in described]
    if not types or missing:
        raise _unknown(asg, f"EC2 does not describe instance type(s) {', '.join(missing) or '(none)'}")
    if template.invalid:
        raise _unknown(asg, f"tag {template.invalid[0]}")
    offered = least([allocatable(described[t]) for t in types])
    offered.update(template.resources)
    given, why = checked_overrides(overrides)
    if why:
        raise _unknown(asg, why)
    offered.update(given)
    fewest = min(described[t].gpus for t in types)
    gpus = offered.get(NVIDIA_GPU, float(fewest))
    if gpus <= 0:
        raise _unknown(asg, _no_gpus_why(types, template, given))
    shaped_by = min(types, key=lambda t: (described[t].gpus, described[t].vcpus, described[t].memory_mib, t))
    labels = type_labels({t: described[t] for t in types}, tuple(zones), region)
    labels.update(template.labels)
    name = "/".join(types) if len(types) == 1 else f"{'/'.join(types)} (shaped by the least, {shaped_by})"
    return NodeShape(
        gpus=gpus,
        labels=tuple(sorted(labels.items())),
        taints=template.taints,
        allocatable=offered,
        zones=tuple(sorted(set(zones))),
        name=name,
    )


def launch_types(group: Mapping[str, Any]) -> tuple[list[str], dict[str, str] | None, str]:
    """From a DescribeAutoScalingGroups item (pure): the overrides' instance types, or the launch template
    to read the type from ({LaunchTemplateId or LaunchTemplateName, Version}), or why neither can be read."""
    mixed = group.get("MixedInstancesPolicy") or {}
    spec = mixed.get("LaunchTemplate") or {}
    overrides = spec.get("Overrides") or []
    if any(o.get("InstanceRequirements") for o in overrides):
        return [], None, "its mixed-instances policy selects types by attributes (instance requirements): not read"
    named = list(dict.fromkeys(str(o["InstanceType"]) for o in overrides if o.get("InstanceType")))
    if named:
        return named, None, ""
    template = spec.get("LaunchTemplateSpecification") if mixed else group.get("LaunchTemplate")
    key = next((k for k in ("LaunchTemplateId", "LaunchTemplateName") if (template or {}).get(k)), None)
    if template and key:
        return [], {key: str(template[key]), "Version": str(template.get("Version") or "$Default")}, ""
    if group.get("LaunchConfigurationName"):
        return [], None, "it launches from a launch configuration: not read (move it to a launch template)"
    return [], None, "no launch template or mixed-instances policy"


def template_instance_type(ec2: Any, spec: Mapping[str, str]) -> str | None:
    """The InstanceType of the launch template's version (DescribeLaunchTemplateVersions)."""
    ref = {k: v for k, v in spec.items() if k != "Version"}
    found = ec2.describe_launch_template_versions(**ref, Versions=[spec.get("Version", "$Default")])
    versions = found.get("LaunchTemplateVersions") or []
    value = (versions[0].get("LaunchTemplateData") or {}).get("InstanceType") if versions else None
    return str(value) if value else None


def asg_node_shape(
    autoscaling: Any,
    ec2: Any,
    asg: str,
    overrides: Mapping[str, str] | None = None,
    tell: Callable[[str], None] | None = None,
) -> NodeShape:
    """What a node of the self-managed ASG offers a pod, from DescribeAutoScalingGroups (its tags, zones and
    launch configuration), DescribeLaunchTemplateVersions and DescribeInstanceTypes. ShapeUnknown when that
    cannot be told. `tell` gets one line of what its tags say that is not used (`shape_notes`), if any."""
    try:
        groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"]
        if not groups:
            raise _unknown(asg, "not found")
        group = groups[0]
        weighted = weighted_why(group)
        if weighted:
            raise _unknown(asg, weighted)
        types, spec, why = launch_types(group)
        if spec is not None:
            found = template_instance_type(ec2, spec)
            if found is None:
                raise _unknown(asg, f"its launch template {spec} sets no InstanceType")
            types = [found]
        if not types:
            raise _unknown(asg, why)
        described = instance_types(ec2, types)
    except AWS_FAILURES as err:
        raise _unknown(asg, f"cannot describe it ({error_code(err)})") from None
    tags = {str(t["Key"]): str(t.get("Value", "")) for t in group.get("Tags") or []}
    zones = [str(z) for z in group.get("AvailabilityZones") or []]
    region = str(getattr(getattr(ec2, "meta", None), "region_name", "") or "")
    template = node_template(tags)
    notes = shape_notes(tags, template)
    if notes and tell is not None:
        tell(one_line(f"ASG {asg}: " + "; ".join(notes), limit=600))
    return template_shape(asg, types, described, template, zones, region, overrides)


def _no_gpus_why(types: Sequence[str], template: NodeTemplate, given: Mapping[str, float]) -> str:
    if NVIDIA_GPU in given:
        return f"demand.kubernetes.allocatable says {NVIDIA_GPU}: 0 (a node with no GPUs)"
    if NVIDIA_GPU in template.resources:
        return f"its tag {RESOURCES_PREFIX}{NVIDIA_GPU} says 0 (a node with no GPUs): tag the GPUs per node"
    return (
        f"instance types {', '.join(types)}: not all have GPUs "
        f"(tag {RESOURCES_PREFIX}{NVIDIA_GPU} with the GPUs per node if they do)"
    )


def _unknown(asg: str, why: str) -> ShapeUnknown:
    return ShapeUnknown("", asg, why, what=f"ASG {asg}")
