"""Kueue's queued jobs as demand (`kueue.x-k8s.io/v1beta1`). Pure: Workloads, ClusterQueues, LocalQueues
and ResourceFlavors in (as the API lists them), gangs of waiting pods and notes out (events/queued.py).

[Being written: the counting rules, with their sources, go here.]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.domain.models import QueuedSource
from gpufleet.events.kubernetes import DEFAULT_GPU_RESOURCES
from gpufleet.events.queued import QueuedDemand


@dataclass(frozen=True)
class KueueObjects:
    """One cluster's Kueue objects, each list as the API's items (any shape: read leniently)."""

    workloads: list[Any] = field(default_factory=list)
    cluster_queues: list[Any] = field(default_factory=list)
    local_queues: list[Any] = field(default_factory=list)
    flavors: list[Any] = field(default_factory=list)


def kueue_demand(
    objects: KueueObjects, now: datetime, gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> QueuedDemand:
    """The Workloads that count as demand, as gangs of waiting pods, and notes on those that do not."""
    return QueuedDemand(source=QueuedSource.KUEUE)
