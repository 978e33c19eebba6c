"""Slurm drains gpufleet asks for (consolidation by attrition on HyperPod instance groups), recorded in its
own state table for the cluster's controller node to apply.

The Lambda never runs a command on a node: `ssm:SendCommand` on the controller would be root there (its
Slurm, its credentials, every job). Instead it writes, in one item per cluster (pk
`slurm-marks#<cluster>`, sk `MARKS`), one attribute per node it wants closed: `node#<instance id>` =
{reason, at}. The backlog publisher on the controller (ami/slurm_pending_gpus.py `--marks-table`), which
runs as root each minute anyway, reads the item (GetItem only, limited to these keys by
`dynamodb:LeadingKeys`) and reconciles Slurm to it: `scontrol update NodeName=... State=DRAIN
Reason="gpufleet: ..."` for a requested node, `State=RESUME` for a node drained with a gpufleet reason that
is no longer requested; a node drained or down by someone else is never touched (docs/hyperpod.md).

Each node is its own top-level attribute so that two groups of one cluster, closed or reopened by two
invocations at once, never overwrite each other: an UpdateItem SETs or REMOVEs only its own nodes'
attributes, atomically. A node closed again keeps its first time (`if_not_exists`). A node's attribute is
removed when gpufleet reopens it, when it deletes it (HyperPodFleet.delete_nodes) and, for a node a crash or a
failed write left behind, when an observation lists the whole cluster without it (HyperPodFleet.observe): the
item holds only nodes that exist, far below DynamoDB's 400 KB item limit (about 80 bytes a node).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpufleet.aws.clients import AWS_FAILURES, chunks, error_code
from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation

MARKS_SK = "MARKS"  # the publisher's literal too (tests/adapters/test_slurm_marks_names.py checks they agree)
NODE_ATTR_PREFIX = "node#"
REASON_MAX = 120  # characters of the reason kept: Slurm shows it in `sinfo -R`; a paragraph helps nobody
PER_CALL = 40  # node attributes per UpdateItem: its expression stays far below DynamoDB's 4 KB


def marks_key(cluster: str) -> dict[str, dict[str, str]]:
    """The cluster's marks item key, as the publisher builds it."""
    return {"pk": {"S": defaults.SLURM_MARKS_KEY_PREFIX + cluster}, "sk": {"S": MARKS_SK}}


def clean_reason(reason: str) -> str:
    """One short printable line: Slurm keeps the reason as given, and sinfo prints it on one line."""
    text = " ".join("".join(c if c.isprintable() else " " for c in reason).split())
    return text[:REASON_MAX] or "consolidation by attrition"


@dataclass(frozen=True)
class RequestedDrain:
    """One node gpufleet asked Slurm to drain: why, and since when."""

    reason: str
    at: datetime | None


