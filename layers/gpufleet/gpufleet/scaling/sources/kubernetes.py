"""Pods waiting in an EKS cluster (`demand.kubernetes`): one pod listing per cluster however many of its
groups read it, whichever their kind (managed node groups, self-managed ASGs whose nodes join it). Which
cluster a group's nodes join and what one of its nodes offers are its kind's to say (`GroupShapes`); a
waiting pod is matched to the groups whose node shape it fits and counted once (`scaling.fit.assign`)."""

from __future__ import annotations

import re
from collections.abc import Hashable
from dataclasses import dataclass

from gpufleet.aws.clients import AWS_FAILURES, error_code
from gpufleet.aws.eks_nodes import ShapeUnknown
from gpufleet.aws.groups.provider import GroupShapes
from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.domain.models import GroupObservation
from gpufleet.domain.nodes import NodeShape
from gpufleet.kubernetes.pods import ClusterPods, NodeListing
from gpufleet.policy.fleet import DemandSource
from gpufleet.scaling.demand_rules import ClusterAsk, Member, Tick, cluster_demand, shape_source
from gpufleet.scaling.sources.base import ClusterPodsReader, InstancesOf, SourceDeps, Warnings

Running = tuple[dict[str, str], str | None, int]  # node name -> instance id, why scale-in is closed, unmapped
# EKS names a Fargate pod's node `fargate-<its private DNS name>`: a micro-VM of its own, never an instance of
# a group, so it is not looked up (every cluster with CoreDNS on Fargate would otherwise close scale-in).
FARGATE_NODE_PREFIX = "fargate-"
# EKS Auto Mode names a node by its instance id: no lookup needed.
INSTANCE_ID = re.compile(r"i-[0-9a-f]{8,17}")


