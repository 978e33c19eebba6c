"""`gpufleet doctor`'s reading (glue): what the account holds, read-only, in as few calls as the APIs
allow - every group (DescribeAutoScalingGroups, EKS list/describe), the region's native scaling policies
(DescribePolicies), the alarms (DescribeAlarms, tags only of the alarms that matter), and whether the Slack
secret and the SNS topic exist (DescribeSecret, GetTopicAttributes: never the secret's value). Rules:
`doctor.core`."""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.backlog import BacklogUnreadable, latest_values, queue_counts
from gpufleet.aws.clients import AWS_FAILURES, AwsClients, Session, client, error_code, new_session
from gpufleet.aws.fleet import FleetReader, builtin_groups
from gpufleet.aws.groups.provider import GroupShapes
from gpufleet.aws.metrics import group_dimensions
from gpufleet.domain import defaults
from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, QueuedSource
from gpufleet.events.alarms import described_metrics
from gpufleet.kubernetes.client import Connection, HttpProblem
from gpufleet.kubernetes.cluster import TIMEOUT_S, ClusterAccess, PodReader
from gpufleet.kubernetes.marks import may_patch_nodes
from gpufleet.policy.fleet import Consolidation, FleetPolicy
from gpufleet.settings import ENV_KUBE_ENDPOINTS, KubeEndpoint, Settings
from gpufleet_tools.doctor.core import AccountView, AlarmView, DemandView, Presence, reads_gpufleet_metrics
from gpufleet_tools.doctor.hyperpod_roles import ClusterRoles, RoleView, denies_other_slurm, puts_anywhere
from gpufleet_tools.doctor.queued_access import queued_jobs_check

_NOT_FOUND = ("ResourceNotFoundException", "NotFound", "NotFoundException")


@dataclass
class AccountReader:
    fleet: FleetReader
    alarms: AlarmReader
    secrets: Any
    sns: Any
    demand: DemandProbe | None = None
    roles: RoleProbe | None = None  # the execution roles of the HyperPod clusters the policy names

    def read(self, policy: FleetPolicy, slack_secret_arn: str | None, topic_arn: str | None) -> AccountView:
        groups = self.fleet.every_group()
        clusters = sorted({r.cluster for r in policy.groups if r.kind is GroupKind.HYPERPOD and r.cluster})
        return AccountView(
            hyperpod=tuple(self.roles.read(c) for c in clusters) if self.roles else (),
            groups=tuple(groups),
            demand=tuple(self.demand.check(policy, groups)) if self.demand else (),
            scaling_policies=self.fleet.scaling_policies(),
            alarms=tuple(self._alarms(policy)),
            slack_secret=self._presence(
                lambda: self.secrets.describe_secret(SecretId=slack_secret_arn), slack_secret_arn
            ),
            topic=self._presence(lambda: self.sns.get_topic_attributes(TopicArn=topic_arn), topic_arn),
        )

    def _alarms(self, policy: FleetPolicy) -> list[AlarmView]:
        out = []
        for alarm, composite in self.alarms.every_alarm():
            metrics = described_metrics(alarm)
            ours = alarm["AlarmName"].startswith(policy.alarm_prefix)
            if not ours and not reads_gpufleet_metrics(metrics):
                continue  # neither named for gpufleet nor reading its metrics: not doctor's business
            tags = self.alarms.tags(alarm.get("AlarmArn"))
            plain = bool(alarm.get("MetricName")) and not composite  # its threshold is on the metric itself
            out.append(
                AlarmView(
                    name=alarm["AlarmName"],
                    tags=tags,
                    metrics=metrics,
                    composite=composite,
                    threshold=alarm.get("Threshold") if plain else None,
                    comparison=alarm.get("ComparisonOperator") if plain else None,
                )
            )
        return out

    @staticmethod
    def _presence(describe: Any, arn: str | None) -> Presence:
        if not arn:
            return Presence.NOT_CONFIGURED
        try:
            describe()
        except AWS_FAILURES as exc:
            if error_code(exc) in _NOT_FOUND:
                return Presence.MISSING
            raise
        return Presence.PRESENT


