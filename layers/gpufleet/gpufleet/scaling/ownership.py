"""Who sizes a group (glue): each reconcile notes changes of desired capacity gpufleet did not make; a
fight - repeated ones while gpufleet changes the group too - makes gpufleet stand aside (advise only) and
tell on-call, naming the changes and what Auto Scaling says caused them. Rules: `scaling.core`
(`foreign_change`, `fight_reason`, `group_rule`), `scaling.notes.fight_note`."""

from __future__ import annotations

from datetime import datetime, timedelta

from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation, GroupState
from gpufleet.scaling.core import fight_reason, foreign_change
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.notes import fight_note


def watch_owners(
    ctx: ControlContext, groups: list[GroupObservation], states: dict[str, GroupState], now: datetime
) -> None:
    """Changes of desired capacity gpufleet did not make, noted per group (`states` updated in place);
    a fight - repeated ones while gpufleet changes the group too - makes gpufleet stand aside and say so.
    Written only when something changed; a change of gpufleet's own in progress is not someone else's."""
    notes = []
    for obs in groups:
        key, state = obs.ref.key, states[obs.ref.key]
        change = foreign_change(obs, state, now)
        if state.intent is not None or (state.seen_desired is not None and change is None):
            continue
        foreign = (*state.foreign, change)[-defaults.FOREIGN_KEPT :] if change else state.foreign
        after = state.model_copy(update={"seen_desired": obs.desired, "foreign": foreign})
        why = fight_reason(after, now) if change else None
        standing = after.stand_aside_until is not None and now < after.stand_aside_until
        if why and not standing:
            after = after.model_copy(update={"stand_aside_until": now + timedelta(seconds=defaults.STAND_ASIDE_S)})
            activities = ctx.fleet.recent_activities(obs.asg_name) if obs.asg_name else []
            notes.append(fight_note(obs, after, why, activities, now, ctx.region))
            ctx.logger.warning(f"{key}: standing aside", extra={"why": why})
        if ctx.state.note_desired(key, state.seen_desired, after):
            states[key] = after
    ctx.send(notes)
