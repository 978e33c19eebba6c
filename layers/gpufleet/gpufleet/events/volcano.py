"""Volcano's gangs as demand (`scheduling.volcano.sh/v1beta1` PodGroups). Pure: PodGroups (and the Volcano
Jobs that own them, for their tasks' shapes) in, as the API lists them; gangs of waiting pods and notes
out (events/queued.py).

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
class VolcanoObjects:
    """One cluster's PodGroups and Volcano Jobs (None: the Jobs could not be listed or are not installed)."""

    podgroups: list[Any] = field(default_factory=list)
    jobs: list[Any] | None = None


def volcano_demand(
    objects: VolcanoObjects, now: datetime, gpu_resources: Mapping[str, float] = DEFAULT_GPU_RESOURCES
) -> QueuedDemand:
    """The PodGroups that count as demand, as gangs of waiting pods, and notes on those that do not."""
    return QueuedDemand(source=QueuedSource.VOLCANO)
