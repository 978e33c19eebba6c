"""spot_watch's glue for capacity going away: a spot interruption warning or rebalance recommendation for
a node of a managed group (tell its capacity incident what runs there; per policy launch its replacement
now and give it back once the node is gone); Capacity Blocks are `capacity.reservations`. Rules:
`scaling.core.decide_replacement`, `capacity.notes`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpufleet.aws.activities import LaunchActivityReader
from gpufleet.capacity.notes import handback_note, warning_note
from gpufleet.capacity.reservations import ReservationWatch
from gpufleet.domain.models import Decision, Direction, GroupObservation, GroupState
from gpufleet.events.model import EventKind, InstanceWarning
from gpufleet.policy.capacity import WarningAction
from gpufleet.policy.fleet import FleetPolicy, GroupSettings
from gpufleet.scaling.core import INTERRUPTED, decide_replacement
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.service import Scaler, with_instance_metrics


@dataclass
class CapacityWarnings:
    ctx: ControlContext
    scaler: Scaler
    activities: LaunchActivityReader
    reservations: ReservationWatch

    def on_instance(self, warning: InstanceWarning, now: datetime) -> dict[str, Any]:
        policy = self.ctx.load_policy()
        found = self._managed_group_of(warning.instance_id, policy)
        if found is None:
            return {"event_id": warning.event_id, "ignored": f"{warning.instance_id} is not in a managed group"}
        obs, settings = found
        iid, key = warning.instance_id, obs.ref.key
        gpu = self.scaler.metrics.instance_gpu([iid], now, policy.metric_lookback_s).get(iid, (None, None))
        interruptions = policy.spot.interruptions
        wanted = (
            interruptions.on_interruption if warning.kind is EventKind.SPOT_INTERRUPTION else interruptions.on_rebalance
        )
        acted: Decision | None = None
        replacement = f"none (policy: {wanted}); Auto Scaling replaces it after it goes"
        if wanted is WarningAction.PRELAUNCH:
            acted, replacement = self._prelaunch(obs, settings, warning, policy, now)
        notes = [warning_note(obs, warning, gpu, replacement, region=self.ctx.region)]
        self.ctx.executor.record([acted] if acted else [], policy, extra=notes, tell=False)
        return {
            "event_id": warning.event_id,
            "group": key,
            "instance": iid,
            "gpu": {"utilization": gpu[0], "memory_percent": gpu[1]},
            "replacement": acted.model_dump(mode="json", include={"action", "current", "desired", "outcome", "reason"})
            if acted
            else replacement,
        }

    def _managed_group_of(self, instance_id: str, policy: FleetPolicy) -> tuple[GroupObservation, GroupSettings] | None:
        asg = self.ctx.fleet.asg_of_instance(instance_id)
        obs = self.ctx.fleet.owner_of_asg(asg) if asg else None
        settings = policy.settings_for(obs.ref, obs.tags) if obs is not None else None
        return (obs, settings) if obs is not None and settings is not None else None

    def _prelaunch(
        self,
        obs: GroupObservation,
        settings: GroupSettings,
        warning: InstanceWarning,
        policy: FleetPolicy,
        now: datetime,
    ) -> tuple[Decision | None, str]:
        """One replacement per node, whatever number of warnings arrive for it (the ledger remembers)."""
        key, iid = obs.ref.key, warning.instance_id
        state = self.ctx.states([obs], policy)[key]
        if state.owed.get(f"{INTERRUPTED}{iid}", 0) > 0:
            return None, "already launched for an earlier warning"
        why = f"{warning.kind} for {iid}"
        decision = decide_replacement(
            obs,
            settings,
            state,
            now,
            event_id=warning.event_id,
            instance_id=iid,
            direction=Direction.OUT,
            why=why,
            global_dry_run=self.ctx.dry(policy),
        )
        acted = self.scaler.carry_out(decision, obs, state)
        if not acted.changes_capacity:
            return acted, acted.reason
        return acted, f"launched: {acted.current} -> {acted.desired} ({acted.outcome}); given back when {iid} is gone"

    def on_sweep(
        self, managed: list[GroupObservation], policy: FleetPolicy, now: datetime, event_id: str
    ) -> dict[str, list[dict[str, Any]]]:
        """The sweep's part here, each guarded (the sweep's own results stand; the next sweep tries again):
        early replacements whose node is gone handed back (one BatchGetItem of the states), and reservation
        ends within the hour told."""
        out: dict[str, list[dict[str, Any]]] = {"handed_back": [], "reservations_ending": []}
        try:
            out["handed_back"] = self.hand_back(managed, self.ctx.states(managed, policy), policy, now, event_id)
        except Exception:
            self.ctx.logger.exception("hand-back of early replacements failed")
        try:
            out["reservations_ending"] = self.reservations.check_ends(managed, policy, now, event_id)
        except Exception:
            self.ctx.logger.exception("checking reservation end dates failed")
        return out

    def hand_back(
        self,
        groups: list[GroupObservation],
        states: dict[str, GroupState],
        policy: FleetPolicy,
        now: datetime,
        event_id: str,
    ) -> list[dict[str, Any]]:
        """Replacements launched early whose node is gone now: desired back down (or, if Auto Scaling
        replaced the node too, one idle node removed). Nothing is recorded while the node still runs."""
        out = []
        for obs in groups:
            state = states[obs.ref.key]
            for ledger, owed in state.owed.items():
                if not ledger.startswith(INTERRUPTED) or owed <= 0:
                    continue
                iid = ledger.removeprefix(INTERRUPTED)
                acted = self._give_back(obs, state, iid, policy, now, event_id)
                if acted is not None:
                    out.append(
                        {"group": obs.ref.key, "instance": iid, "outcome": str(acted.outcome), "reason": acted.reason}
                    )
        return out

    def _give_back(
        self, obs: GroupObservation, state: GroupState, iid: str, policy: FleetPolicy, now: datetime, event_id: str
    ) -> Decision | None:
        settings = policy.settings_for(obs.ref, obs.tags)
        if settings is None or any(i.instance_id == iid and i.in_service and i.healthy for i in obs.instances):
            return None

        def decide(o: GroupObservation) -> Decision:
            return decide_replacement(
                o,
                settings,
                state,
                now,
                event_id=f"{event_id}:{iid}",
                instance_id=iid,
                direction=Direction.IN,
                why=f"replacement for {iid}",
                global_dry_run=self.ctx.dry(policy),
            )

        obs = self.scaler.with_demand(obs, settings, now, policy)  # never a node running work
        decision = decide(obs)
        if decision.needs_instance_metrics:
            obs = with_instance_metrics(self.scaler.metrics, [obs], now, policy, self.ctx.fleet)[0]
            decision = decide(obs)
        if not decision.changes_capacity:
            return None
        acted = self.scaler.carry_out(decision, obs, state)
        self.ctx.executor.record(
            [acted], policy, extra=[handback_note(obs, acted, iid, region=self.ctx.region)], tell=False
        )
        return acted
