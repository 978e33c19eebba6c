"""Each reconcile tick keeps the queue workers' busy marks as scale-in protection. Glue: the rules are
`domain.busy`'s, the reads and writes `aws.busy_marks`'.

It runs on every tick, dry-run included: it replaces the protection a worker used to set on itself
(`gpufleet-node busy`), and it only protects marked nodes and clears what gpufleet itself set. It never
removes anything. A failure is told and changes nothing else: the scaler still never removes a marked
node (the marks are read again when a scale-in is weighed and right before every removal).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from gpufleet.aws.busy_marks import BusyMarks
from gpufleet.aws.fleet import GroupRegistry
from gpufleet.domain.models import GroupObservation
from gpufleet.domain.notification import Notification
from gpufleet.policy.fleet import GroupSettings
from gpufleet.scaling.notes import busy_marks_failed_note, stale_mark_note, unexplained_protection_note

Managed = list[tuple[GroupObservation, GroupSettings]]


def keep_busy_protected(
    busy: BusyMarks,
    groups: GroupRegistry,
    managed: Sequence[tuple[GroupObservation, GroupSettings]],
    now: datetime,
    region: str,
    logger: Any,
) -> tuple[Managed, list[Notification]]:
    """The managed groups as the protection left them, and what to tell: protection nobody explains and
    marks older than a day (once per group and set of nodes), or what could not be kept."""
    backed = [i for i, (obs, _) in enumerate(managed) if obs.asg_name]
    if not backed:
        return list(managed), []

    def prepare(obs: GroupObservation) -> None:  # a node group's backing ASG is adopted (tagged) first
        groups.provider(obs.ref.kind).prepare(obs)

    try:
        kept = busy.keep([managed[i][0] for i in backed], now, prepare)
    except Exception as exc:  # the table cannot be read: told, nothing changes
        why = f"{type(exc).__name__}: {exc}"
        logger.warning("busy marks not kept as scale-in protection", extra={"why": why})
        return list(managed), [busy_marks_failed_note(why, now, region)]
    out = list(managed)
    for i, obs in zip(backed, kept.groups, strict=True):
        out[i] = (obs, managed[i][1])
    plan = kept.plan
    if plan.changes:
        logger.info(
            "busy marks kept as scale-in protection",
            extra={"protected": dict(plan.protect), "cleared": dict(plan.clear), "marks of gone nodes": plan.gone},
        )
    notes = [unexplained_protection_note(group, ids, now, region) for group, ids in sorted(plan.unexplained.items())]
    notes += [stale_mark_note(group, ids, now, region) for group, ids in sorted(plan.stale.items())]
    if kept.failed:
        why = "; ".join(kept.failed)
        logger.warning("busy marks partly kept as scale-in protection", extra={"why": why})
        notes.append(busy_marks_failed_note(why, now, region))
    return out, notes
