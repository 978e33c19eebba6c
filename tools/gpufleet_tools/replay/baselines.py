"""What an operator would use instead of gpufleet, each as documented by its owner (sources in
docs/replay.md and research notes), replayed on the same trace and boot delay.

- `oracle`: perfect foresight and perfect packing, computed rather than simulated: at every minute the
  fewest nodes that hold the demand (GPUs summed, divided by GPUs per node, rounded up), launched exactly
  one boot delay ahead, pods moved for free. The lower bound no controller can beat.
- `static-peak`: the oracle's peak node count, up all month, never scaled.
- `asg-target-tracking`: EC2 Auto Scaling target tracking on the group's average GPU utilization.
- `cluster-autoscaler`: Kubernetes Cluster Autoscaler's scale-up on pending pods and scale-down of
  nodes under 50 % requested for 10 minutes, evicting their pods.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpufleet_tools.replay import shortage
from gpufleet_tools.replay.gangs import reserve
from gpufleet_tools.replay.model import MILLI_PER_GPU, Pod, ReplayOptions, RunName, RunOutcome, RunResult, Timeline
from gpufleet_tools.replay.nodes import Node
from gpufleet_tools.replay.simulate import Cluster, TieBreaker, default_termination


def demand_milli(pods: Sequence[Pod], horizon: int) -> list[int]:
    """GPU demand per minute (milli) if every pod ran from its arrival: what the oracle must hold."""
    delta = [0] * (horizon + 1)
    for p in pods:
        delta[p.arrival] += p.demand_milli
        if p.duration is not None and p.arrival + p.duration < horizon:
            delta[p.arrival + p.duration] -= p.demand_milli
    out, level = [], 0
    for t in range(horizon):
        level += delta[t]
        out.append(level)
    return out


def nodes_needed(demand: Sequence[int], options: ReplayOptions) -> list[int]:
    return [max(options.min_nodes, math.ceil(d / options.node_milli)) for d in demand]


def oracle(pods: Sequence[Pod], horizon: int, options: ReplayOptions) -> RunOutcome:
    """The lower bound: a node alive at t is needed at t or at t + boot (launched ahead to be ready).
    A pod bigger than a node is no demand it could serve: left out, as every simulated run leaves it."""
    demand = demand_milli([p for p in pods if p.gpus <= options.gpus_per_node], horizon)
    needed = nodes_needed(demand, options)
    boot = options.boot_minutes
    alive = [max(needed[t], needed[min(t + boot, horizon - 1)]) for t in range(horizon)]
    actions = sum(1 for t in range(1, horizon) if alive[t] != alive[t - 1])
    node_hours = sum(alive) / 60
    result = RunResult(
        name=str(RunName.ORACLE),
        node_hours=round(node_hours, 2),
        gpu_hours_provisioned=round(node_hours * options.gpus_per_node, 2),
        gpu_hours_used=round(sum(demand) / MILLI_PER_GPU / 60, 2),
        pending_gpu_minutes=0.0,
        pods_disrupted=0,
        lost_gpu_hours=0.0,
        scaling_actions=actions,
        cost_usd=round(node_hours * options.node_price, 2),
    )
    used = tuple(d / MILLI_PER_GPU for d in demand)
    return RunOutcome(
        result=result, timeline=Timeline(nodes=tuple(alive), used_gpus=used, pending_gpus=(0.0,) * horizon)
    )


class StaticPeak:
    """A fleet sized once for the peak (the initial nodes) and never changed."""

    name = str(RunName.STATIC_PEAK)

    def tick(self, cluster: Cluster, t: int) -> None:
        return None


class AsgTargetTracking:
    """EC2 Auto Scaling target tracking on average GPU utilization, as documented:

    - scale out "proportionally to the metric as fast as it can": when the metric is above the target
      for 3 consecutive 1-minute datapoints (the managed alarm AWS creates), desired becomes
      ceil(in-service capacity x metric / target), counting only instances past warm-up;
    - scale in "more gradually": when the metric is below 90 % of the target ("usually more than 10 %
      lower") for 15 consecutive datapoints, remove the largest whole number of instances that keeps the
      metric at or below the target (rounded down), never while an instance is warming up (default
      instance warm-up unset -> the 300 s default cooldown applies); the 15-point window restarts after;
    - the default termination policy picks which instances go, blind to the pods on them.
    The 3-of-3 / 15-of-15 alarm shapes are what the console shows for target-tracking alarms, not AWS
    documentation text (research notes, section D)."""

    name = str(RunName.ASG_TARGET_TRACKING)
    HIGH_POINTS, LOW_POINTS, LOW_RATIO, WARMUP_MINUTES = 3, 15, 0.9, 5

    def __init__(self, options: ReplayOptions, max_nodes: int, ties: TieBreaker) -> None:
        self.options = options
        self.max_nodes = max_nodes
        self.ties = ties
        self.high = self.low = 0

    def tick(self, cluster: Cluster, t: int) -> None:
        metric = cluster.utilization()
        if metric is None:  # no datapoints: target tracking does not scale on missing data
            self.high = self.low = 0
            return
        target = self.options.tt_target
        self.high = self.high + 1 if metric > target else 0
        self.low = self.low + 1 if metric < self.LOW_RATIO * target else 0
        warm = max(self.WARMUP_MINUTES, self.options.boot_minutes)
        counted = [n for n in cluster.ready if t - n.launched_at >= warm]
        desired = cluster.desired
        if self.high >= self.HIGH_POINTS and counted:
            wanted = min(self.max_nodes, math.ceil(len(counted) * metric / target))
            if wanted > desired:
                shortage.raise_desired(cluster, wanted - desired, t)
                cluster.actions += 1
            return
        if self.low >= self.LOW_POINTS and len(counted) == desired:
            keep = max(self.options.min_nodes, math.ceil(desired * metric / target))
            if keep < desired:
                cluster.terminate(default_termination(cluster, desired - keep, t, self.ties), t)
                cluster.actions += 1
            self.low = 0


class ClusterAutoscaler:
    """Kubernetes Cluster Autoscaler with its defaults (FAQ, config/const.go), one loop per minute (its
    10 s scan interval acts within the same simulated minute):

    - scale-up: pending pods that fit no node get new nodes (first-fit decreasing onto empty template
      nodes, after the nodes still booting), up to the group's max;
    - scale-down: a node whose GPU requests are under 50 % of its GPUs (scale-down-gpu-utilization-
      threshold) and whose pods all fit elsewhere is unneeded; unneeded for 10 minutes
      (scale-down-unneeded-time) it is removed: empty nodes up to 10 at a time, one non-empty node per
      loop, its pods evicted (they restart elsewhere); nothing is removed within 10 minutes of a
      scale-up (scale-down-delay-after-add);
    - on AWS a scale-up is not atomic: the AWS provider's `AtomicIncreaseSize` "is not implemented"
      (cloudprovider/aws/aws_cloud_provider.go), so CA raises the ASG by n (`IncreaseSize`) and keeps the
      k < n instances that come. Nodes asked for count as upcoming until max-node-provision-time (15 min,
      FAQ's parameter table); then the scale-up has failed: CA lowers the target by the missing ones
      (`DecreaseTargetSize`, which only drops requests not yet fulfilled) and backs the node group off,
      exponentially from 5 min to at most 30 min (initial-/max-node-group-backoff-duration flags, main.go),
      the backoff forgotten after 3 h without a failure (NodeGroupBackoffResetTimeout). Gang pods it sees
      as pods: what fits the ready nodes' free room (its filter-out-schedulable step) asks for no node, so
      after a failure it asks only for what the kept nodes cannot hold; kept nodes that stay empty are
      removed as unneeded like any other."""

    name = str(RunName.CLUSTER_AUTOSCALER)
    THRESHOLD, UNNEEDED_MINUTES, DELAY_AFTER_ADD, MAX_EMPTY_BULK = 0.5, 10, 10, 10
    PROVISION_MINUTES, BACKOFF_MINUTES, BACKOFF_MAX_MINUTES, BACKOFF_RESET_MINUTES = 15, 5, 30, 180

    def __init__(self, options: ReplayOptions, max_nodes: int) -> None:
        self.options = options
        self.max_nodes = max_nodes
        self.unneeded: dict[str, int] = {}
        self.last_add = -(10**9)
        self.backoff_until = self.last_failure = -(10**9)
        self.backoff = 0
        self.failures = 0

    def tick(self, cluster: Cluster, t: int) -> None:
        self.give_up(cluster, t)
        if t >= self.backoff_until and self.scale_up(cluster, t):
            self.last_add = t
        elif t - self.last_add >= self.DELAY_AFTER_ADD:
            self.scale_down(cluster, t)

    def give_up(self, cluster: Cluster, t: int) -> None:
        """A scale-up whose nodes did not all come within max-node-provision-time has failed: drop the
        missing ones and back the group off (5, 10, 20, 30, 30 ... min; reset after 3 h without failure)."""
        if not cluster.asg.asked or t - cluster.asg.asked[0] < self.PROVISION_MINUTES:
            return
        shortage.cancel(cluster, cluster.asg.missing)
        cluster.actions += 1
        self.backoff = 0 if t - self.last_failure >= self.BACKOFF_RESET_MINUTES else self.backoff
        self.backoff = min(self.BACKOFF_MAX_MINUTES, 2 * self.backoff if self.backoff else self.BACKOFF_MINUTES)
        self.last_failure, self.backoff_until = t, t + self.backoff
        self.failures += 1

    def scale_up(self, cluster: Cluster, t: int) -> bool:
        if not cluster.pending:
            return False
        pods = sorted((cluster.pods[i] for i in cluster.pending), key=lambda p: -p.demand_milli)
        room = [_copy(n) for n in cluster.ready if not n.cordoned] if cluster.gangs.members else []
        bins: list[Node] = []
        for pod in pods:
            if pod.gpus > self.options.gpus_per_node:
                continue
            if pod.gang and (free := next((n for n in room if n.fits(pod)), None)) is not None:
                reserve(free, pod)  # filter-out-schedulable: the scheduler could place it (not the gang)
                continue
            home = next((b for b in bins if b.fits(pod)), None)
            if home is None:
                home = Node("template", self.options.gpus_per_node, t, t, 0)
                bins.append(home)
            reserve(home, pod)
        upcoming = len(cluster.booting) + cluster.asg.missing
        new = min(len(bins) - upcoming, self.max_nodes - cluster.desired)
        if new <= 0:
            return False
        shortage.raise_desired(cluster, new, t)
        cluster.actions += 1
        return True

    def scale_down(self, cluster: Cluster, t: int) -> None:
        limit = self.THRESHOLD * self.options.node_milli
        candidates = sorted((n for n in cluster.ready if n.used < limit), key=lambda n: n.used)
        room: dict[str, Node] = {}
        leaving: set[str] = set()
        unneeded: dict[str, int] = {}
        for node in candidates:
            if movable(cluster, node, room, leaving):
                leaving.add(node.node_id)
                unneeded[node.node_id] = self.unneeded.get(node.node_id, t)
        self.unneeded = unneeded
        due = [cluster.nodes[k] for k, since in unneeded.items() if t - since >= self.UNNEEDED_MINUTES]
        if not due:
            return
        floor = len(cluster.nodes) - self.options.min_nodes
        empty = [n.node_id for n in due if not n.pods][: min(self.MAX_EMPTY_BULK, floor)]
        busy = [n.node_id for n in due if n.pods][:1] if not empty and floor > 0 else []
        if empty or busy:
            cluster.terminate(empty + busy, t)
            cluster.actions += 1
            for k in empty + busy:
                self.unneeded.pop(k, None)


def movable(cluster: Cluster, node: Node, room: dict[str, Node], leaving: set[str]) -> bool:
    """Whether every pod on `node` fits on the other ready nodes (none of which is leaving), booking the
    room it takes so the next candidate sees what is left; a node that does not fit books nothing."""
    saved: dict[str, tuple[list[int], int, int]] = {}
    for i in node.pods:
        pod = cluster.pods[i]
        home = None
        for other in cluster.ready:
            if other is node or other.node_id in leaving:
                continue
            copy = room.get(other.node_id)
            if copy is None:
                copy = room[other.node_id] = _copy(other)
            if copy.fits(pod):
                home = copy
                break
        if home is None:
            for key, (free, whole, used) in saved.items():
                room[key].free, room[key].free_whole, room[key].used = free, whole, used
            return False
        saved.setdefault(home.node_id, (list(home.free), home.free_whole, home.used))
        reserve(home, pod)
    return True


def _copy(node: Node) -> Node:
    copy = Node(node.node_id, len(node.free), node.launched_at, node.ready_at, node.zone)
    copy.free = list(node.free)
    copy.free_whole = node.free_whole
    copy.used = node.used
    return copy
