"""Waiting GPU work -> nodes a group needs. Pure: pods (or jobs) that wait, the group's node shape and the
room its nodes already have in, the number of new nodes and a reason that names what waits out.

Packing is first-fit decreasing: each waiting item (largest first) goes to the first node with room for
it - existing nodes' free GPUs first (reuse before launch), then nodes already booting, then new nodes of
the group's shape. An item larger than a node cannot be placed by this group and is counted apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from pydantic import Field

from gpufleet.domain.models import Frozen, WaitingWork
from gpufleet.events.kubernetes import SelectorTerm, Toleration, WaitingPod

_EPSILON = 1e-9


class NodeShape(Frozen):
    """What a group's nodes offer a pod: GPUs, labels and taints (from DescribeNodegroup and
    DescribeInstanceTypes for EKS; GPUs per instance for a plain ASG)."""

    gpus: float = Field(gt=0)
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[tuple[str, str, str], ...] = ()  # (key, value, effect)


class Packing(Frozen):
    new_nodes: int = 0  # nodes to launch beyond those that exist or boot
    placed_on_existing: int = 0  # items that fit the room the group already has
    unplaceable: int = 0  # items larger than a node of this shape


def _term_holds(term: SelectorTerm, labels: dict[str, str]) -> bool:
    if term.fields or not term.expressions:  # a named node, or an empty term: no new node matches
        return False
    for key, op, values in term.expressions:
        have = labels.get(key)
        if op == "In" and have not in values:
            return False
        if op == "NotIn" and have in values:
            return False
        if op == "Exists" and have is None:
            return False
        if op == "DoesNotExist" and have is not None:
            return False
        if op in ("Gt", "Lt"):
            try:
                a, b = int(have or ""), int(values[0])
            except (ValueError, IndexError):
                return False
            if (op == "Gt" and not a > b) or (op == "Lt" and not a < b):
                return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"):
            return False
    return True


def _tolerated(taint: tuple[str, str, str], tolerations: Sequence[Toleration]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.effect and t.effect != effect:
            continue
        if t.operator == "Exists" and (not t.key or t.key == key):
            return True
        if t.operator == "Equal" and t.key == key and t.value == value:
            return True
    return False


def fits(pod: WaitingPod, shape: NodeShape) -> bool:
    """Could a node of this shape host the pod: its nodeSelector and required node affinity hold on the
    node's labels, its tolerations cover every NoSchedule/NoExecute taint, and its GPUs fit one node."""
    labels = dict(shape.labels)
    if any(labels.get(k) != v for k, v in pod.node_selector):
        return False
    if pod.affinity and not any(_term_holds(term, labels) for term in pod.affinity):
        return False
    hard = [t for t in shape.taints if t[2] in ("NoSchedule", "NoExecute")]
    if not all(_tolerated(t, pod.tolerations) for t in hard):
        return False
    return pod.gpus <= shape.gpus + _EPSILON


def pack(
    sizes: Sequence[float] | Counter[float], gpus_per_node: float, free: Sequence[float] = (), booting: int = 0
) -> Packing:
    """First-fit decreasing of items (GPUs per item; a Counter: size -> how many) into the free GPUs of
    existing nodes, then `booting` empty nodes, then as many new nodes as it takes. Items of one size are
    placed together (the same result as one by one, in time proportional to distinct sizes x nodes:
    thousands of pods can wait at once)."""
    counts = sizes if isinstance(sizes, Counter) else Counter(sizes)
    bins = [*free, *([gpus_per_node] * booting)]
    existing = len(free)
    placed_existing, new, unplaceable = 0, 0, 0
    for size, count in sorted(counts.items(), key=lambda sc: -sc[0]):
        if size > gpus_per_node + _EPSILON:
            unplaceable += count
            continue
        for slot, room in enumerate(bins):
            if count == 0:
                break
            k = min(count, int((room + _EPSILON) // size))
            bins[slot] -= k * size
            count -= k
            placed_existing += k if slot < existing else 0
        if count:
            per_node = int((gpus_per_node + _EPSILON) // size)
            added = -(-count // per_node)
            bins += [gpus_per_node - per_node * size] * (added - 1)
            bins.append(gpus_per_node - (count - per_node * (added - 1)) * size)
            new += added
    return Packing(new_nodes=new, placed_on_existing=placed_existing, unplaceable=unplaceable)


def _gpus(value: float) -> str:
    return f"{value:g}"


def as_work(pod: WaitingPod) -> WaitingWork:
    return WaitingWork(name=pod.key, gpus=pod.gpus, since=pod.since)


def waiting_sizes(items: Sequence[WaitingWork]) -> Counter[float]:
    """GPUs per item -> how many items ask for that much."""
    sizes: Counter[float] = Counter()
    for w in items:
        sizes[w.gpus] += w.count
    return sizes


def describe_waiting(pods: Sequence[WaitingWork], now: datetime, noun: str = "pod") -> str:
    """'3 pods (2x8 GPUs, 1x4) unschedulable for 4 min': how many, their shapes, the longest wait."""
    if not pods:
        return f"no {noun}s waiting"
    shapes = waiting_sizes(pods)
    parts = [f"{n}x{_gpus(g)}" for g, n in sorted(shapes.items(), key=lambda s: -s[0])]
    parts[0] += " GPUs"
    waits = [now - p.since for p in pods if p.since is not None]
    for_how_long = f" for {max(0, int(max(waits).total_seconds() // 60))} min" if waits else ""
    total = sum(shapes.values())
    if noun == "GPU":  # a scheduler's backlog metric: GPUs, not items of known shape
        return f"{total:g} GPU(s) requested by waiting jobs"
    plural = "" if total == 1 else "s"
    state = "unschedulable" if noun == "pod" else "waiting"
    return f"{total} {noun}{plural} ({', '.join(parts)}) {state}{for_how_long}"