def build_account_reader(session: Session | None = None) -> AccountReader:
    """`gpufleet doctor`'s read-only view of the account (the caller's credentials, not a function's role)."""
    clients = AwsClients.create(session)
    overrides = Settings.from_env(os.environ).kube_endpoints  # local runs: as the scaler reads them
    probe = DemandProbe(
        clients.eks, client("sqs", session), clients.cloudwatch, session or new_session(), datetime.now(UTC), overrides
    )
    return AccountReader(
        FleetReader.of(clients.autoscaling, clients.eks),
        AlarmReader(clients.cloudwatch),
        client("secretsmanager", session),
        client("sns", session),
        probe,
        RoleProbe(client("sagemaker", session), client("iam", session)),
    )


VIEW_POLICY = "AmazonEKSViewPolicy"
NODE_MARKS_CHECK_S = 10.0  # one access review: an answer within it or the check says why


@dataclass
class DemandProbe:
    """Reads each managed group's demand source the way the scaler would, with the caller's credentials:
    the cluster (DescribeCluster, its access entries, one pod listing), the queue, the backlog metric."""

    eks: Any
    sqs: Any
    cloudwatch: Any
    session: Session
    now: datetime
    overrides: Mapping[str, KubeEndpoint] = field(default_factory=dict)  # GPUFLEET_KUBE_ENDPOINTS, as the scaler
    # Which cluster each group's nodes join, by its kind's adapter (no call: the rule and the group's tags).
    groups: GroupShapes = field(default_factory=lambda: builtin_groups(None, None))  # type: ignore[arg-type]

    def check(self, policy: FleetPolicy, groups: list[GroupObservation]) -> list[DemandView]:
        out: list[DemandView] = []
        clusters: dict[str, DemandView] = {}
        marks: dict[str, DemandView] = {}  # clusters a group drains by attrition on: may nodes be patched?
        queued: dict[tuple[str, QueuedSource], DemandView] = {}  # may each system's objects be listed?
        for obs in groups:
            settings = policy.settings_for(obs.ref, obs.tags)
            d = settings.demand if settings else None
            if d is None:
                continue
            if d.kubernetes is not None:  # a managed node group's cluster, or a self-managed ASG's (rule or tags)
                cluster, why = self.groups.joined_cluster(obs, d.kubernetes.cluster)
                if cluster is None:
                    out.append(DemandView(group=obs.ref.key, source=f"pods of {obs.ref.key}", problem=why))
                    continue
                if cluster not in clusters:  # one check per cluster (setdefault would check it again)
                    clusters[cluster] = self._cluster(cluster)
                out.append(clusters[cluster].model_copy(update={"group": obs.ref.key}))
                if settings is not None and settings.consolidate is Consolidation.ATTRITION:
                    if cluster not in marks:
                        marks[cluster] = self._node_marks(cluster)
                    out.append(marks[cluster].model_copy(update={"group": obs.ref.key}))
                for system in d.kubernetes.queued if clusters[cluster].problem is None else ():  # else: said
                    if (cluster, system) not in queued:
                        queued[(cluster, system)] = self._queued_jobs(cluster, system)
                    out.append(queued[(cluster, system)].model_copy(update={"group": obs.ref.key}))
            elif d.sqs is not None:
                out.append(self._queue(obs.ref.key, d.sqs.queue_url))
            elif d.metric is not None:
                dims = d.metric.dimensions if d.metric.dimensions is not None else group_dimensions(obs.ref)
                out.append(self._metric(obs.ref.key, d.metric.namespace, d.metric.metric_name, dims))
        return out

    def _cluster(self, cluster: str) -> DemandView:
        source = f"cluster {cluster}"
        try:
            found = self.eks.describe_cluster(name=cluster)["cluster"]
        except AWS_FAILURES as exc:
            return DemandView(group="", source=source, problem=f"DescribeCluster failed ({error_code(exc)})")
        mode = found.get("accessConfig", {}).get("authenticationMode")
        override = self.overrides.get(cluster)
        if override is not None and override.token is not None:
            return self._with_token(cluster, source)
        if mode == "CONFIG_MAP":
            return DemandView(
                group="", source=source, problem="its authentication mode is CONFIG_MAP: access entries need API"
            )
        entry = self._view_entry(cluster)
        try:
            pods = PodReader(self.eks, self.session, self.overrides).read(cluster)
        except ClusterUnreadable as exc:
            if exc.kind in ("timeout", "unreachable", "tls", "describe"):
                return DemandView(group="", source=source, problem=exc.cause)
            reached = f"the API answers ({exc.kind} for your credentials)"
        else:
            reached = f"the API answers: {len(pods.waiting)} pod(s) waiting for GPUs now"
        if entry is None:
            return DemandView(group="", source=source, doubt=f"{reached}; access entries could not be read")
        if not entry:
            hint = "name it in the stack's EksClusters parameter"
            return DemandView(group="", source=source, problem=f"no access entry has {VIEW_POLICY} ({hint})")
        return DemandView(group="", source=source, found=f"{reached}; {VIEW_POLICY} for {', '.join(entry)}")

    def _node_marks(self, cluster: str) -> DemandView:
        """Whether the identity the scaler's read uses here may patch nodes (cordon by attrition): one
        SelfSubjectAccessReview. With a token GPUFLEET_KUBE_ENDPOINTS gives that is the scaler's own; on
        EKS it is the caller's, so a denial is an error and an allowance says whose it is."""
        source = f"cluster {cluster}"
        what = "node marks (nodes: patch)"
        try:
            server = ClusterAccess(self.eks, self.session, self.overrides).server(cluster)
            connection = Connection(server, TIMEOUT_S, NODE_MARKS_CHECK_S)
            try:
                allowed, reason = may_patch_nodes(connection)
            finally:
                connection.close()
        except ClusterUnreadable as exc:
            return DemandView(group="", source=source, what=what, problem=exc.cause)
        except HttpProblem as problem:
            return DemandView(
                group="", source=source, what=what, problem=f"the access review failed ({problem.reason})"
            )
        if not allowed:
            hint = (
                f"apply deploy/kubernetes/gpufleet-node-marks.yaml and give the scaler's access entry the "
                f"Kubernetes group {defaults.NODE_MARKS_GROUP} (the template's ScalerEksAccess* do)"
            )
            return DemandView(group="", source=source, what=what, problem=f"nodes may not be patched: {hint}")
        token = self.overrides.get(cluster)
        whose = "the scaler's token" if token is not None and token.token is not None else "your credentials"
        return DemandView(
            group="", source=source, what=what, found=f"nodes may be patched ({whose}; {reason or 'allowed'})"
        )

    def _queued_jobs(self, cluster: str, system: QueuedSource) -> DemandView:
        return queued_jobs_check(self.eks, ClusterAccess(self.eks, self.session, self.overrides), cluster, system)

    def _with_token(self, cluster: str, source: str) -> DemandView:
        """A cluster GPUFLEET_KUBE_ENDPOINTS gives a token for (the local stack's API; a cluster outside
        EKS's DescribeCluster): the scaler reads it with that token, not its role, so access entries and
        the authentication mode do not apply; the token must be let in."""
        try:
            pods = PodReader(self.eks, self.session, self.overrides).read(cluster)
        except ClusterUnreadable as exc:
            return DemandView(
                group="", source=source, problem=f"{exc.cause} (with the token {ENV_KUBE_ENDPOINTS} gives)"
            )
        waiting = f"the API answers: {len(pods.waiting)} pod(s) waiting for GPUs now"
        return DemandView(group="", source=source, found=f"{waiting}, with the token {ENV_KUBE_ENDPOINTS} gives")

    def _view_entry(self, cluster: str) -> list[str] | None:
        """The principals with AmazonEKSViewPolicy on the cluster; None when they cannot be read."""
        try:
            principals = self.eks.list_access_entries(clusterName=cluster).get("accessEntries", [])
            return [
                p.rsplit("/", 1)[-1]
                for p in principals
                if any(
                    a.get("policyArn", "").endswith(VIEW_POLICY)
                    for a in self.eks.list_associated_access_policies(clusterName=cluster, principalArn=p).get(
                        "associatedAccessPolicies", []
                    )
                )
            ]
        except AWS_FAILURES:
            return None

    def _queue(self, group: str, url: str) -> DemandView:
        source = f"queue {url.rstrip('/').rsplit('/', 1)[-1]}"
        try:
            visible, in_flight = queue_counts(self.sqs, url)
        except BacklogUnreadable as exc:
            return DemandView(group=group, source=source, problem=exc.why)
        found = f"{visible} message(s) waiting, {in_flight} being worked on now"
        return DemandView(group=group, source=source, found=found, in_flight=in_flight)

    def _metric(self, group: str, namespace: str, name: str, dims: dict[str, str]) -> DemandView:
        source = f"metric {namespace}/{name}"
        try:
            [value] = latest_values(self.cloudwatch, [(namespace, name, dims)], self.now)
        except BacklogUnreadable as exc:
            return DemandView(group=group, source=source, problem=exc.why)
        if value is None:
            where = ", ".join(f"{k}={v}" for k, v in dims.items())
            return DemandView(
                group=group,
                source=source,
                doubt=f"no datum in the last 5 minutes on {where}: is its publisher running?",
            )
        if value != value or value < 0:  # NaN or negative: the scaler reads it as unreadable
            return DemandView(group=group, source=source, problem=f"the latest datum is {value:g}, not a count of GPUs")
        return DemandView(group=group, source=source, found=f"{value:g} GPU(s) requested by waiting jobs now")


