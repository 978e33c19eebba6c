"""Closing nodes to new work and opening them again (consolidation by attrition), one adapter per
`MarkChannel`. Glue: which nodes to close is decided in `scaling.consolidate`.

Every marker is idempotent (closing a node gpufleet already closed, or opening one it never closed, is
done) and never opens a node someone else closed: a Kubernetes node is uncordoned only while it carries
gpufleet's annotation, a Slurm node resumed only while its drain reason is gpufleet's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gpufleet.domain.models import GroupObservation


class MarksFailed(RuntimeError):
    """Closing or reopening nodes failed after the rest of the decision was carried out: the decision is
    recorded as failed (and told) but not kept as an intent to retry, so the next tick decides afresh."""


class NodeMarker(Protocol):
    """One way of closing a group's nodes to new work."""

    def close(self, obs: GroupObservation, instance_ids: Sequence[str], reason: str) -> str:
        """Close the nodes to new work (already closed by gpufleet: done). Returns a short account;
        raises on failure (`MarksFailed` for the whole change: told, and decided afresh next tick)."""
        ...

    def reopen(self, obs: GroupObservation, instance_ids: Sequence[str]) -> str:
        """Open nodes gpufleet closed (not closed, or closed by someone else: left as they are)."""
        ...


class LazyMarker:
    """A marker made on first use: a function that never cordons pays no import of the Kubernetes client
    at cold start."""

    def __init__(self, make: Callable[[], NodeMarker]) -> None:
        self._make = make
        self._marker: NodeMarker | None = None

    def _get(self) -> NodeMarker:
        if self._marker is None:
            self._marker = self._make()
        return self._marker

    def close(self, obs: GroupObservation, instance_ids: Sequence[str], reason: str) -> str:
        return self._get().close(obs, instance_ids, reason)

    def reopen(self, obs: GroupObservation, instance_ids: Sequence[str]) -> str:
        return self._get().reopen(obs, instance_ids)