@dataclass(frozen=True)
class KubernetesReader:
    """One cluster's groups (managed node groups and self-managed ASGs alike) from one pod listing."""

    cluster_pods: ClusterPodsReader
    groups: GroupShapes
    instances_of: InstancesOf
    told: Warnings

    @classmethod
    def of(cls, deps: SourceDeps) -> KubernetesReader:
        return cls(deps.cluster_pods, deps.groups, deps.instances_of, deps.told)

    def unit_of(self, obs: GroupObservation, d: DemandSource) -> Hashable:
        return self._cluster(obs, d)[0] or obs.ref.key

    def source(self, d: DemandSource) -> str:
        return "pods"

    def read(self, unit: list[Member], run: Tick) -> dict[str, GroupObservation]:
        out: dict[str, GroupObservation] = {}
        joined: list[Member] = []
        for m in unit:
            cluster, why = self._cluster(m[0], m[2])
            if cluster is None:
                out[m[0].ref.key] = self.told.unreadable(m[0], f"pods of {m[0].ref.key}", why)
            else:
                joined.append(m)
        if not joined:
            return out
        cluster = str(self._cluster(joined[0][0], joined[0][2])[0])
        try:
            pods = self.listing(cluster, ClusterAsk.of(joined), run)
        except ClusterUnreadable as err:
            return out | {o.ref.key: self.told.unreadable(o, f"cluster {cluster}", err.cause) for o, _, _ in joined}
        shapes, unknown = self.node_shapes(joined)
        for obs, _, _ in joined:
            if obs.ref.key in unknown:
                out[obs.ref.key] = self.told.unreadable(obs, *unknown[obs.ref.key])
        found, assigned = cluster_demand(joined, cluster, pods, shapes, self.running(cluster, pods), run)
        if assigned.unfit:
            self.told.warn_once(f"unfit pods of cluster {cluster}", assigned.unfit[0].key, "waiting pods fit no group")
        return out | found

    def _cluster(self, obs: GroupObservation, d: DemandSource) -> tuple[str | None, str]:
        """The cluster the group's pods are read from (its kind's to say), or (None, why)."""
        return self.groups.joined_cluster(obs, d.kubernetes.cluster if d.kubernetes else None)

    def listing(self, cluster: str, ask: ClusterAsk, run: Tick) -> ClusterPods:
        """The cluster's pods (ClusterUnreadable raised), and its nodes: all of them when a group of it
        drains by attrition, else only those gpufleet labelled closed (so a switch to `consolidate: off`
        still finds and reopens them). A node listing that fails is told once and leaves the marks unknown.
        The queueing systems whose jobs its groups count are read with the pods, as of now."""
        source, marks = f"cluster {cluster}", f"node marks of cluster {cluster}"
        listing = NodeListing.ALL if ask.attrition else NodeListing.DRAINED
        pods = self.cluster_pods.read(cluster, ask.resources, listing, ask.queued, run.now)
        self.told.read_well(source)
        if pods.nodes is not None:
            self.told.read_well(marks)
        elif ask.attrition or pods.nodes_unreadable:
            said = "no node of the cluster drains" if ask.attrition else "a node gpufleet closed is not reopened"
            self.told.warn_once(
                marks, pods.nodes_unreadable or "the node listing was not read", f"node marks unknown: {said}"
            )
        return pods

    def node_shapes(self, joined: list[Member]) -> tuple[dict[str, NodeShape], dict[str, tuple[str, str]]]:
        """Each group's node shape, and (source, why) for those whose shape cannot be told (`tell`: where
        a kind says what of its configuration the shape does not use, once per group)."""
        shapes: dict[str, NodeShape] = {}
        unknown: dict[str, tuple[str, str]] = {}
        for obs, _, d in joined:
            overrides = (d.kubernetes.allocatable if d.kubernetes else None) or None
            try:
                shapes[obs.ref.key] = self.groups.node_shape(obs, overrides, self.told.tell_shape(obs.ref.key))
            except ShapeUnknown as err:
                unknown[obs.ref.key] = (shape_source(obs), str(err))
        return shapes, unknown

    def running(self, cluster: str, pods: ClusterPods) -> Running:
        """Node name -> instance id of the nodes that run work (any pod bound to them but a DaemonSet's, a
        mirror pod or one marked safe to evict: `kubernetes.pods.pod_work`; GPU or not), and why no node may
        be removed when that cannot be told for every such node (a node name EC2 does not map, EC2
        unreadable). A node the listing names with its instance (spec.providerID), or named by its instance
        id, needs no lookup; a Fargate node is no group's. The ids found still mark their nodes; the others'
        room is left as it is."""
        source = f"nodes of cluster {cluster}"
        try:
            found, unmapped = work_node_instances(pods, self.instances_of)
        except AWS_FAILURES as err:
            why = f"DescribeInstances failed ({error_code(err)}): which nodes run work is unknown"
            self.told.warn_once(source, why, "demand source partly unreadable")
            return work_node_instances(pods, None)[0], why, 0
        if unmapped:
            why = (
                f"{len(unmapped)} node name(s) running pods match no EC2 private DNS name ({unmapped[0]}...): "
                "one of them may be this group's"
            )
            self.told.warn_once(source, why, "demand source partly unreadable")
            return found, why, len(unmapped)
        self.told.read_well(source)
        return found, None, 0


def work_node_instances(pods: ClusterPods, instances_of: InstancesOf | None) -> tuple[dict[str, str], list[str]]:
    """Node name -> instance id of the cluster's nodes that run work, and the names no instance matches.
    A node the listing names with its instance (spec.providerID), or named by its instance id, needs no
    lookup; a Fargate node is no group's; the rest are looked up by private DNS name (`instances_of`;
    None: not looked up, left unmapped). The tick and the last look before a removal read it the same way."""
    busy = {n for n in pods.never_victims if not n.startswith(FARGATE_NODE_PREFIX)}
    listed = {n.name: n.instance_id for n in (pods.nodes or {}).values() if n.instance_id is not None}
    known = {n: listed.get(n, n) for n in busy if n in listed or INSTANCE_ID.fullmatch(n)}
    wanted = busy - set(known)
    found = {**instances_of(wanted), **known} if wanted and instances_of is not None else known
    return found, sorted(busy - set(found))
