"""SageMaker HyperPod clusters orchestrated by Slurm: each instance group is a gpufleet group
(`hyperpod:CLUSTER/GROUP`). Read with DescribeCluster and ListClusterNodes; grown or shrunk to a count with
UpdateCluster; idle nodes removed by id with BatchDeleteClusterNodes. docs/hyperpod.md says what it does
and does not do.

Which nodes run a Slurm job is Slurm's to say, not the node's: the backlog publisher on the cluster's
controller node puts `IdleNode` = 1 each minute for every node Slurm reports IDLE (defaults.HYPERPOD_IDLE_*),
into its own namespace `Slurm/${aws:userid}` ("Slurm/ROLEID:SageMaker": HyperPod names every node's session
SageMaker, so it is the controller group's role's; schema.slurm_namespace), in the same
PutMetricData call as the group's `PendingGPUs` (the marker that a run's report landed). Only that namespace
is read: the controller node is found from DescribeCluster and ListClusterNodes, its role id from IAM
(ReportSources); IAM denies every other Slurm namespace to the roles gpufleet ships, and data anywhere else
(plain `Slurm`, another role's) is ignored and told once. No controller identified, or a controller role
another instance group shares (its nodes would have the controller's aws:userid): nothing is trusted. This
module reads that report (read_report); what
it says is domain.slurm_report's, pure: a node is a candidate for removal only if the newest landed report
(this minute's or the last) called it idle and every recent minute did (idle_nodes); anything else, a stale
report or an unreadable answer, keeps it (fail closed). A node gpufleet asked Slurm to drain (consolidation
by attrition) is one only once that newest report also says Slurm shows it drained by gpufleet
(`DrainedNode`, drained_nodes): the clock is never trusted for it. Its count is never lowered (set_count):
only idle nodes go, by id. API facts relied on (SageMaker API reference, botocore's sagemaker model):
- ClusterInstanceStatus (ListClusterNodes' InstanceStatus.Status): Running | Failure | Pending |
  ShuttingDown | SystemUpdating | DeepHealthCheckInProgress | NotFound | DetachInProgress | AttachInProgress;
- UpdateCluster takes the instance groups to change ("Specify the instance groups to update"; removing
  one is InstanceGroupsToDelete, so a group left out is left as it is); each spec needs InstanceCount,
  InstanceGroupName and ExecutionRole (InstanceType and LifeCycleConfig too in older API versions), and
  the reference does not promise that a field left out keeps its value: the spec is built from
  DescribeCluster member by member after botocore's input shape (build_spec), only the count changed;
- BatchDeleteClusterNodes: at most 99 node ids a call; answers Successful and Failed (NodeIdNotFound |
  InvalidNodeStatus | NodeIdInUse); the deleted nodes leave the group's count.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import botocore.session
from botocore.exceptions import ClientError
from botocore.model import Shape

from gpufleet.aws.clients import AWS_FAILURES, chunks, client, error_code, new_session
from gpufleet.aws.metrics import GpuMetricsReader, MetricsIncomplete, SeriesQuery
from gpufleet.aws.slurm_marks import RequestedDrain, SlurmMarker, prune_marks, read_drains
from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Decision,
    GroupObservation,
    GroupRef,
    InstanceObservation,
    MarkChannel,
    NodeMark,
)
from gpufleet.domain.slurm_report import (
    DRAINED_NODE,
    IDLE_NODE,
    REPORT_LANDED,
    SlurmReport,
    SlurmWord,
    asked_drains,
    by_minute,
    late_drains,
    minute_of,
    nodes_to_read,
)
from gpufleet_node import schema

# HyperPod's node states (ClusterInstanceStatus, ListClusterNodes' InstanceStatus.Status) as the other kinds'
# lifecycle words: (lifecycle_state, healthy). Only InService nodes are capacity or victims. A state whose
# word begins with "Pending" is a node on its way: the core counts it against waiting work (on_the_way),
# so a backlog does not ask for it again. Sources (SageMaker API reference ClusterInstanceStatusDetails;
# SageMaker HyperPod developer guide, "Deep health checks" and "Automatic node recovery and auto-resume"):
# - DeepHealthCheckInProgress: a new (or checked) node held in a Slurm maintenance reservation until its
#   deep health checks pass, then released to workloads: it is the capacity just asked for, on its way;
# - SystemUpdating: HyperPod patching the node (UpdateClusterSoftware, AutoPatchConfig): back when done;
# - Failure: with NodeRecovery Automatic ("by default, the clusters are set up with Automatic node
#   recovery") HyperPod reboots or replaces the node within the same count: on its way, never a reason to
#   add one. Under NodeRecovery None nothing repairs it (FAILED_NO_RECOVERY): neither capacity nor on its way.
NODE_STATES: dict[str, tuple[str, bool]] = {
    "Running": ("InService", True),
    "Pending": ("Pending", True),
    "AttachInProgress": ("Pending", True),
    "DeepHealthCheckInProgress": ("Pending:DeepHealthCheckInProgress", True),
    "SystemUpdating": ("Pending:SystemUpdating", True),
    "Failure": ("Pending:Failure", False),
    "ShuttingDown": ("Terminating", True),
    "DetachInProgress": ("Terminating", True),
    "NotFound": ("Terminated", True),
}
FAILED_NO_RECOVERY = ("Failure", False)  # a Failure node of a cluster whose NodeRecovery is None
NODE_RECOVERY_NONE = "None"  # DescribeCluster's NodeRecovery (ClusterNodeRecovery: Automatic | None)
# DescribeCluster's names (ClusterInstanceGroupDetails) for what UpdateCluster takes under another name
# (ClusterInstanceGroupSpecification), at the top level. At any depth, a spec member N the details do not
# hold under its own name is read from Desired<N> (what was last asked: an update HyperPod may still be
# rolling out), else from Current<N> (what runs): DesiredImageId -> ImageId,
# AutoPatchConfig.CurrentPatchSchedule -> PatchSchedule, InstanceRequirements.CurrentInstanceTypes ->
# InstanceTypes, KubernetesConfig.CurrentLabels -> Labels. A details member no spec member is read from
# (CurrentCount, Status, ActiveOperations, ...) is the service's state, not the spec: it is not sent.
SPEC_RENAMED = {"MinCount": "MinInstanceCount"}
SPEC_PREFIXES = ("Desired", "Current")
SPEC_SHAPE = "ClusterInstanceGroupSpecification"
DETAILS_SHAPE = "ClusterInstanceGroupDetails"
GONE = "NodeIdNotFound"  # a delete retried after the node went: done, not failed
# The OOM guard's answer for a HyperPod node with a failed GPU: no ASG holds it, and HyperPod has its own
# recovery (health checks, automatic node recovery; BatchReplaceClusterNodes by hand). Told, never acted on.
HYPERPOD_NOT_REPLACED = (
    "told only: a HyperPod node is replaced by HyperPod's own node recovery, not by gpufleet "
    "(by hand: aws sagemaker batch-replace-cluster-nodes)"
)


@dataclass(frozen=True)
class ReportSource:
    """Where one cluster's Slurm report is read: the controller node's own namespace (`namespace`), or
    why none is trusted (`why`; namespace None)."""

    namespace: str | None
    why: str = ""
    controller: str | None = None  # the controller node's instance id
    role: str | None = None  # its instance group's ExecutionRole (ARN)


def controller_group(cluster: Mapping[str, Any], tags: Mapping[str, str]) -> tuple[str | None, str]:
    """The instance group that runs Slurm's controller: the one DescribeCluster gives SlurmConfig.NodeType
    Controller (clusters whose Slurm config is the API's), else the one the cluster's
    HYPERPOD_CONTROLLER_GROUP_TAG names (clusters configured by provisioning_parameters.json's
    `controller_group`, which no API returns). (None, why) when neither says exactly one."""
    groups = {str(g.get("InstanceGroupName")): g for g in cluster.get("InstanceGroups", [])}
    by_api = sorted(
        name
        for name, g in groups.items()
        if (g.get("SlurmConfig") or {}).get("NodeType") == defaults.HYPERPOD_CONTROLLER_NODE_TYPE
    )
    if len(by_api) == 1:
        return by_api[0], ""
    if len(by_api) > 1:
        return None, f"DescribeCluster names {len(by_api)} controller instance groups ({', '.join(by_api)})"
    tag = defaults.HYPERPOD_CONTROLLER_GROUP_TAG
    named = tags.get(tag)
    if named is None:
        return None, (
            "no instance group is Slurm's controller by DescribeCluster (SlurmConfig.NodeType) and the cluster "
            f"has no tag {tag} (tag it with the controller group's name)"
        )
    if named not in groups:
        return None, f"the cluster's tag {tag}={named} names no instance group of it"
    return named, ""


class LazyClient:
    """A boto3 client made on first use: the SageMaker model is large, and a fleet without HyperPod
    groups should not pay for loading it at every cold start."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None

    def __getattr__(self, name: str) -> Any:
        if self._client is None:
            self._client = self._make()
        return getattr(self._client, name)


class CountNotLowered(ValueError):
    """A count below the group's TargetCount was asked of UpdateCluster: refused, nothing changes (the
    decision fails and is told)."""


class DeleteRefused(RuntimeError):
    """BatchDeleteClusterNodes refused some nodes: the intent is kept and the next invocation retries
    the ones still there (scaling.execution.remaining)."""


def ec2_type(instance_type: str | None) -> str | None:
    """`ml.p5.48xlarge` -> `p5.48xlarge`: the EC2 name DescribeInstanceTypes knows (GPUs per node)."""
    if not instance_type:
        return None
    return instance_type.removeprefix("ml.")


def node_observation(
    node: dict[str, Any], runs_work: bool, drain: RequestedDrain | None = None, recovers: bool = True
) -> InstanceObservation:
    """One node; `drain`: gpufleet asked Slurm to drain it (aws.slurm_marks), and when; `recovers`: its
    cluster's NodeRecovery is Automatic (HyperPod's default), so a Failure node is being repaired. Its Slurm
    name is its hostname (`ip-A-B-C-D`), when ListClusterNodes gives PrivateDnsHostname."""
    status = str(node.get("InstanceStatus", {}).get("Status", ""))
    lifecycle, healthy = NODE_STATES.get(status, (status or "Unknown", False))
    if status == "Failure" and not recovers:
        lifecycle, healthy = FAILED_NO_RECOVERY
    return InstanceObservation(
        instance_id=node["InstanceId"],
        lifecycle_state=lifecycle,
        instance_type=ec2_type(node.get("InstanceType")),
        healthy=healthy,
        runs_work=runs_work,
        mark=NodeMark.NONE if drain is None else NodeMark.GPUFLEET,
        marked_at=None if drain is None else drain.at or datetime.min.replace(tzinfo=UTC),
        node_name=str(node.get("PrivateDnsHostname") or "").split(".")[0] or None,
    )


@functools.cache
def _group_shapes() -> tuple[Shape, Shape]:
    """(DescribeCluster's instance group shape, UpdateCluster's), from botocore's own SageMaker model (the
    one the client validates against), so a member a newer API adds is carried without a change here.
    Loaded on the first count change only: the model is large."""
    model = botocore.session.get_session().get_service_model("sagemaker")
    details = model.operation_model("DescribeCluster").output_shape.members["InstanceGroups"]
    spec = model.operation_model("UpdateCluster").input_shape.members["InstanceGroups"]
    return details.member, spec.member


def spec_fields() -> tuple[str, ...]:
    """UpdateCluster's instance group members (top level)."""
    return tuple(_group_shapes()[1].members)


def _source_of(name: str, details: Mapping[str, Any], top: bool) -> str | None:
    """Which details member feeds spec member `name`: its own name, a top-level SPEC_RENAMED one, or
    Desired<name> / Current<name>; None when the details hold none of them."""
    renamed = [old for old, new in SPEC_RENAMED.items() if new == name] if top else []
    for candidate in (name, *renamed, *(prefix + name for prefix in SPEC_PREFIXES)):
        if details.get(candidate) is not None:
            return candidate
    return None


def _carried(value: Any, out: Shape, into: Shape, path: str, left: list[str], top: bool = False) -> Any:
    """`value` (of DescribeCluster's shape `out`) as UpdateCluster's shape `into` takes it: a structure keeps
    only the members `into` has (each carried the same way), a list or map each item. A value of another
    type than the shape says is passed as it is (botocore's validation then names it). A structure that
    would lack a member `into` requires is None (left out, its path added to `left`)."""
    if into.type_name == "structure" and out.type_name == "structure" and isinstance(value, Mapping):
        spec: dict[str, Any] = {}
        for name, member in into.members.items():
            source = _source_of(name, value, top)
            if source is None or source not in out.members:
                continue
            carried = _carried(value[source], out.members[source], member, f"{path}.{name}", left)
            if carried is not None:
                spec[name] = carried
        missing = [m for m in into.required_members if m not in spec]
        if missing and not top:
            left.append(f"{path} (DescribeCluster gave it without {', '.join(missing)})")
            return None
        return spec
    if into.type_name == "list" and out.type_name == "list" and isinstance(value, list):
        listed = [_carried(v, out.member, into.member, f"{path}[{i}]", left) for i, v in enumerate(value)]
        return [v for v in listed if v is not None]
    if into.type_name == "map" and out.type_name == "map" and isinstance(value, Mapping):
        mapped = {k: _carried(v, out.value, into.value, f"{path}.{k}", left) for k, v in value.items()}
        return {k: v for k, v in mapped.items() if v is not None}
    return value


def build_spec(group: Mapping[str, Any], count: int) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The instance group's spec for UpdateCluster, built member by member from botocore's input shape:
    everything DescribeCluster said that UpdateCluster takes (under its own name, SPEC_RENAMED's or
    SPEC_PREFIXES'), at every depth, the count changed; and what had to be left out (a structure without a
    member UpdateCluster requires). Copying DescribeCluster's structures whole is what botocore refused
    before sending (`Unknown parameter in InstanceGroups[0].AutoPatchConfig: "CurrentPatchSchedule"`)."""
    details, spec_shape = _group_shapes()
    left: list[str] = []
    spec = _carried({k: v for k, v in group.items() if k != "InstanceCount"}, details, spec_shape, "", left, top=True)
    spec["InstanceCount"] = count
    return spec, tuple(p.lstrip(".") for p in left)


def update_spec(group: Mapping[str, Any], count: int) -> dict[str, Any]:
    """The instance group's spec for UpdateCluster (build_spec), the count changed."""
    return build_spec(group, count)[0]


@dataclass
class HyperPodFleet:
    """Reads and changes HyperPod instance groups named by policy rules (no tag discovery: each group
    is named, with its cluster and a max). It reads SageMaker and Slurm's report; what the report says
    of a node is `domain.slurm_report`'s rule. Long because observing, sizing and removing by id share
    one cluster read and one clock; whose report is read lives apart (`ReportSources`)."""

    sagemaker: Any
    cloudwatch: Any
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    marker: SlurmMarker | None = None  # the Slurm drains gpufleet asked for (consolidation by attrition)
    warn: Callable[[str], None] = field(default=logging.getLogger(__name__).warning)
    # IAM, for the controller's role id (GetRole); None: a client made on first use
    iam: Any = None
    _told: set[str] = field(default_factory=set, init=False, repr=False)  # clusters whose marks read failed
    _late: set[str] = field(default_factory=set, init=False, repr=False)  # nodes whose unlanded drain was told
    sources: ReportSources = field(init=False, repr=False)  # whose report is read, per cluster

    def __post_init__(self) -> None:
        self.sources = ReportSources(self)

    # ---- reading ----

    def observe(self, refs: Iterable[GroupRef], attrition: Collection[str] = ()) -> list[GroupObservation]:
        """The named groups that exist, with their nodes. A cluster that is gone, or orchestrated by EKS
        (not this adapter's), is skipped. Which nodes Slurm calls idle is not read here: `marked` reads it
        when a scale-in is weighed (with the nodes' GPU metrics), so a steady tick, the OOM guard and
        spot_watch pay no read per node. `attrition`: keys of the groups that consolidate by attrition: their
        cluster's Slurm marks are read once (unreadable: no marks channel, told once)."""
        by_cluster: dict[str, list[str]] = {}
        for ref in refs:
            if ref.kind is GroupKind.HYPERPOD and ref.cluster:
                by_cluster.setdefault(ref.cluster, []).append(ref.name)
        found: list[GroupObservation] = []
        for cluster_name, names in sorted(by_cluster.items()):
            cluster = self._cluster(cluster_name)
            if cluster is None or "Eks" in (cluster.get("Orchestrator") or {}):
                continue
            tags = self._tags(cluster["ClusterArn"])
            groups = {g["InstanceGroupName"]: g for g in cluster.get("InstanceGroups", [])}
            refs_here = [GroupRef(kind=GroupKind.HYPERPOD, cluster=cluster_name, name=n) for n in sorted(set(names))]
            drains = None
            if self.marker is not None and any(r.key in attrition for r in refs_here):
                drains = read_drains(self.marker, cluster_name, self._told, self.warn)
            listed = self._listed(cluster_name, drains)
            for ref in refs_here:
                if ref.name in groups:
                    marks = drains if ref.key in attrition else None
                    nodes = listed(ref.name)
                    recovers = cluster.get("NodeRecovery") != NODE_RECOVERY_NONE
                    found.append(_observation(ref, groups[ref.name], tags, nodes, marks, recovers))
        return found

    def _listed(self, cluster: str, drains: dict[str, RequestedDrain] | None) -> Callable[[str], list[dict[str, Any]]]:
        """How the cluster's nodes are listed this tick: per group (ListClusterNodes filtered by its name), or,
        when gpufleet has marks on the cluster, the whole cluster once: a mark whose node no group of the
        cluster lists is provably gone (deleted, a crash or a failed write between the delete and its
        forget), and its attribute is removed here (prune_marks), so the marks item never piles up."""
        if not drains:
            return functools.partial(self._nodes, cluster)
        everything = self._nodes(cluster, None)
        gone = prune_marks(self.marker, cluster, drains, {n["InstanceId"] for n in everything}, self.warn)
        for iid in gone:
            drains.pop(iid, None)
        return lambda group: [n for n in everything if n.get("InstanceGroupName") == group]

    def marked(
        self,
        observations: Sequence[GroupObservation],
        now: datetime,
        candidates: Mapping[str, Collection[str]] | None = None,
    ) -> list[GroupObservation]:
        """The same groups, each InService node that Slurm has not called idle through the window marked as
        running work (never a victim); with the report unreadable or stale, every one is and the group is
        closed for scale-in (the core says why). `candidates` (per group key): the only nodes that could be
        victims (their GPUs read idle); only they are read, every other node is marked running work, and
        with none no read is made. None: every InService node is read. One GetMetricData read in all."""
        ours = [o for o in observations if o.ref.kind is GroupKind.HYPERPOD]
        asked = nodes_to_read(ours, candidates)
        drains = asked_drains(ours)
        word = self._idle(asked, now, drains) if asked else SlurmWord()
        self.sources.tell_foreign({ref.cluster or "" for ref, _ in asked}, now)
        for line in late_drains(word, drains, now, self._late):
            self.warn(line)
        return [word.marked(o) if o.ref.kind is GroupKind.HYPERPOD else o for o in observations]

    def _cluster(self, name: str) -> dict[str, Any] | None:
        """DescribeCluster's answer; None for a cluster that is gone (SageMaker answers ResourceNotFound,
        moto ValidationException)."""
        try:
            return dict(self.sagemaker.describe_cluster(ClusterName=name))
        except ClientError as exc:
            if error_code(exc) in ("ResourceNotFound", "ResourceNotFoundException", "ValidationException"):
                return None
            raise

    def _tags(self, arn: str) -> dict[str, str]:
        tags: dict[str, str] = {}
        token: str | None = None
        while True:
            page = self.sagemaker.list_tags(ResourceArn=arn, **({"NextToken": token} if token else {}))
            tags.update({t["Key"]: t.get("Value", "") for t in page.get("Tags", [])})
            token = page.get("NextToken")
            if not token:
                return tags

    def _nodes(self, cluster: str, group: str | None) -> list[dict[str, Any]]:
        """Every node of the group (all pages); group None: every node of the cluster. The filter is a
        substring match: the exact name is kept."""
        nodes: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            args: dict[str, Any] = {"ClusterName": cluster, "MaxResults": defaults.LIST_CLUSTER_NODES_MAX_RESULTS}
            if group is not None:
                args["InstanceGroupNameContains"] = group
            if token:
                args["NextToken"] = token
            page = self.sagemaker.list_cluster_nodes(**args)
            nodes.extend(
                n for n in page.get("ClusterNodeSummaries", []) if group is None or n.get("InstanceGroupName") == group
            )
            token = page.get("NextToken")
            if not token:
                return nodes

    def _idle(
        self,
        running: Sequence[tuple[GroupRef, str]],
        now: datetime | None = None,
        asked: Mapping[str, datetime] | None = None,
    ) -> SlurmWord:
        """Slurm's word on the Running nodes, read now (ReportSources.word)."""
        return self.sources.word(running, now or self.now(), asked or {})

    # ---- changing ----

    def apply(self, decision: Decision, obs: GroupObservation) -> str:
        """Set the group's count (UpdateCluster), or remove the chosen idle nodes by id. Safe to repeat:
        a count already reached is not asked again, a node already gone is done."""
        ref = obs.ref
        if decision.action in (Action.SCALE_OUT, Action.SET_DESIRED):
            return self.set_count(ref, decision.desired, lower_ok=decision.action is Action.SCALE_OUT)
        if decision.action is Action.SCALE_IN:
            return self.delete_nodes(decision, obs)
        return "nothing to apply"

    def set_count(self, ref: GroupRef, count: int, lower_ok: bool = False) -> str:
        """UpdateCluster with the group's spec and `count`, never below its TargetCount: a lower count
        lets HyperPod choose which nodes go, busy ones included (the core removes idle nodes by id
        instead). A scale-out the group has already reached or passed (`lower_ok`: a resumed intent whose
        target another change has since raised) is done; any other lower count is refused."""
        cluster = self._cluster(ref.cluster or "")
        groups = {g["InstanceGroupName"]: g for g in (cluster or {}).get("InstanceGroups", [])}
        group = groups.get(ref.name)
        if group is None:
            raise LookupError(f"{ref.key}: the cluster or its instance group is gone")
        target = int(group.get("TargetCount", group.get("CurrentCount", 0)) or 0)
        if count == target or (lower_ok and count < target):
            return f"UpdateCluster {ref.key}: InstanceCount already {target}"
        if count < target:
            raise CountNotLowered(
                f"{ref.key}: InstanceCount {target} -> {count} refused: a lower count lets HyperPod choose which "
                "nodes go; only idle nodes are removed, by id"
            )
        spec, left = build_spec(group, count)
        self.sagemaker.update_cluster(ClusterName=ref.cluster, InstanceGroups=[spec])
        text = f"UpdateCluster {ref.key} InstanceCount = {count}"
        return f"{text}; left out {'; '.join(left)}" if left else text

    def delete_nodes(self, decision: Decision, obs: GroupObservation) -> str:
        """The victims that are still InService and still idle by this observation and by a fresh read of
        the idle report (a job that landed on one keeps it), in calls of at most 99; raises DeleteRefused
        when SageMaker refused any. What no read can see - a job Slurm starts after the publisher's last
        report and before the delete - is docs/hyperpod.md's residual race."""
        now_idle = {i.instance_id for i in obs.instances if i.in_service and not i.runs_work}
        if obs.scale_in_closed is None and now_idle & set(decision.victims):
            # Read Slurm's word again right before the delete, by the same rule (a minute may have
            # passed since the observation: a retry, a slow tick); unreadable now keeps every node.
            word = self._idle([(obs.ref, v) for v in decision.victims if v in now_idle], None, asked_drains([obs]))
            now_idle = set() if word.closed else now_idle & word.removable
        victims = [v for v in decision.victims if v in now_idle]
        kept = [v for v in decision.victims if v not in now_idle]
        if obs.scale_in_closed is not None:
            victims, kept = [], list(decision.victims)
        done: list[str] = []
        refused: list[str] = []
        for batch in chunks(victims, defaults.HYPERPOD_DELETE_MAX_NODES):
            answer = self.sagemaker.batch_delete_cluster_nodes(ClusterName=obs.ref.cluster, NodeIds=list(batch))
            done.extend(answer.get("Successful", []))
            for failed in answer.get("Failed", []):
                if failed.get("Code") == GONE:
                    done.append(failed["NodeId"])
                else:
                    refused.append(f"{failed['NodeId']} ({failed.get('Code')}: {failed.get('Message', '')})")
        text = f"BatchDeleteClusterNodes {obs.ref.key} {', '.join(done)}" if done else "victims already gone"
        if done and obs.marks is MarkChannel.SLURM and self.marker is not None:
            # The deleted nodes' marks go with them (a failure here is said, never fails the delete: the
            # next delete or observation of the cluster prunes them).
            prune_marks(self.marker, obs.ref.cluster or "", dict.fromkeys(done), set(), self.warn)
        if kept:
            text += f"; kept {', '.join(kept)} (no longer idle by Slurm, or not in service)"
        if refused:
            raise DeleteRefused(f"{text}; refused {', '.join(refused)}")
        return text


@dataclass
class ReportSources:
    """Whose Slurm report is read, per cluster (docs/hyperpod.md "Whose report is read"): the controller
    node found from DescribeCluster and ListClusterNodes, its role id from IAM (cached per role), the
    untrusted told once per cause, and the Slurm data elsewhere told once per namespace."""

    fleet: HyperPodFleet
    _role_ids: dict[str, str] = field(default_factory=dict, init=False, repr=False)  # "role ARN|node" -> RoleId
    # cluster -> (the minute it was found, where its report is read): found again each minute
    _sources: dict[str, tuple[datetime, ReportSource]] = field(default_factory=dict, init=False, repr=False)
    _untrusted: dict[str, str] = field(default_factory=dict, init=False, repr=False)  # cluster -> why told
    _foreign_at: dict[str, datetime] = field(default_factory=dict, init=False, repr=False)  # last listed
    _foreign: set[tuple[str, str]] = field(default_factory=set, init=False, repr=False)  # (cluster, ns) told

    def source(self, cluster: str, now: datetime) -> ReportSource:
        """Where `cluster`'s Slurm report is read: `Slurm/<role id>:SageMaker` of its controller group (one
        node; its ExecutionRole's RoleId, a role no other group shares), found again each minute; or why no
        report of it is trusted, told once per cause."""
        minute = minute_of(now)
        cached = self._sources.get(cluster)
        if cached is not None and cached[0] == minute:
            return cached[1]
        try:
            source = self._find_source(cluster)
        except AWS_FAILURES as exc:
            source = ReportSource(None, f"finding its Slurm controller failed ({error_code(exc)})")
        self._sources[cluster] = (minute, source)
        if source.why and self._untrusted.get(cluster) != source.why:
            self._untrusted[cluster] = source.why
            self.fleet.warn(
                f"hyperpod:{cluster}: Slurm's report is not trusted: {source.why}; no node of it is removed "
                "and its Slurm backlog is unreadable until its controller node is known (docs/hyperpod.md)"
            )
        elif not source.why:
            self._untrusted.pop(cluster, None)
        return source

    def _find_source(self, cluster_name: str) -> ReportSource:
        cluster = self.fleet._cluster(cluster_name)
        if cluster is None:
            return ReportSource(None, "the cluster is gone")
        name, why = controller_group(cluster, self.fleet._tags(cluster["ClusterArn"]))
        if name is None:
            return ReportSource(None, why)
        group = next(g for g in cluster.get("InstanceGroups", []) if g.get("InstanceGroupName") == name)
        nodes = [n["InstanceId"] for n in self.fleet._nodes(cluster_name, name)]
        if len(nodes) != 1:
            return ReportSource(None, f"its controller group {name} lists {len(nodes)} nodes, not one")
        role = str(group.get("ExecutionRole") or "")
        if not role:
            return ReportSource(None, f"its controller group {name} has no ExecutionRole")
        sharing = sorted(
            str(g.get("InstanceGroupName"))
            for g in cluster.get("InstanceGroups", [])
            if g.get("InstanceGroupName") != name and g.get("ExecutionRole") == role
        )
        if sharing:  # their nodes' credentials are the controller's: one aws:userid, one namespace
            return ReportSource(
                None,
                f"its controller group {name}'s execution role {role.rsplit('/', 1)[-1]} is shared with "
                f"{', '.join(sharing)}: every node of those groups could write the controller's report; give "
                "the controller group an execution role of its own",
                role=role,
            )
        role_id = self._role_id(role, nodes[0])
        userid = f"{role_id}:{defaults.HYPERPOD_SESSION_NAME}"
        return ReportSource(schema.slurm_namespace(userid), controller=nodes[0], role=role)

    def _role_id(self, role_arn: str, controller: str) -> str:
        """The role's unique id (the part of an instance profile's aws:userid before ':'), from IAM once per
        role and controller node in a warm container: it changes only when the role is deleted and made
        again, which a new controller node (a replaced one, a cluster made again) may come with."""
        key = f"{role_arn}|{controller}"
        if key not in self._role_ids:
            if self.fleet.iam is None:
                self.fleet.iam = client("iam", new_session())
            name = role_arn.rsplit("/", 1)[-1]
            self._role_ids = {k: v for k, v in self._role_ids.items() if not k.startswith(f"{role_arn}|")}
            self._role_ids[key] = str(self.fleet.iam.get_role(RoleName=name)["Role"]["RoleId"])
        return self._role_ids[key]

    def word(self, running: Sequence[tuple[GroupRef, str]], at: datetime, asked: Mapping[str, datetime]) -> SlurmWord:
        """Slurm's word on the Running nodes (slurm_word), read now, each cluster's from its controller
        node's own namespace only; a cluster whose controller cannot be told has every group read closed."""
        sources = {c: self.source(c, at) for c in sorted({ref.cluster or "" for ref, _ in running})}
        trusted = [(ref, iid) for ref, iid in running if sources[ref.cluster or ""].namespace is not None]
        namespaces = {c: src.namespace for c, src in sources.items() if src.namespace is not None}
        word = slurm_word(self.fleet.cloudwatch, namespaces, trusted, minute_of(at), asked)
        for ref, _ in running:
            source = sources[ref.cluster or ""]
            if source.why:
                word.closed[ref.key] = f"Slurm's report is not trusted: {source.why}"
            elif ref.key in word.closed and str(source.namespace) not in word.closed[ref.key]:
                # Said where it was looked for; a role made again since has a new id: asked again next time.
                word.closed[ref.key] += f" (read from {source.namespace} only)"
                self.forget_role(source.role)
        return word

    def forget_role(self, role: str | None) -> None:
        """A stale report: the role's id is asked again next time (a role made again has a new one)."""
        self._role_ids = {k: v for k, v in self._role_ids.items() if not k.startswith(f"{role or ''}|")}

    def tell_foreign(self, clusters: Iterable[str], now: datetime) -> None:
        """Each cluster's Slurm data elsewhere (foreign), told once."""
        for cluster in sorted(clusters):
            self.foreign(cluster, now)

    def foreign(self, cluster: str, now: datetime) -> None:
        """Once an hour at most (HYPERPOD_FOREIGN_REPORT_CHECK_S): the Slurm namespaces other than the
        controller node's own that hold this cluster's report (ListMetrics, recently active series, one call
        per report metric), each told once: gpufleet ignores them (a forger's, a second publisher's, a
        publisher of before the namespace change). A failed listing is only logged: it is advice."""
        last = self._foreign_at.get(cluster)
        if last is not None and now - last < timedelta(seconds=defaults.HYPERPOD_FOREIGN_REPORT_CHECK_S):
            return
        self._foreign_at[cluster] = now
        own = self.source(cluster, now).namespace
        seen: set[str] = set()
        try:
            for metric in (
                defaults.HYPERPOD_PENDING_METRIC,
                defaults.HYPERPOD_IDLE_METRIC,
                defaults.HYPERPOD_DRAINED_METRIC,
            ):
                seen |= self._namespaces_with(metric, cluster)
        except Exception as exc:  # advice only: a listing that fails never fails the read it rides on
            why = error_code(exc) if isinstance(exc, AWS_FAILURES) else type(exc).__name__
            logging.getLogger(__name__).info("ListMetrics failed (%s): ignored Slurm data not listed", why)
            return
        for ns in sorted(seen - {own}):
            if (cluster, ns) not in self._foreign:
                self._foreign.add((cluster, ns))
                self.fleet.warn(
                    f"hyperpod:{cluster}: Slurm report data in namespace {ns} ignored: only its controller node's "
                    f"own {own or 'namespace (unknown now)'} is read (a forger, a second publisher, or one "
                    "installed before gpufleet read the controller's own namespace: docs/hyperpod.md)"
                )

    def _namespaces_with(self, metric: str, cluster: str) -> set[str]:
        found: set[str] = set()
        args: dict[str, Any] = {
            "MetricName": metric,
            "Dimensions": [{"Name": "ClusterName", "Value": cluster}],
            "RecentlyActive": defaults.HYPERPOD_FOREIGN_REPORT_RECENT,
        }
        while True:
            page = self.fleet.cloudwatch.list_metrics(**args)
            found |= {
                str(m.get("Namespace"))
                for m in page.get("Metrics", [])
                if str(m.get("Namespace")) == schema.SLURM_NAMESPACE
                or str(m.get("Namespace")).startswith(schema.SLURM_NAMESPACE_PREFIX)
            }
            if not page.get("NextToken"):
                return found
            args["NextToken"] = page["NextToken"]


def read_report(
    cloudwatch: Any,
    namespaces: Mapping[str, str],
    running: Sequence[tuple[GroupRef, str]],
    end: datetime,
    asked: Collection[str] = (),
) -> SlurmReport:
    """Slurm's report in one strict GetMetricData read (GpuMetricsReader: calls of at most 500 queries,
    60 s periods), each datum keyed by its minute, from the window's minutes before the current one
    (`end`) to the current one's end (a datum the publisher put in it counts too): per node the Minimum of
    its IdleNode, per node gpufleet asked to drain (`asked`) the Minimum of its DrainedNode too, per group
    the minutes its report landed (the SampleCount of its PendingGPUs: one query per group), each from its
    cluster's namespace (`namespaces`: cluster -> its controller node's own). A result GetMetricData did
    not complete raises MetricsIncomplete (nothing is idle then)."""
    start, stop = end - timedelta(minutes=defaults.HYPERPOD_IDLE_MINUTES), end + timedelta(minutes=1)
    groups = {ref.key: ref for ref, _ in running}
    queries = [
        SeriesQuery(
            f"g:{key}",
            REPORT_LANDED,
            tuple(ref.metric_dimensions.items()),
            "SampleCount",
            namespaces[ref.cluster or ""],
        )
        for key, ref in groups.items()
    ]

    def node_query(prefix: str, metric: schema.Metric, ref: GroupRef, iid: str) -> SeriesQuery:
        dims = tuple({**ref.metric_dimensions, schema.DIM_INSTANCE_ID: iid}.items())
        return SeriesQuery(f"{prefix}:{iid}", metric, dims, "Minimum", namespaces[ref.cluster or ""])

    queries += [node_query("n", IDLE_NODE, ref, iid) for ref, iid in running]
    queries += [node_query("d", DRAINED_NODE, ref, iid) for ref, iid in running if iid in asked]
    points = GpuMetricsReader(cloudwatch).fetch_points(queries, start, stop, strict=True)
    return SlurmReport(
        minutes={iid: by_minute(points[f"n:{iid}"]) for _, iid in running},
        drained={iid: by_minute(points[f"d:{iid}"]) for _, iid in running if iid in asked},
        reports={key: {minute_of(at) for at, value in points[f"g:{key}"] if value > 0} for key in groups},
    )


def slurm_word(
    cloudwatch: Any,
    namespaces: Mapping[str, str],
    running: Sequence[tuple[GroupRef, str]],
    end: datetime,
    asked: Mapping[str, datetime],
) -> SlurmWord:
    """Slurm's word on the Running nodes (`SlurmReport.word` says the rules), read now; a read that fails
    or does not complete closes every group read (then none of its nodes is idle). `namespaces`: cluster ->
    its controller node's own namespace; `end`: the current minute; `asked`: the nodes gpufleet asked to
    drain, and when."""
    if not running:
        return SlurmWord()
    keys = {ref.key for ref, _ in running}
    try:
        report = read_report(cloudwatch, namespaces, running, end, asked)
    except AWS_FAILURES as exc:
        why = f"GetMetricData failed ({error_code(exc)}): which nodes Slurm calls idle is unknown"
        return SlurmWord.unknown(keys, why)
    except MetricsIncomplete as exc:
        return SlurmWord.unknown(keys, f"{exc}: which nodes Slurm calls idle is unknown")
    return report.word(running, end, asked)


def _observation(
    ref: GroupRef,
    group: dict[str, Any],
    tags: dict[str, str],
    nodes: list[dict[str, Any]],
    drains: Mapping[str, RequestedDrain] | None = None,
    recovers: bool = True,
) -> GroupObservation:
    """The group as DescribeCluster and ListClusterNodes say; no node is marked running work until `marked`
    reads Slurm's word (no victim is chosen before that: the core waits for the nodes' GPU metrics, and
    with_instance_metrics marks them; the delete reads it again). It shrinks by victims only: a lower
    InstanceCount would let HyperPod choose which nodes go. `drains` (read: the group consolidates by
    attrition): its nodes can be drained through Slurm, and those gpufleet asked to drain say so. A node
    someone else drained is not known here (only the controller sees Slurm's reasons): Slurm does not call it
    idle, so it is never a victim."""
    # When each drain was asked rides along: only a report made after it can show the drain (drained_nodes).
    instances = tuple(node_observation(n, False, (drains or {}).get(n["InstanceId"]), recovers) for n in nodes)
    instance_type = ec2_type(group.get("InstanceType"))
    floor = int(group.get("MinCount") or 0)
    return GroupObservation(
        ref=ref,
        min_size=floor,
        max_size=max(defaults.HYPERPOD_NO_MAX, floor),
        desired=int(group.get("TargetCount", group.get("CurrentCount", 0)) or 0),
        instances=instances,
        tags=tags,
        instance_types=(instance_type,) if instance_type else (),
        shrinks_by_victims_only=True,
        marks=MarkChannel.SLURM if drains is not None else None,
    )
