"""A simulated GPU instance of the replay's node group, in a module of its own so that everything that
handles one (the cluster in simulate.py, the gangs, the shortage, gpufleet's controller, the baselines)
imports it from below instead of from the cluster that holds them.

It uses `__slots__` rather than a frozen model: a 31-day replay touches it millions of times and must
finish in seconds (the bench row).
"""

from __future__ import annotations

from gpufleet_tools.replay.model import MILLI_PER_GPU, Pod


class Node:
    """One GPU instance: free milli per GPU, the pods on it, and when it boots."""

    __slots__ = (
        "cordoned",
        "emptied_at",
        "free",
        "free_whole",
        "launched_at",
        "node_id",
        "pods",
        "ready_at",
        "used",
        "zone",
    )

    def __init__(self, node_id: str, gpus: int, launched_at: int, ready_at: int, zone: int) -> None:
        self.node_id = node_id
        self.free = [MILLI_PER_GPU] * gpus
        self.free_whole = gpus
        self.used = 0  # milli allocated on the node
        self.pods: dict[int, list[int]] = {}  # pod index -> the GPUs it holds
        self.launched_at = launched_at
        self.ready_at = ready_at
        self.cordoned = False
        self.emptied_at = -(10**9)  # minute its last pod left (never had one: long ago)
        self.zone = zone

    def fits(self, pod: Pod) -> bool:
        if pod.whole:
            return self.free_whole >= pod.gpus
        return max(self.free) >= pod.milli

    def slots(self, pod: Pod) -> list[int]:
        """The GPUs a pod that fits would take: whole free GPUs, or the fullest GPU with room (best fit)."""
        if pod.whole:
            return [g for g, free in enumerate(self.free) if free == MILLI_PER_GPU][: pod.gpus]
        best = min((free, g) for g, free in enumerate(self.free) if free >= pod.milli)
        return [best[1]]

    def busiest_share(self) -> float:
        """Allocated share of the fullest GPU, percent (the publisher's per-instance Maximum)."""
        return (MILLI_PER_GPU - min(self.free)) / MILLI_PER_GPU * 100.0
