"""The simulated node group: nodes that boot, a kube-scheduler-like placement of pods on GPUs, a FIFO
pending queue, and disruption of the pods on a removed node. Controllers (gpufleet's, the baselines)
look at it once a minute and launch or terminate nodes; the loop records what it cost.

Model (docs/replay.md states the same assumptions):
- a node has `gpus_per_node` GPUs of 1000 milli each; a pod takes `gpus` whole GPUs on one node, or a
  `milli` share of one GPU (best fit among the node's GPUs);
- the scheduler tries every pending pod in arrival order each minute (a pod that does not fit does not
  block the ones behind it, as in kube-scheduler) and scores nodes like NodeResourcesFit: spread
  (LeastAllocated, the default) picks the least allocated node that fits, pack (MostAllocated) the most;
- a node is billed from launch; it accepts pods `boot_minutes` later (launch to schedulable);
- a pod on a node that is removed is disrupted: it goes back to the pending queue and starts from the
  beginning (the GPU-hours it had run are counted as lost).

Mutable state lives in small `__slots__` classes rather than frozen models: a 31-day replay touches it
millions of times and must finish in seconds (the bench row).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

from gpufleet_tools.replay import gangs, shortage
from gpufleet_tools.replay.model import MILLI_PER_GPU, Placement, Pod, ReplayOptions, RunOutcome, RunResult, Timeline
from gpufleet_tools.replay.nodes import Node

ZONES = 3  # an ASG balances its instances across (here: three) Availability Zones


class Cluster:
    """Nodes, pods and the scheduler for one run. Controllers call `launch`, `terminate`, `cordon`."""

    def __init__(self, pods: Sequence[Pod], options: ReplayOptions) -> None:
        self.pods = pods
        self.options = options
        self.nodes: dict[str, Node] = {}
        self.ready: list[Node] = []
        self.booting: list[Node] = []
        self.pending: list[int] = []
        self.pending_milli = 0
        self.used_milli = 0
        self.started_at = [-1] * len(pods)
        self.node_of: list[Node | None] = [None] * len(pods)
        self.ends: defaultdict[int, list[tuple[int, int]]] = defaultdict(list)
        self.token = [0] * len(pods)
        self.next_arrival = 0
        self.serial = 0
        self.disrupted = 0
        self.drained = 0  # nodes cordoned (consolidation by attrition) and reopened, over the run
        self.undrained = 0
        self.lost_milli_minutes = 0
        self.actions = 0
        self.dirty = True
        self.now = 0
        self.gangs = gangs.GangBook(pods, options.gpus_per_node)
        self.asg = shortage.Asg(options.shortage)

    @property
    def desired(self) -> int:
        """The group's desired capacity: its instances plus those asked for and not launched yet."""
        return len(self.nodes) + self.asg.missing

    # ---- capacity ----

    @property
    def ready_milli(self) -> int:
        return len(self.ready) * self.options.node_milli

    def launch(self, count: int, t: int, *, booted: bool = False) -> list[Node]:
        """Start `count` nodes now (billed from now), schedulable after the boot delay."""
        by_zone = [0] * ZONES
        for n in self.nodes.values():
            by_zone[n.zone] += 1
        started = []
        for _ in range(count):
            zone = by_zone.index(min(by_zone))
            by_zone[zone] += 1
            self.serial += 1
            ready_at = t if booted else t + self.options.boot_minutes
            node = Node(f"i-{self.serial:07d}", self.options.gpus_per_node, t, ready_at, zone)
            self.nodes[node.node_id] = node
            (self.ready if ready_at <= t else self.booting).append(node)
            started.append(node)
        self.dirty = True
        if not booted:
            self.gangs.earmark(started, self)
        return started

    def terminate(self, node_ids: Sequence[str], t: int) -> int:
        """Remove nodes now; every pod on them is disrupted and re-queued, and with a gang's pod the rest
        of its gang (the job dies with one of its workers). Returns the pods disrupted."""
        hit: list[int] = []
        for node_id in node_ids:
            node = self.nodes.pop(node_id)
            (self.ready if node in self.ready else self.booting).remove(node)
            self.gangs.forget(node)
            hit += sorted(node.pods)
            for i in sorted(node.pods):
                self._disrupt(i, node, t)
        for gang in dict.fromkeys(self.pods[i].gang for i in hit if self.pods[i].gang):
            for j in self.gangs.members[gang]:
                if (home := self.node_of[j]) is not None:
                    self._disrupt(j, home, t)
                    hit.append(j)
        return len(hit)

    def _disrupt(self, i: int, node: Node, t: int) -> None:
        self._stop(i, node)
        self.disrupted += 1
        self.lost_milli_minutes += (t - self.started_at[i]) * self.pods[i].demand_milli
        self.started_at[i] = -1
        self._enqueue(i)

    def cordon(self, node: Node, on: bool = True) -> None:
        """Stop (or resume) placing new pods on a node; what runs there stays. Counted per run."""
        if node.cordoned != on:
            self.drained += on
            self.undrained += not on
        node.cordoned = on
        self.dirty = self.dirty or not on

    # ---- pods ----

    def _enqueue(self, i: int) -> None:
        self.pending.append(i)
        self.pending_milli += self.pods[i].demand_milli
        self.dirty = True

    def start(self, i: int, node: Node, t: int) -> None:
        pod = self.pods[i]
        slots = node.slots(pod)
        share = MILLI_PER_GPU if pod.whole else pod.milli
        for g in slots:
            node.free[g] -= share
        node.free_whole -= sum(1 for g in slots if node.free[g] == MILLI_PER_GPU - share)
        node.pods[i] = slots
        node.used += pod.demand_milli
        self.used_milli += pod.demand_milli
        self.node_of[i] = node
        self.started_at[i] = t
        self.token[i] += 1
        if pod.duration is not None:
            self.ends[t + pod.duration].append((i, self.token[i]))

    def _stop(self, i: int, node: Node) -> None:
        pod = self.pods[i]
        share = MILLI_PER_GPU if pod.whole else pod.milli
        for g in node.pods.pop(i):
            node.free[g] += share
            node.free_whole += node.free[g] == MILLI_PER_GPU
        node.used -= pod.demand_milli
        self.used_milli -= pod.demand_milli
        self.node_of[i] = None
        self.token[i] += 1
        if not node.pods:
            node.emptied_at = self.now
        self.dirty = True

    def _choose(self, pod: Pod) -> Node | None:
        """NodeResourcesFit: among schedulable nodes that fit, the least (spread) or most (pack) allocated."""
        fits = [n for n in self.ready if not n.cordoned and n.fits(pod)]
        if not fits:
            return None
        if self.options.placement is Placement.PACK:
            return max(fits, key=lambda n: n.used)
        return min(fits, key=lambda n: n.used)

    def schedule(self, t: int) -> None:
        """One scheduling pass over the pending queue, in arrival order; skipped when nothing changed."""
        if not self.pending or not self.dirty:
            return
        keep: list[int] = []
        whole_fail = share_fail = MILLI_PER_GPU * 1000
        placed: dict[str, bool] = {}
        for i in self.pending:
            pod = self.pods[i]
            if pod.gang:  # its first waiting member places the whole gang or none of it (gangs.py)
                if pod.gang not in placed:
                    placed[pod.gang] = gangs.place(self, pod.gang, t)
                if not placed[pod.gang]:
                    keep.append(i)
                continue
            need = pod.gpus if pod.whole else pod.milli
            if need >= (whole_fail if pod.whole else share_fail):
                keep.append(i)
                continue
            node = self._choose(pod)
            if node is None:
                keep.append(i)
                whole_fail, share_fail = (
                    (min(whole_fail, need), share_fail) if pod.whole else (whole_fail, min(share_fail, need))
                )
                continue
            self.pending_milli -= pod.demand_milli
            self.start(i, node, t)
        self.pending = keep
        self.dirty = False

    def advance(self, t: int) -> None:
        """Minute t: booted nodes join, finished pods leave, new pods arrive, the scheduler runs."""
        self.now = t
        shortage.retry(self, t)
        if self.booting and min(n.ready_at for n in self.booting) <= t:
            joined = [n for n in self.booting if n.ready_at <= t]
            self.booting = [n for n in self.booting if n.ready_at > t]
            self.ready.extend(joined)
            self.dirty = True
        for i, token in self.ends.pop(t, ()):
            node = self.node_of[i]
            if token == self.token[i] and node is not None:
                self._stop(i, node)
        while self.next_arrival < len(self.pods) and self.pods[self.next_arrival].arrival <= t:
            self._enqueue(self.next_arrival)
            self.next_arrival += 1
        self.schedule(t)
        self.gangs.tally(t)

    def utilization(self) -> float | None:
        """The group's average GPU utilization this minute (allocated share of InService GPUs), or None
        when no node is in service (no datapoint, as in CloudWatch)."""
        return self.used_milli / self.ready_milli * 100.0 if self.ready else None


