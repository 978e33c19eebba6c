"""Busy marks (`gpufleet-node busy`) and the scale-in protection the scaler keeps for them (pure).

A queue worker that holds a job writes one item keyed by its own aws:userid ("ROLEID:i-...") in the busy
table; IAM lets a node write only that key (`dynamodb:LeadingKeys`), so a mark speaks only for the node
that wrote it. Auto Scaling's scale-in protection cannot be scoped like that (SetInstanceProtection has
no condition key for the instance or the value), so nodes no longer set it: the scaler does, for marked
nodes, and clears only what it set. Its record of what it set lives in the same table under keys a node
can never write (OWNED_PREFIX holds a '#', an aws:userid none).

The rules, per instance of a group whose instances sit in an ASG (asg and eks-nodegroup kinds):
- marked and not protected: protect it (recorded as ours first, so a crash in between is mended);
- protected by us and no longer marked: clear it (the record dropped after);
- protected, not by us, not marked: kept (never removed: someone protected it for a reason gpufleet
  cannot see, e.g. a worker of your own that calls SetInstanceProtection with its own role) and told
  once per group with the instances: protection nobody explains may also be a forger with Auto Scaling
  rights keeping nodes (money);
- our record for a node that is no longer protected and not marked, in a group read now: forgotten
  (a record of a group not read this tick is kept until it is);
- a mark older than defaults.BUSY_MARK_STALE_S (its `since`, the node's own word about itself): told
  once, still obeyed (a job may run for days; a helper killed with SIGKILL leaves its mark behind).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation, InstanceObservation
from gpufleet_node import schema

OWNED_PREFIX = "gpufleet#protected#"  # + instance id: protection the scaler set for a mark
# Instances whose protection the scaler changes (protection is Auto Scaling's from InService on; a node
# still Pending is protected once it is InService, the next tick).
PROTECTABLE_STATES = frozenset({"InService", "Standby"})


@dataclass(frozen=True)
class BusyTable:
    """What the busy table holds: `marked` instance -> the aws:userid that wrote its mark, and from where
    it says it runs (its `asg`); `owned` instance -> the ASG the scaler protected it in; `foreign`: keys that
    are neither (a principal other than an instance profile wrote them): never taken as marks."""

    marked: Mapping[str, str] = field(default_factory=dict)
    marked_asg: Mapping[str, str] = field(default_factory=dict)
    marked_since: Mapping[str, datetime] = field(default_factory=dict)  # where the mark says when it was made
    owned: Mapping[str, str] = field(default_factory=dict)
    foreign: tuple[str, ...] = ()


def read_table(items: Iterable[Mapping[str, str]]) -> BusyTable:
    """The table from its items (each flattened to {attribute: string}). A mark is taken only from its key:
    the instance in the writer's own aws:userid, whatever the item's other attributes say."""
    marked: dict[str, str] = {}
    marked_asg: dict[str, str] = {}
    marked_since: dict[str, datetime] = {}
    owned: dict[str, str] = {}
    foreign: list[str] = []
    for item in items:
        key = item.get(schema.BUSY_KEY, "")
        if key.startswith(OWNED_PREFIX):
            owned[key[len(OWNED_PREFIX) :]] = item.get("asg", "")
            continue
        instance = schema.userid_instance(key)
        if instance is None:
            foreign.append(key)
            continue
        marked[instance] = key
        marked_asg[instance] = item.get("asg", "")
        since = _when(item.get("since", ""))
        if since is not None:
            marked_since[instance] = since
    return BusyTable(marked, marked_asg, marked_since, owned, tuple(sorted(foreign)))


def _when(text: str) -> datetime | None:
    """A mark's `since` ("2026-12-04T03:05:00Z"), or None when it is absent or not a time."""
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo is not None else None


@dataclass(frozen=True)
class ProtectionPlan:
    """What to change (per ASG: instance ids), and what to tell (per group key: instance ids)."""

    protect: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    clear: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    forget: tuple[str, ...] = ()  # our records of nodes no longer protected and not marked
    unexplained: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    gone: tuple[str, ...] = ()  # marks of nodes that left the managed group their mark names
    stale: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # marks older than BUSY_MARK_STALE_S

    @property
    def changes(self) -> bool:
        return bool(self.protect or self.clear or self.forget or self.gone)

    def asgs(self) -> list[str]:
        """The ASGs whose protection changes, in a stable order."""
        return sorted(set(self.protect) | set(self.clear))


