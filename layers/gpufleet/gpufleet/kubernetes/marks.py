"""Closing a Kubernetes node to new work and opening it again (consolidation by attrition, glue): cordon
(`spec.unschedulable: true`) plus gpufleet's annotation (`defaults.DRAIN_ANNOTATION`, when and why) and
label (`defaults.DRAIN_LABEL`: "true", so a label-selected listing finds gpufleet's cordons cheaply), and
back. Nothing is evicted: the pods on a cordoned node run to their end, then the node is idle and removed.

Why a cordon and not a `NoSchedule` taint of gpufleet's own: the DaemonSet controller adds a toleration for
`node.kubernetes.io/unschedulable:NoSchedule` to every DaemonSet pod (kubernetes/kubernetes
pkg/controller/daemon/util/daemonset_util.go, `AddOrUpdateDaemonPodTolerations`; kubernetes.io/docs/concepts/
workloads/controllers/daemonset/#taints-and-tolerations), so the device plugin, log agents and gpufleet's
own publisher still roll out to a draining node; a taint of our own would keep off every DaemonSet that
does not tolerate it. The scheduler reads the cordon as that same taint (TaintNodesByCondition), so
nothing else lands.

Whose cordon: a node is uncordoned only while it carries our annotation or label (an older gpufleet set
the annotation alone; such a node gets the label when closed again); a node cordoned without either
(an operator, a node-problem tool, an upgrade) is never claimed and never uncordoned. Each node is read
(GET) right before its patch and the patch carries the read `metadata.resourceVersion`, which the API
server takes as a precondition (409 Conflict when the node changed in between; kubernetes/kubernetes#63104):
a cordon someone else makes between our read and our patch is never claimed, and a 409 is read once more
and decided again. A JSON merge patch (RFC 7386): `null` removes the annotation on the way back.

The scaler's role is let in by its EKS access entry's Kubernetes group (`defaults.NODE_MARKS_GROUP`), which
deploy/kubernetes/gpufleet-node-marks.yaml binds to a ClusterRole of exactly nodes: get, list, patch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from gpufleet.aws.asg_shape import cluster_of
from gpufleet.domain.defaults import DRAIN_ANNOTATION, DRAIN_LABEL, NODE_MARKS_GROUP
from gpufleet.domain.errors import one_line
from gpufleet.domain.models import GroupObservation
from gpufleet.kubernetes.client import Connection, HttpProblem
from gpufleet.kubernetes.cluster import NODES_PATH, TIMEOUT_S, ClusterAccess

MARK_BUDGET_S = 20.0  # one group's marks in one call: a read and a patch per node, a few nodes at a time
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class MarkFailed(RuntimeError):
    """The marks could not be set: one line naming the cluster (never the token). The decision is told as
    failed; its capacity change is still made, and the marks rest a while (scaling.consolidate)."""


def _meta(node: Mapping[str, Any], part: str) -> Mapping[str, Any]:
    """The node's `metadata.annotations` or `metadata.labels` (empty when absent)."""
    found = (node.get("metadata") or {}).get(part)
    return found if isinstance(found, Mapping) else {}


def _ours(node: Mapping[str, Any]) -> bool:
    return DRAIN_ANNOTATION in _meta(node, "annotations") or DRAIN_LABEL in _meta(node, "labels")


def _cordoned(node: Mapping[str, Any]) -> bool:
    spec = node.get("spec")
    return isinstance(spec, Mapping) and spec.get("unschedulable") is True


def _default_cluster(obs: GroupObservation) -> str | None:
    """A managed node group's cluster, else the one the demand source read the group's pods from (a
    self-managed ASG's: its tags or its rule), else the one its tags name."""
    return obs.ref.cluster or obs.cluster or cluster_of(obs.asg_tags)[0]


