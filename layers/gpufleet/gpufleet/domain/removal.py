"""Capacity only ever shrinks by named victims, each one looked at again right before the call.

Two pure rules every removal passes, whatever decided it (the band, an alarm, a window, a gang's give-back,
a spot hand-back, a resumed change):
- `held_floor`: a count never falls below the instances the group holds, less the victims it names, so the
  provider (EC2 Auto Scaling, EKS) never chooses a node to remove. Launches still owed may be cancelled.
- `after_last_look`: a victim that a fresh read says runs work (a pod bound to it, scale-in protection,
  Slurm's state, a cordon that is no longer gpufleet's) is dropped from the change and kept, and the
  decision says which and why.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.domain.models import Action, Decision, GroupObservation


def live_instances(obs: GroupObservation) -> int:
    """The instances the group holds (launching ones included): what a lower count would make AWS choose from."""
    return sum(1 for i in obs.instances if not i.lifecycle_state.startswith("Terminat"))


def held_floor(decision: Decision, obs: GroupObservation) -> Decision:
    """The decision with a count that names every node it removes: never below the instances the group
    holds less its named victims. A count cut by this rule is said in the reason."""
    if not decision.lowers_capacity:
        return decision
    live = {i.instance_id for i in obs.instances if not i.lifecycle_state.startswith("Terminat")}
    floor = len(live) - len([v for v in decision.victims if v in live])
    if decision.desired >= floor:
        return decision
    kept = floor - decision.desired
    reason = (
        f"{decision.reason}; held at {floor}, not {decision.desired}: {kept} more node(s) would be AWS's to "
        "choose, and gpufleet removes only nodes it names"
    )
    if floor >= decision.current:
        return decision.model_copy(update={"action": Action.HOLD, "desired": decision.current, "reason": reason})
    return decision.model_copy(update={"desired": floor, "reason": reason})


def after_last_look(decision: Decision, obs: GroupObservation, busy: Mapping[str, str]) -> Decision:
    """The decision without the victims a fresh read found not free (`busy`: instance id -> why), each
    kept with the count raised by one; nothing dropped: the decision unchanged. A change left with no
    victim and no other effect is a hold."""
    dropped = [v for v in decision.victims if v in busy]
    if not dropped:
        return decision
    victims = tuple(v for v in decision.victims if v not in busy)
    desired = min(decision.current, decision.desired + len(dropped))
    said = "; ".join(f"{v}: {busy[v]}" for v in dropped)
    detail = f"last look kept {len(dropped)} victim(s) ({said})"
    update: dict[str, object] = {"victims": victims, "desired": desired, "detail": detail}
    if not victims and desired >= decision.current and not decision.changes_marks:
        update["action"] = Action.HOLD
    update["reason"] = f"{decision.reason}; {detail}"
    return held_floor(decision.model_copy(update=update), obs)
