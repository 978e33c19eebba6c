"""spot_watch's glue for the capacity reservations managed groups launch into (Capacity Blocks, ODCRs with
an end date): EC2's delivered/expiring events, and the sweep's own look at the end dates, name the groups
and nodes launched into the reservation, busy or idle. Rules: `capacity.notes.capacity_block_note`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from gpufleet.aws.activities import LaunchActivityReader
from gpufleet.capacity.notes import capacity_block_note
from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation
from gpufleet.events.model import CapacityBlockEvent
from gpufleet.policy.fleet import FleetPolicy
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.service import Scaler


@dataclass
class ReservationWatch:
    ctx: ControlContext
    scaler: Scaler
    activities: LaunchActivityReader
    _told_ends: set[tuple[str, datetime]] = field(default_factory=set)

    def on_capacity_block(self, block: CapacityBlockEvent, now: datetime) -> dict[str, Any]:
        """The managed groups whose launch template targets the reservation, their nodes and GPUs."""
        policy = self.ctx.load_policy()
        groups = self._launching_into([obs for obs, _ in self.ctx.managed(policy)]).get(block.reservation_id, [])
        if not groups:
            return {"event_id": block.event_id, "ignored": f"no managed group launches into {block.reservation_id}"}
        return self._tell_block(block, groups, policy, now)

    def check_ends(
        self, groups: list[GroupObservation], policy: FleetPolicy, now: datetime, event_id: str
    ) -> list[dict[str, Any]]:
        """The sweep's own look at the reservations managed groups launch into (one
        DescribeCapacityReservations): one ending within RESERVATION_END_WARNING_S is told as EC2's warning
        would be - earlier, and even when that event is lost. Told once per container (the notification id
        is the event's, so the two fold into one)."""
        into = self._launching_into(groups)
        if not into:
            return []
        horizon = timedelta(seconds=defaults.RESERVATION_END_WARNING_S)
        out = []
        for rid, end in self.activities.reservation_ends(sorted(into)).items():
            if not now < end <= now + horizon or (rid, end) in self._told_ends:
                continue
            self._told_ends.add((rid, end))
            block = CapacityBlockEvent(
                event_id=f"{event_id}/{rid}", reservation_id=rid, phase="expiring", end=end, at=now
            )
            out.append(self._tell_block(block, into[rid], policy, now))
        return out

    def _launching_into(self, groups: list[GroupObservation]) -> dict[str, list[GroupObservation]]:
        """Managed groups by the reservation their launch template targets (templates read once each)."""
        into: dict[str, list[GroupObservation]] = {}
        for obs in groups:
            rid = self.activities.reservation_of(obs.launch_template) if obs.launch_template else None
            if rid:
                into.setdefault(rid, []).append(obs)
        return into

    def _tell_block(
        self, block: CapacityBlockEvent, groups: list[GroupObservation], policy: FleetPolicy, now: datetime
    ) -> dict[str, Any]:
        ids = [i.instance_id for obs in groups for i in obs.instances if i.in_service]
        gpu = self.scaler.metrics.instance_gpu(ids, now, policy.metric_lookback_s) if ids else {}
        affected = {
            obs.ref.key: {i.instance_id: gpu.get(i.instance_id, (None, None)) for i in obs.instances if i.in_service}
            for obs in groups
        }
        self.ctx.send([capacity_block_note(block, affected, region=self.ctx.region)])
        return {
            "event_id": block.event_id,
            "reservation": block.reservation_id,
            "phase": block.phase,
            "groups": affected,
        }
