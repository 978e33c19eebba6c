"""Waiting GPU work -> nodes a group needs. Pure: pods (or jobs) that wait, the group's node shape and the
room its nodes already have in, the number of new nodes and a reason that names what waits out.

Packing is first-fit decreasing: each waiting item (largest first) goes to the first node with room for
it - existing nodes' free GPUs first (reuse before launch), then nodes already booting, then new nodes of
the group's shape. An item larger than a node cannot be placed by this group and is counted apart.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import Field

from gpufleet.domain.models import Frozen, WaitingWork
from gpufleet.domain.nodes import NodeShape as NodeShape
from gpufleet.kubernetes.pods import WaitingPod
from gpufleet.scaling.fit import fits as fits

_EPSILON = 1e-9
MIN_SHARE = 1e-3  # the smallest share of a GPU one item is counted as (device plugins count whole units)


class Packing(Frozen):
    new_nodes: int = Field(default=0, ge=0)  # nodes to launch beyond those that exist or boot
    placed_on_existing: int = Field(default=0, ge=0)  # items that fit the room the group already has
    unplaceable: int = Field(default=0, ge=0)  # items larger than a node of this shape


def pack(
    sizes: Sequence[float] | Counter[float], gpus_per_node: float, free: Sequence[float] = (), booting: int = 0
) -> Packing:
    """First-fit decreasing of items (GPUs per item; a Counter: size -> how many) into the free GPUs of
    existing nodes, then `booting` empty nodes, then as many new nodes as it takes.

    Closed form: bins with the same room are one run (room, how many), so the work is proportional to the
    distinct sizes and the existing nodes, never to the backlog: a metric that says 1e20 GPUs wait costs
    what 2 do. An item smaller than `MIN_SHARE` of a GPU is counted as that share (a quantity like 1e-320
    would otherwise put unbounded items on a node)."""
    counts = sizes if isinstance(sizes, Counter) else Counter(sizes)
    gpn = gpus_per_node
    runs: list[_Run] = [_Run(room, 1, True) for room in free if room > _EPSILON]
    if booting > 0:
        runs.append(_Run(gpn, booting, False))
    placed_existing, new, unplaceable = 0, 0, 0
    for size, count in sorted(counts.items(), key=lambda sc: -sc[0]):
        if count <= 0:
            continue
        if not math.isfinite(size) or size > gpn + _EPSILON:
            unplaceable += count
            continue
        size = max(size, MIN_SHARE)
        out: list[_Run] = []
        for run in runs:
            per_bin = int((run.room + _EPSILON) // size) if count else 0
            if per_bin == 0:
                out.append(run)
                continue
            placed = min(count, per_bin * run.bins)
            full, rest = divmod(placed, per_bin)
            count -= placed
            placed_existing += placed if run.existing else 0
            out += [_Run(run.room - per_bin * size, full, run.existing)] if full else []
            out += [_Run(run.room - rest * size, 1, run.existing)] if rest else []
            left = run.bins - full - (1 if rest else 0)
            out += [_Run(run.room, left, run.existing)] if left else []
        if count:
            per_node = max(1, int((gpn + _EPSILON) // size))
            added = -(-count // per_node)
            last = count - per_node * (added - 1)
            out += [_Run(gpn - per_node * size, added - 1, False)] if added > 1 else []
            out.append(_Run(gpn - last * size, 1, False))
            new += added
        runs = [r for r in out if r.bins > 0 and r.room > _EPSILON]
    return Packing(new_nodes=new, placed_on_existing=placed_existing, unplaceable=unplaceable)


@dataclass(frozen=True)
class _Run:
    """`bins` nodes that each have `room` GPUs left; `existing`: nodes that serve already (not new or booting)."""

    room: float
    bins: int
    existing: bool


def _gpus(value: float) -> str:
    return f"{value:g}"


def gpus_text(value: float) -> str:
    """'1 GPU', '8 GPUs', '0.5 GPUs'."""
    return f"{value:g} GPU" + ("" if value == 1 else "s")


def as_work(pod: WaitingPod) -> WaitingWork:
    return WaitingWork(name=pod.key, gpus=pod.gpus, since=pod.since)


def waiting_sizes(items: Sequence[WaitingWork], gpus_per_node: float | None = None) -> Counter[float]:
    """GPUs per item -> how many items ask for that much. Given the node's GPUs, an item that needs a node
    of its own (anti-affinity to its kind, a hostPort) asks for a whole node, so such pods pack one per
    node and come in one change instead of one boot each."""
    sizes: Counter[float] = Counter()
    for w in items:
        whole = w.whole_node and gpus_per_node is not None and w.gpus <= gpus_per_node + _EPSILON
        sizes[gpus_per_node if whole and gpus_per_node is not None else w.gpus] += w.count
    return sizes


def describe_waiting(pods: Sequence[WaitingWork], now: datetime, noun: str = "pod") -> str:
    """'3 pods (2x8 GPUs, 1x4) unschedulable for 4 min': how many, their shapes, the longest wait."""
    if not pods:
        return f"no {noun}s waiting"
    shapes = waiting_sizes(pods)
    ordered = sorted(shapes.items(), key=lambda s: -s[0])
    parts = [f"{n}x{_gpus(g)}" for g, n in ordered]
    parts[0] += " GPU" if ordered[0][0] == 1 else " GPUs"  # "1x1 GPU", "2x8 GPUs"
    waits = [now - p.since for p in pods if p.since is not None]
    for_how_long = f" for {max(0, int(max(waits).total_seconds() // 60))} min" if waits else ""
    total = sum(shapes.values())
    if noun == "GPU":  # a scheduler's backlog metric: GPUs, not items of known shape
        return f"{total:g} GPU(s) requested by waiting jobs"
    plural = "" if total == 1 else "s"
    state = "unschedulable" if noun == "pod" else "waiting"
    return f"{total} {noun}{plural} ({', '.join(parts)}) {state}{for_how_long}"
