"""Gangs in the simulated group: pods of one job that start together or not at all, and what a gang
that cannot start yet costs.

Placement: Volcano's gang plugin and Kueue's all-or-nothing admission bind a gang's pods only when every
member has a place; until then none of them runs. The scheduler (simulate.py) asks `plan` for a place for
every waiting member at once, on copies of the nodes, and starts them all or none. A member's node
removed stops the whole gang (a distributed job dies with one of its workers) and it waits again.

The metric, partially billed gang node-minutes: a node launched while a gang waits is earmarked for the
waiting gangs in arrival order, each taking as many as it needs (its members packed first-fit onto empty
nodes, less the nodes still earmarked for it). Every minute a gang waits, each of its earmarked nodes that
has booted counts one node-minute: billed for the gang, schedulable, and the gang still cannot start (some
of its nodes never came, or not yet, or other pods took their room). The boot itself is not counted: every
launch waits for it, whole or not. Other pods may use an earmarked node meanwhile (the scheduler places
them; under spread an empty node draws them first): it still counts, since it was launched for the gang.
Earmarks end when the gang starts or the node goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gpufleet_tools.replay.model import MILLI_PER_GPU, Placement, Pod, ReplayOptions
from gpufleet_tools.replay.nodes import Node


class GangCluster(Protocol):
    """What the gangs read and do of the simulated group (simulate.Cluster), declared here so that this
    module, which the group imports, does not import it back."""

    pods: Sequence[Pod]
    options: ReplayOptions
    ready: list[Node]
    pending: list[int]
    pending_milli: int
    node_of: list[Node | None]
    next_arrival: int
    gangs: GangBook

    def start(self, i: int, node: Node, t: int) -> None: ...


def nodes_for(pods: Sequence[Pod], gpus_per_node: int) -> int:
    """Empty nodes a gang's pods take, first-fit decreasing (a share of a GPU counts as the GPU)."""
    free: list[int] = []
    for gpus in sorted((p.gpus for p in pods), reverse=True):
        home = next((k for k, room in enumerate(free) if room >= gpus), None)
        if home is None:
            free.append(gpus_per_node)
            home = len(free) - 1
        free[home] -= gpus
    return len(free)


class GangBook:
    """Each gang's members, what it needs, when it arrived and first started, and its earmarked nodes."""

    __slots__ = ("arrival", "earmarks", "members", "need", "partial_node_minutes", "started")

    def __init__(self, pods: Sequence[Pod], gpus_per_node: int) -> None:
        self.members: dict[str, list[int]] = {}
        for i, pod in enumerate(pods):
            if pod.gang:
                self.members.setdefault(pod.gang, []).append(i)
        self.need = {g: nodes_for([pods[i] for i in m], gpus_per_node) for g, m in self.members.items()}
        self.arrival = {g: min(pods[i].arrival for i in m) for g, m in self.members.items()}
        self.started: dict[str, int] = {}  # gang -> the minute it first started
        self.earmarks: dict[str, list[Node]] = {}
        self.partial_node_minutes = 0

    def earmark(self, nodes: Sequence[Node], cluster: GangCluster) -> None:
        """New nodes go to the waiting gangs in arrival order, each up to what it still lacks."""
        if not self.members or not nodes:
            return
        left = list(nodes)
        for gang in dict.fromkeys(cluster.pods[i].gang for i in cluster.pending if cluster.pods[i].gang):
            held = self.earmarks.setdefault(gang, [])
            take = max(0, self.need[gang] - len(held))
            held += left[:take]
            left = left[take:]
            if not left:
                return

    def started_now(self, gang: str, t: int) -> None:
        self.started.setdefault(gang, t)
        self.earmarks.pop(gang, None)

    def forget(self, node: Node) -> None:
        for held in self.earmarks.values():
            if node in held:
                held.remove(node)

    def tally(self, t: int) -> None:
        """Minute t: each waiting gang counts its earmarked nodes that have booted."""
        for held in self.earmarks.values():
            self.partial_node_minutes += sum(1 for n in held if n.ready_at <= t)

    def mean_wait(self) -> float | None:
        waits = [t - self.arrival[g] for g, t in self.started.items()]
        return round(sum(waits) / len(waits), 1) if waits else None


def place(cluster: GangCluster, gang: str, t: int) -> bool:
    """Start every waiting member of a gang now, or none (not all arrived, or one has no place)."""
    members = [j for j in cluster.gangs.members[gang] if cluster.node_of[j] is None]
    arrived = all(j < cluster.next_arrival for j in members)  # a gang waits for all its members
    homes = plan(cluster, members) if arrived else None
    if homes is None:
        return False
    for j, node in zip(members, homes, strict=True):
        cluster.pending_milli -= cluster.pods[j].demand_milli
        cluster.start(j, node, t)
    cluster.gangs.started_now(gang, t)
    return True


def plan(cluster: GangCluster, members: Sequence[int]) -> list[Node] | None:
    """A node for every member at once (the scheduler's scoring, on copies of the ready nodes), or None
    when one of them has no place: then none of them starts."""
    copies: dict[str, Node] = {}
    chosen: list[Node] = []
    pack = cluster.options.placement is Placement.PACK
    for i in members:
        pod = cluster.pods[i]
        fits = []
        for node in cluster.ready:
            if node.cordoned:
                continue
            seen = copies.get(node.node_id, node)
            if seen.fits(pod):
                fits.append((seen, node))
        if not fits:
            return None
        seen, node = (max if pack else min)(fits, key=lambda pair: pair[0].used)
        if seen is node:
            seen = copies[node.node_id] = _copy(node)
        reserve(seen, pod)
        chosen.append(node)
    return chosen


def reserve(node: Node, pod: Pod) -> None:
    """Book a pod on a copy of a node (an autoscaler's simulation, a gang's trial), like the scheduler would."""
    share = MILLI_PER_GPU if pod.whole else pod.milli
    for g in node.slots(pod):
        if node.free[g] == MILLI_PER_GPU:
            node.free_whole -= 1
        node.free[g] -= share
    node.used += pod.demand_milli


def _copy(node: Node) -> Node:
    copy = Node(node.node_id, len(node.free), node.launched_at, node.ready_at, node.zone)
    copy.free, copy.free_whole, copy.used = list(node.free), node.free_whole, node.used
    return copy
