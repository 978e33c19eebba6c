"""Which group an alarm points at, and in which direction (pure).

Order: the alarm's gpufleet tags, then the dimensions of the metrics it reads (math-expression
children included), then the policy's alarm mappings. The answer says how it was found.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.domain import defaults
from gpufleet.domain.kinds import kinds, traits
from gpufleet.domain.models import Direction, Frozen, GroupRef
from gpufleet.events.model import AlarmEvent
from gpufleet.policy.fleet import FleetPolicy


class AlarmTarget(Frozen):
    """Where an alarm points, and how that was found out (for the decision's reason)."""

    group: GroupRef | None
    direction: Direction | None
    found_by: str


def _group_of(dims: Mapping[str, str]) -> GroupRef | None:
    """The group whose own series carry these dimensions (`domain.kinds`: each kind's dimension names).
    Kinds named inside a cluster are tried first: their dimensions are the more specific."""
    for kind in sorted(kinds(), key=lambda k: not traits(k).in_cluster):
        row = traits(kind)
        name = dims.get(row.name_dimension)
        cluster = dims.get(row.cluster_dimension) if row.cluster_dimension else None
        if name and (row.cluster_dimension is None or cluster):
            return GroupRef(kind=kind, name=name, cluster=cluster)
    return None


def _group_from_dimensions(trigger: AlarmEvent) -> tuple[GroupRef | None, str]:
    found: set[GroupRef] = set()
    for metric in trigger.metrics:
        ref = _group_of(metric.dimensions)
        if ref is not None:
            found.add(ref)
    if len(found) == 1:
        return found.pop(), "metric dimensions"
    if len(found) > 1:
        keys = ", ".join(sorted(g.key for g in found))
        return None, f"metric dimensions name several groups ({keys})"
    return None, "no group dimension on the alarm's metrics"


def resolve_alarm_target(trigger: AlarmEvent, alarm_tags: dict[str, str], policy: FleetPolicy) -> AlarmTarget:
    notes: list[str] = []
    group: GroupRef | None = None
    group_by = ""
    if tag := alarm_tags.get(defaults.TAG_ALARM_TARGET):
        try:
            group, group_by = GroupRef.parse_key(tag), "alarm tag"
        except ValueError as exc:
            notes.append(f"ignored tag {defaults.TAG_ALARM_TARGET}: {exc}")
    if group is None:
        group, why = _group_from_dimensions(trigger)
        group_by = why if group is not None else ""
        if group is None:
            notes.append(why)

    direction: Direction | None = None
    direction_by = ""
    raw = alarm_tags.get(defaults.TAG_ALARM_DIRECTION, "").strip().lower()
    if raw:
        if raw in (Direction.OUT, Direction.IN):
            direction, direction_by = Direction(raw), "alarm tag"
        else:
            notes.append(f"ignored tag {defaults.TAG_ALARM_DIRECTION}={raw!r} (expected out or in)")

    mapping = policy.alarm_mapping(trigger.alarm_name)
    if mapping is not None:
        if group is None and mapping.group_ref() is not None:
            group, group_by = mapping.group_ref(), f"policy alarm mapping '{mapping.alarm}'"
        if direction is None and mapping.direction is not None:
            direction, direction_by = mapping.direction, f"policy alarm mapping '{mapping.alarm}'"

    if group is None and trigger.composite:
        notes.append("composite alarm without a gpufleet:target tag or policy mapping")
    if direction is None:
        notes.append(f"no direction (tag {defaults.TAG_ALARM_DIRECTION} or policy mapping)")
    found = []
    if group is not None:
        found.append(f"group {group.key} from {group_by}")
    if direction is not None:
        found.append(f"direction {direction} from {direction_by}")
    found_by = "; ".join(found + (notes if group is None or direction is None else []))
    return AlarmTarget(group=group, direction=direction, found_by=found_by)


def not_gpufleets(alarm: AlarmEvent, tags: dict[str, str], policy: FleetPolicy) -> str | None:
    """Only alarms gpufleet was given: its name prefix, a policy mapping, or a gpufleet:target tag."""
    if alarm.alarm_name.startswith(policy.alarm_prefix) or policy.alarm_mapping(alarm.alarm_name):
        return None
    if defaults.TAG_ALARM_TARGET in tags:
        return None
    return (
        f"alarm {alarm.alarm_name} is not gpufleet's (no prefix {policy.alarm_prefix!r}, "
        f"no policy alarm mapping, no {defaults.TAG_ALARM_TARGET} tag): no action"
    )
