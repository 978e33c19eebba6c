"""The last look before every removal call, on every path (a fresh decision, a retry, a resumed change).

Glue. Right before capacity is taken away, each victim is checked against fresh reads of what says it is
free; one that fails is dropped from the change (`domain.removal.after_last_look`), never removed:
- for a change that lowers the count, the group read again: the count rule (`held_floor`) is kept on
  the instances held now, a launch that came up since the decision's read included;
- what its kind knows (`GroupProvider.last_look`): scale-in protection and lifecycle in its ASG, Slurm;
- where the group's demand came from a cluster's pods: the pods bound to its node now (any pod but a
  DaemonSet's, a mirror pod, or one marked safe to evict: `kubernetes.pods`), and, for a node gpufleet
  closed (attrition), that the cordon is still gpufleet's. One pod listing per cluster per change.
A read that fails raises: nothing is removed, the change fails and stays the group's intent (told; the
next invocation looks again). What no read can see - work bound
between this read and the call - is the remaining race (docs/scaler.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpufleet.aws.fleet import GroupRegistry
from gpufleet.aws.groups.provider import GroupProvider
from gpufleet.domain.models import Decision, GroupObservation, NodeMark
from gpufleet.domain.removal import after_last_look, held_floor
from gpufleet.kubernetes.pods import DEFAULT_GPU_RESOURCES, ClusterPods, NodeListing
from gpufleet.scaling.sources.base import ClusterPodsReader, InstancesOf
from gpufleet.scaling.sources.kubernetes import work_node_instances


@dataclass(frozen=True)
class PodsLook:
    """The victims a pod is bound to now, for groups whose demand was read from a cluster's pods."""

    cluster_pods: ClusterPodsReader
    instances_of: InstancesOf  # node names -> instance ids, for nodes whose providerID does not say

    def busy(self, obs: GroupObservation, victims: Sequence[str], now: datetime) -> dict[str, str]:
        d = obs.demand
        if d is None or d.cluster is None or not d.knows_nodes or not victims:
            return {}
        pods = self.cluster_pods.read(d.cluster, DEFAULT_GPU_RESOURCES, NodeListing.ALL, (), now)
        busy = self._bound(pods, victims)
        by_id = {i.instance_id: i for i in obs.instances}
        for v in victims:
            inst = by_id.get(v)
            if v in busy or inst is None or inst.mark is not NodeMark.GPUFLEET:
                continue
            node = (pods.nodes or {}).get(inst.node_name or "")
            if node is None or not (node.unschedulable and node.ours):
                busy[v] = f"its node {inst.node_name or '?'} is no longer closed by gpufleet"
        return busy

    def _bound(self, pods: ClusterPods, victims: Sequence[str]) -> dict[str, str]:
        """Victim -> why, for the victims whose node a pod is bound to; every victim when a node that runs
        work cannot be told from the victims (its name maps to no instance), as the tick reads it."""
        named, unmapped = work_node_instances(pods, self.instances_of)
        if unmapped:
            why = f"{len(unmapped)} node(s) running pods map to no instance ({unmapped[0]}...): it may be this one"
            return dict.fromkeys(victims, why)
        wanted = set(victims)
        return {iid: f"pods run on its node {name} now" for name, iid in named.items() if iid in wanted}


@dataclass(frozen=True)
class LastLook:
    """Every look a removal passes, in one place: the executor calls it right before the call."""

    groups: GroupRegistry
    pods: PodsLook | None = None

    def __call__(self, decision: Decision, obs: GroupObservation, now: datetime) -> Decision:
        provider = self.groups.provider(obs.ref.kind)
        counted = self._counted_now(provider, decision, obs)
        decision = held_floor(decision, counted)
        victims = list(decision.victims)
        if not victims:
            return decision
        busy = dict(provider.last_look(obs, victims))  # raises: no victim goes now
        left = [v for v in victims if v not in busy]
        if left and self.pods is not None:
            busy |= self.pods.busy(obs, left, now)
        return after_last_look(decision, counted, busy)

    @staticmethod
    def _counted_now(provider: GroupProvider, decision: Decision, obs: GroupObservation) -> GroupObservation:
        """The group as it stands now, for a change that lowers its count: a launch still owed that came up
        since the decision's read is one more node the lower count would leave the provider to choose."""
        if not decision.lowers_capacity:
            return obs
        now_obs = provider.observe_one(obs.ref)
        if now_obs is None:  # gone since the read: nothing is removed on a read that cannot be made
            raise LookupError(f"group {obs.ref.key} cannot be read again before its count is lowered")
        return now_obs


def count_rule_only(decision: Decision, obs: GroupObservation, now: datetime) -> Decision:
    """An executor built without its reads (tests of the lease and the intent): the count rule alone.
    The composition root always builds a `LastLook` (tests/adapters check it)."""
    return held_floor(decision, obs)