class RoleProbe:
    """Reads ClusterRoles with the operator's credentials (read-only calls only)."""

    def __init__(self, sagemaker: Any, iam: Any) -> None:
        self.sagemaker, self.iam = sagemaker, iam

    def read(self, cluster: str) -> ClusterRoles:
        try:
            described = self.sagemaker.describe_cluster(ClusterName=cluster)
            tags = {
                t["Key"]: t.get("Value", "")
                for t in self.sagemaker.list_tags(ResourceArn=described["ClusterArn"]).get("Tags", [])
            }
        except AWS_FAILURES as exc:
            return ClusterRoles(cluster=cluster, unread=f"DescribeCluster failed ({error_code(exc)})")
        groups = {
            str(g["InstanceGroupName"]): str(g.get("ExecutionRole") or "") for g in described.get("InstanceGroups", [])
        }
        from gpufleet.aws.hyperpod import controller_group  # the scaler's own rule (loads SageMaker's model lazily)

        controller, why = controller_group(described, tags)
        roles = {arn: self._role(arn) for arn in sorted(set(groups.values())) if arn}
        return ClusterRoles(cluster=cluster, groups=groups, controller=controller, why=why, roles=roles)

    def _role(self, arn: str) -> RoleView:
        name = arn.rsplit("/", 1)[-1]
        try:
            statements = [*self._inline(name), *self._attached(name)]
        except AWS_FAILURES as exc:
            return RoleView(arn=arn, unread=error_code(exc))
        return RoleView(
            arn=arn, denies_other_slurm=denies_other_slurm(statements), puts_anywhere=puts_anywhere(statements)
        )

    def _inline(self, name: str) -> list[Mapping[str, Any]]:
        out: list[Mapping[str, Any]] = []
        for page in self.iam.get_paginator("list_role_policies").paginate(RoleName=name):
            for policy in page.get("PolicyNames", []):
                doc = self.iam.get_role_policy(RoleName=name, PolicyName=policy)["PolicyDocument"]
                out += _statements(doc)
        return out

    def _attached(self, name: str) -> list[Mapping[str, Any]]:
        out: list[Mapping[str, Any]] = []
        for page in self.iam.get_paginator("list_attached_role_policies").paginate(RoleName=name):
            for policy in page.get("AttachedPolicies", []):
                arn = policy["PolicyArn"]
                version = self.iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
                doc = self.iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"]["Document"]
                out += _statements(doc)
        return out


def _statements(doc: Any) -> list[Mapping[str, Any]]:
    """A policy document's statements (IAM returns it URL-encoded JSON in the raw API; boto3 decodes it)."""
    if isinstance(doc, str):
        doc = json.loads(urllib.parse.unquote(doc))
    found = doc.get("Statement", [])
    return [s for s in (found if isinstance(found, list) else [found]) if isinstance(s, Mapping)]