class KubernetesMarker:
    """`NodeMarker` (gpufleet.aws.marks) for groups whose marks are `MarkChannel.KUBERNETES`. `access`: how
    to reach each cluster (the pod reader's `ClusterAccess`); `cluster_for`: a group's cluster (default:
    its node group's, or its ASG tags'); `now`: when a cordon is made (written into the annotation)."""

    def __init__(
        self,
        access: ClusterAccess,
        *,
        cluster_for: Callable[[GroupObservation], str | None] = _default_cluster,
        timeout_s: float = TIMEOUT_S,
        budget_s: float = MARK_BUDGET_S,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.access, self.cluster_for = access, cluster_for
        self.timeout_s, self.budget_s, self.now, self.clock = timeout_s, budget_s, now, clock

    def close(self, obs: GroupObservation, instance_ids: Sequence[str], reason: str) -> str:
        note = json.dumps({"at": self.now().isoformat(timespec="seconds"), "reason": reason}, sort_keys=True)
        return self._each(obs, instance_ids, "cordoned", lambda node: self._close_patch(node, note))

    def reopen(self, obs: GroupObservation, instance_ids: Sequence[str]) -> str:
        return self._each(obs, instance_ids, "uncordoned", self._reopen_patch)

    @staticmethod
    def _close_patch(node: Mapping[str, Any], note: str) -> tuple[str, dict[str, Any] | None]:
        """(what is so, the patch that makes it so or None): cordon it with our note and label, unless
        someone else cordoned it (never claimed) or we did already (done; an older cordon of ours that
        lacks the label gets it)."""
        label = {"labels": {DRAIN_LABEL: "true"}}
        if _cordoned(node):
            if not _ours(node):
                return "someone else's cordon, left alone", None
            return "already", (None if DRAIN_LABEL in _meta(node, "labels") else {"metadata": label})
        return "done", {"spec": {"unschedulable": True}, "metadata": {"annotations": {DRAIN_ANNOTATION: note}} | label}

    @staticmethod
    def _reopen_patch(node: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
        """Uncordon it and take our note and label off, only while one of them is on it; a node already
        uncordoned by someone else only loses them (its schedulability is theirs now)."""
        if not _ours(node):
            return ("not ours, left alone" if _cordoned(node) else "not cordoned"), None
        marks_off = {"metadata": {"annotations": {DRAIN_ANNOTATION: None}, "labels": {DRAIN_LABEL: None}}}
        return "done", ({"spec": {"unschedulable": False}} | marks_off) if _cordoned(node) else marks_off

    def _each(
        self,
        obs: GroupObservation,
        instance_ids: Sequence[str],
        verb: str,
        decide: Callable[[Mapping[str, Any]], tuple[str, dict[str, Any] | None]],
    ) -> str:
        known = {i.instance_id: i.node_name for i in obs.instances}
        # No node name: not a node of the cluster yet (its kubelet has not registered), or not seen as one.
        # It cannot be marked; the others still are, and the account says which were skipped.
        unnamed = [iid for iid in instance_ids if not known.get(iid)]
        names = {iid: str(known[iid]) for iid in instance_ids if known.get(iid)}
        skipped = f"no Kubernetes node name, skipped: {', '.join(unnamed)}" if unnamed else ""
        if not names:
            return skipped or f"no node {verb}"
        cluster = self.cluster_for(obs)
        if not cluster:
            raise MarkFailed(f"{obs.ref.key}: its EKS cluster cannot be told, so no node can be {verb}")
        connection = Connection(self.access.server(cluster), self.timeout_s, self.budget_s, self.clock)
        told: dict[str, list[str]] = {}
        try:
            for iid in names:
                said = self._one(connection, names[iid], decide)
                told.setdefault(said, []).append(f"{iid} ({names[iid]})")
        except HttpProblem as problem:
            raise _failed(cluster, verb, problem) from None
        finally:
            connection.close()
        parts = [f"{verb if k == 'done' else k}: {', '.join(v)}" for k, v in sorted(told.items())]
        return f"cluster {cluster}: " + "; ".join(parts + ([skipped] if skipped else []))

    @staticmethod
    def _one(
        connection: Connection, name: str, decide: Callable[[Mapping[str, Any]], tuple[str, dict[str, Any] | None]]
    ) -> str:
        """Read the node, decide, patch with the read resourceVersion; a 409 (it changed since) is read
        and decided once more. A node that is gone (404) is said, never an error: its instance is ending."""
        path = f"{NODES_PATH}/{quote(name, safe='')}"
        for attempt in (1, 2):
            try:
                node = connection.get_json(path)
            except HttpProblem as problem:
                if problem.status == 404:
                    return "gone"
                raise
            said, patch = decide(node)
            if patch is None:
                return said
            version = (node.get("metadata") or {}).get("resourceVersion")
            if version:
                patch["metadata"] = {**patch.get("metadata", {}), "resourceVersion": str(version)}
            try:
                connection.patch_json(path, patch)
                return said
            except HttpProblem as problem:
                if problem.status == 404:
                    return "gone"
                if problem.status != 409 or attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover


def _failed(cluster: str, verb: str, problem: HttpProblem) -> MarkFailed:
    said = problem.said
    hint = ""
    if problem.status == 403:
        hint = (
            f"; the scaler's access entry needs the Kubernetes group {NODE_MARKS_GROUP} and the cluster the"
            " binding in deploy/kubernetes/gpufleet-node-marks.yaml"
        )
    text = f"cluster {cluster}: nodes could not be {verb} ({problem.reason}{': ' + said if said else ''}){hint}"
    return MarkFailed(one_line(text, limit=400))


def may_patch_nodes(connection: Connection) -> tuple[bool, str]:
    """Whether the caller may patch nodes, as the API server's authorizer says
    (a SelfSubjectAccessReview, which any authenticated identity may create): (allowed, its reason)."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "patch", "resource": "nodes", "group": ""}},
    }
    answer = connection.post_json(SSAR_PATH, review)
    status = answer.get("status")
    status = status if isinstance(status, Mapping) else {}
    return status.get("allowed") is True, str(status.get("reason") or "")