@dataclass
class SlurmMarker:
    """The NodeMarker (aws.marks) for Slurm-orchestrated HyperPod groups: closes and reopens nodes by
    writing the cluster's marks item; the controller's publisher applies it within a minute. Also reads the
    item for the observation (HyperPodFleet)."""

    dynamodb: Any
    table: str
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    def read(self, cluster: str) -> dict[str, RequestedDrain]:
        """Instance id -> the drain gpufleet asked for, for the cluster (none: {}). Raises on a failed read
        (the caller then makes no drain decision for the cluster)."""
        item = self.dynamodb.get_item(TableName=self.table, Key=marks_key(cluster), ConsistentRead=True).get("Item")
        found: dict[str, RequestedDrain] = {}
        for name, value in (item or {}).items():
            if not name.startswith(NODE_ATTR_PREFIX):
                continue
            fields = value.get("M", {})
            at = fields.get("at", {}).get("S")
            found[name.removeprefix(NODE_ATTR_PREFIX)] = RequestedDrain(
                reason=fields.get("reason", {}).get("S", ""), at=datetime.fromisoformat(at) if at else None
            )
        return found

    def close(self, obs: GroupObservation, instance_ids: Sequence[str], reason: str) -> str:
        """Ask for the nodes to drain (a node already asked for keeps its first reason and time)."""
        ids = sorted(set(instance_ids))
        if not ids:
            return "no node to drain"
        at = self.now().astimezone(UTC).isoformat()
        value = {"M": {"reason": {"S": clean_reason(reason)}, "at": {"S": at}}}
        for batch in chunks(ids, PER_CALL):
            names = _attribute_names(batch)
            sets = ", ".join(f"{n} = if_not_exists({n}, :v)" for n in names)
            self.dynamodb.update_item(
                TableName=self.table,
                Key=marks_key(self._cluster(obs)),
                UpdateExpression=f"SET {sets}",
                ExpressionAttributeNames=names,
                ExpressionAttributeValues={":v": value},
            )
        return f"Slurm drain asked of {obs.ref.key}'s controller for {', '.join(ids)} (applied within a minute)"

    def reopen(self, obs: GroupObservation, instance_ids: Sequence[str]) -> str:
        """Withdraw the drains gpufleet asked for; the publisher resumes a node only while its drain reason
        is gpufleet's (a node someone else drained stays drained)."""
        ids = sorted(set(instance_ids))
        if not ids:
            return "no node to resume"
        self.forget(self._cluster(obs), ids)
        return f"Slurm resume asked of {obs.ref.key}'s controller for {', '.join(ids)} (applied within a minute)"

    def forget(self, cluster: str, instance_ids: Collection[str]) -> None:
        """Remove the nodes' attributes from the cluster's item (a node without one: nothing changes). Used to
        withdraw a drain (reopen) and to drop the marks of nodes that are gone (HyperPodFleet): the item is one
        DynamoDB item, at most 400 KB, and a mark nobody removes would stay in it forever. Raises on a failed
        write."""
        for batch in chunks(sorted(set(instance_ids)), PER_CALL):
            names = _attribute_names(batch)
            self.dynamodb.update_item(
                TableName=self.table,
                Key=marks_key(cluster),
                UpdateExpression="REMOVE " + ", ".join(names),
                ExpressionAttributeNames=names,
            )

    @staticmethod
    def _cluster(obs: GroupObservation) -> str:
        if not obs.ref.cluster:
            raise ValueError(f"{obs.ref.key}: a Slurm mark needs the group's HyperPod cluster")
        return obs.ref.cluster


def _attribute_names(instance_ids: Sequence[str]) -> dict[str, str]:
    """Placeholders for the nodes' attribute names (`node#i-...`: '#' is not allowed in an expression)."""
    return {f"#n{i}": NODE_ATTR_PREFIX + iid for i, iid in enumerate(instance_ids)}


def read_drains(
    marker: SlurmMarker, cluster: str, told: set[str], warn: Callable[[str], None]
) -> dict[str, RequestedDrain] | None:
    """The drains gpufleet asked of the cluster's controller; None when the item cannot be read (no drain
    decision is made on guesses), told once per cluster (`told`) until a read works again."""
    try:
        drains = marker.read(cluster)
    except AWS_FAILURES as exc:
        if cluster not in told:
            told.add(cluster)
            warn(
                f"hyperpod:{cluster}: Slurm marks unreadable ({error_code(exc)}): no node of it is drained "
                "or resumed until they can be read"
            )
        return None
    told.discard(cluster)
    return drains


def prune_marks(
    marker: SlurmMarker | None,
    cluster: str,
    drains: Mapping[str, Any],
    listed: Collection[str],
    warn: Callable[[str], None],
) -> set[str]:
    """Remove the marks of the nodes in `drains` that `listed` (every node of the cluster) lacks: they are
    gone. Returns them; a failed write is said and changes nothing (the next delete or observation retries)."""
    gone = set(drains) - set(listed)
    if not gone or marker is None:
        return gone
    try:
        marker.forget(cluster, gone)
    except AWS_FAILURES as exc:
        warn(
            f"hyperpod:{cluster}: marks of gone nodes {', '.join(sorted(gone))} not removed "
            f"({error_code(exc)}): retried later"
        )
    return gone
