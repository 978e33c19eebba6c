"""`gpufleet doctor`: the execution roles of each HyperPod cluster a policy names (issue 41).

Slurm's report is read only from the controller's own namespace `Slurm/<role id>:SageMaker` (HyperPod
names every node's execution-role session `SageMaker`, so `${aws:userid}` is one per role, not per
node). A role the controller group shares with other groups therefore lets every node of those groups
write the controller's report: the scaler trusts no report of such a cluster (an error here), and the
sharing groups also get the controller's other rights (the drain-marks GetItem, ListClusterNodes). And a role
without gpufleet's Deny on other Slurm namespaces lets a broad Allow beside it (CloudWatchAgentServerPolicy:
PutMetricData anywhere) write plain `Slurm` - ignored too, but noise doctor names. Read with the operator's
credentials: DescribeCluster, then per role ListRolePolicies/GetRolePolicy and ListAttachedRolePolicies/
GetPolicy/GetPolicyVersion (`doctor.service.RoleProbe`). The rules here are pure."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gpufleet.domain.models import Frozen
from gpufleet_node import schema

DENY_SID_HINT = "DenyOtherSlurmReportNamespaces"  # ami/hyperpod/execution-role-*.json


class RoleView(Frozen):
    """One execution role as doctor read it: whether it carries the Deny on every Slurm namespace but the
    caller's own (`denies_other_slurm`), and whether some Allow grants PutMetricData in any namespace
    (`puts_anywhere`: the CloudWatch agent's policy). `unread`: why its policies could not be read."""

    arn: str
    denies_other_slurm: bool = False
    puts_anywhere: bool = False
    unread: str | None = None


class ClusterRoles(Frozen):
    """A HyperPod cluster's instance groups and their execution roles; `controller`: Slurm's controller
    group (None: `why`)."""

    cluster: str
    groups: dict[str, str] = {}  # instance group -> its ExecutionRole ARN
    controller: str | None = None
    why: str = ""
    roles: dict[str, RoleView] = {}
    unread: str | None = None


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _puts_metrics(statement: Mapping[str, Any]) -> bool:
    actions = [str(a).lower() for a in _list(statement.get("Action", []))]
    return any(a in ("cloudwatch:putmetricdata", "cloudwatch:*", "*") for a in actions)


def denies_other_slurm(statements: Iterable[Mapping[str, Any]]) -> bool:
    """A Deny of PutMetricData on `Slurm` and `Slurm/*` unless the namespace is the caller's own."""
    for s in statements:
        if s.get("Effect") != "Deny" or not _puts_metrics(s):
            continue
        cond = s.get("Condition") or {}
        like = {str(v) for v in _list((cond.get("StringLike") or {}).get("cloudwatch:namespace", []))}
        spared = {str(v) for v in _list((cond.get("StringNotEquals") or {}).get("cloudwatch:namespace", []))}
        own = schema.SLURM_NAMESPACE_PREFIX + "${aws:userid}"
        if {schema.SLURM_NAMESPACE, schema.SLURM_NAMESPACE_PREFIX + "*"} <= like and spared <= {own}:
            return True
    return False


def puts_anywhere(statements: Iterable[Mapping[str, Any]]) -> bool:
    """An Allow of PutMetricData with no namespace condition (CloudWatchAgentServerPolicy's)."""
    for s in statements:
        if s.get("Effect") == "Allow" and _puts_metrics(s):
            keys = {k for keys in (s.get("Condition") or {}).values() for k in keys}
            if "cloudwatch:namespace" not in keys:
                return True
    return False


def role_findings(roles: ClusterRoles) -> Iterator[tuple[str, str, str]]:
    """(level, subject, text) for one cluster: `error`, `warning` or `ok`."""
    subject = f"hyperpod:{roles.cluster}"
    if roles.unread:
        yield "warning", subject, f"execution roles not checked: {roles.unread}"
        return
    if roles.controller is None:
        yield (
            "error",
            subject,
            (
                f"Slurm's controller group cannot be told ({roles.why}): gpufleet trusts no Slurm report of this "
                "cluster (nothing is removed, the Slurm backlog is unreadable)"
            ),
        )
        return
    mine = roles.groups.get(roles.controller, "")
    sharing = sorted(g for g, arn in roles.groups.items() if arn == mine and g != roles.controller)
    if sharing:
        yield (
            "error",
            subject,
            (
                f"the controller group {roles.controller} shares its execution role {mine} with {', '.join(sharing)}: "
                "HyperPod gives every node of a role the same aws:userid (<role id>:SageMaker), so any process on "
                "those nodes could write the controller's Slurm report, and gpufleet trusts none (nothing of the "
                "cluster is removed, its Slurm backlog is unreadable); they also get the controller's other rights "
                "(the drain-marks GetItem, ListClusterNodes). Give the controller group a role of its own "
                "(ami/hyperpod/execution-role-controller.json)"
            ),
        )
    for arn, role in sorted(roles.roles.items()):
        if role.unread:
            yield "warning", subject, f"role {arn}: policies not read ({role.unread})"
        elif not role.denies_other_slurm and role.puts_anywhere:
            yield (
                "warning",
                subject,
                (
                    f"role {arn} allows PutMetricData in any namespace and lacks {DENY_SID_HINT}: its nodes may write "
                    "plain Slurm and other nodes' Slurm namespaces (ignored by the scaler, but add the Deny from "
                    "ami/hyperpod/execution-role-worker.json)"
                ),
            )
    if not sharing:
        yield "ok", subject, f"the controller group {roles.controller} has an execution role of its own"