def plan_protection(groups: Sequence[GroupObservation], table: BusyTable, now: datetime) -> ProtectionPlan:
    """The plan for the groups whose instances sit in an ASG (`asg_name` set), by the rules above."""
    steps: dict[Step, dict[str, list[str]]] = {step: {} for step in Step}
    protected: dict[str, bool] = {}  # every instance seen, and whether Auto Scaling protects it now
    stale: dict[str, list[str]] = {}
    old = now.astimezone(UTC) - timedelta(seconds=defaults.BUSY_MARK_STALE_S)
    for obs in groups:
        if not obs.asg_name:
            continue
        for inst in obs.instances:
            protected[inst.instance_id] = inst.protected_from_scale_in
            since = table.marked_since.get(inst.instance_id)
            if since is not None and since < old:
                stale.setdefault(obs.ref.key, []).append(inst.instance_id)
            step = _step(inst, inst.instance_id in table.marked, inst.instance_id in table.owned)
            where = obs.ref.key if step is Step.UNEXPLAINED else obs.asg_name
            steps[step].setdefault(where, []).append(inst.instance_id)
    protect, clear, unexplained = steps[Step.PROTECT], steps[Step.CLEAR], steps[Step.UNEXPLAINED]
    managed_asgs = {obs.asg_name for obs in groups if obs.asg_name}
    forget = [
        iid
        for iid, asg in table.owned.items()
        if asg in managed_asgs and iid not in table.marked and not protected.get(iid, False)
    ]
    gone = [iid for iid, asg in table.marked_asg.items() if asg in managed_asgs and iid not in protected]
    return ProtectionPlan(
        protect={k: tuple(v) for k, v in protect.items()},
        clear={k: tuple(v) for k, v in clear.items()},
        forget=tuple(sorted(forget)),
        unexplained={k: tuple(sorted(v)) for k, v in unexplained.items()},
        gone=tuple(sorted(gone)),
        stale={k: tuple(sorted(v)) for k, v in stale.items()},
    )


class Step(StrEnum):
    """What one instance's protection needs."""

    NONE = "none"
    PROTECT = "protect"
    CLEAR = "clear"
    UNEXPLAINED = "unexplained"


def _step(inst: InstanceObservation, marked: bool, owned: bool) -> Step:
    if inst.lifecycle_state not in PROTECTABLE_STATES:
        return Step.NONE
    if marked and not inst.protected_from_scale_in:
        return Step.PROTECT
    if inst.protected_from_scale_in and not marked:
        return Step.CLEAR if owned else Step.UNEXPLAINED
    return Step.NONE


def with_marks(obs: GroupObservation, marked: Collection[str]) -> GroupObservation:
    """The group with each marked node counted as protected: never a victim, whatever its protection in
    Auto Scaling says yet (the scaler sets it on the same tick, or a mark came after its read)."""
    if not any(i.instance_id in marked and not i.protected_from_scale_in for i in obs.instances):
        return obs
    instances = tuple(
        i.model_copy(update={"protected_from_scale_in": True}) if i.instance_id in marked else i for i in obs.instances
    )
    return obs.model_copy(update={"instances": instances})


def after_plan(obs: GroupObservation, plan: ProtectionPlan, done: Collection[str]) -> GroupObservation:
    """The group as the plan left it: `done` are the instance ids whose protection was changed."""
    protect = set(plan.protect.get(obs.asg_name or "", ())) & set(done)
    clear = set(plan.clear.get(obs.asg_name or "", ())) & set(done)
    if not protect and not clear:
        return obs
    instances = tuple(
        i.model_copy(update={"protected_from_scale_in": i.instance_id in protect})
        if i.instance_id in protect | clear
        else i
        for i in obs.instances
    )
    return obs.model_copy(update={"instances": instances})