class TieBreaker(Protocol):
    """`random.Random` as far as the ASG's random tie-break needs it (seeded by the caller)."""

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int: ...


def default_termination(cluster: Cluster, count: int, t: int, ties: TieBreaker | None = None) -> list[str]:
    """EC2 Auto Scaling's default termination policy, blind to what runs on an instance: the zone with
    the most instances, then (one launch template, no allocation strategy here) the instance closest to
    its next billing hour, then random (`ties`; without one, the oldest id)."""
    chosen: list[str] = []
    left = dict(cluster.nodes)
    for _ in range(min(count, len(left))):
        zones = [0] * ZONES
        for n in left.values():
            zones[n.zone] += 1
        in_zone = [n for n in left.values() if n.zone == zones.index(max(zones))]
        closest = max((t - n.launched_at) % 60 for n in in_zone)
        tied = [n for n in in_zone if (t - n.launched_at) % 60 == closest]
        pick = tied[ties.randrange(len(tied))] if ties is not None else tied[0]
        chosen.append(pick.node_id)
        del left[pick.node_id]
    return chosen


class Controller(Protocol):
    """A scaling policy under test: looks at the cluster once a minute and acts on it."""

    name: str

    def tick(self, cluster: Cluster, t: int) -> None: ...


def run(
    pods: Sequence[Pod],
    horizon: int,
    controller: Controller,
    options: ReplayOptions,
    *,
    initial_nodes: int,
    progress: Callable[[int], None] | None = None,
) -> RunOutcome:
    """Replay `horizon` minutes: each minute the cluster advances, is sampled, then the controller acts.
    The initial nodes are up at minute 0 (the same warm start for every policy)."""
    cluster = Cluster(pods, options)
    cluster.launch(initial_nodes, 0, booted=True)
    nodes: list[int] = []
    used: list[float] = []
    pending: list[float] = []
    for t in range(horizon):
        cluster.advance(t)
        nodes.append(len(cluster.nodes))
        used.append(cluster.used_milli / MILLI_PER_GPU)
        pending.append(cluster.pending_milli / MILLI_PER_GPU)
        controller.tick(cluster, t)
        if progress is not None and (t + 1) % 1440 == 0:
            progress(1440)
    if progress is not None:
        progress(horizon % 1440)
    timeline = Timeline(nodes=tuple(nodes), used_gpus=tuple(used), pending_gpus=tuple(pending))
    return RunOutcome(result=summarize(controller.name, cluster, timeline, options), timeline=timeline)


def summarize(name: str, cluster: Cluster, timeline: Timeline, options: ReplayOptions) -> RunResult:
    node_hours = sum(timeline.nodes) / 60
    return RunResult(
        name=name,
        node_hours=round(node_hours, 2),
        gpu_hours_provisioned=round(node_hours * options.gpus_per_node, 2),
        gpu_hours_used=round(sum(timeline.used_gpus) / 60, 2),
        pending_gpu_minutes=round(sum(timeline.pending_gpus), 2),
        pods_disrupted=cluster.disrupted,
        lost_gpu_hours=round(cluster.lost_milli_minutes / MILLI_PER_GPU / 60, 2),
        scaling_actions=cluster.actions,
        cost_usd=round(node_hours * options.node_price, 2),
        nodes_drained=cluster.drained,
        nodes_undrained=cluster.undrained,
        gang_partial_node_minutes=float(cluster.gangs.partial_node_minutes),
        gangs_started=len(cluster.gangs.started),
        gang_wait_minutes=cluster.gangs.mean_wait(),
    )
