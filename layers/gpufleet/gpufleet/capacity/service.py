"""spot_watch's glue: failed launches (EventBridge event or describe sweep) -> classify -> backoff and
unavailable offerings -> fallback plan -> the fallback group's change through the scaler's execution ->
tell the group's capacity incident. Rules live in `capacity.classify`, `capacity.core`, `capacity.notes`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.activities import LaunchActivityReader, activity_az, activity_message
from gpufleet.aws.documents import SPOT_SK
from gpufleet.capacity.classify import FailureSource, LaunchFailure, describe_failure, eks_issue_id
from gpufleet.capacity.core import FallbackPlan, SpotState, fallback_change, fold_failures, owed_after, plan_fallback
from gpufleet.capacity.notes import spot_notes
from gpufleet.capacity.reservations import ReservationWatch
from gpufleet.capacity.warnings import CapacityWarnings
from gpufleet.domain.kinds import traits
from gpufleet.domain.models import CapacityType, Decision, GroupObservation, GroupRef
from gpufleet.events import EventKind
from gpufleet.events.model import CapacityBlockEvent, InstanceWarning, LaunchUnsuccessful
from gpufleet.policy.fleet import FleetPolicy
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.service import Scaler, with_instance_metrics

SWEEP_LOOKBACK = timedelta(minutes=15)
ACCEPTS = (
    EventKind.LAUNCH_UNSUCCESSFUL,
    EventKind.SCHEDULE,
    EventKind.SPOT_INTERRUPTION,
    EventKind.REBALANCE,
    EventKind.CAPACITY_BLOCK,
)


def _failure(
    obs: GroupObservation, activity_id: str, asg: str, at: datetime, message: str, az: str | None, source: FailureSource
) -> LaunchFailure:
    itype = obs.instance_types[0] if len(obs.instance_types) == 1 else None
    return describe_failure(activity_id, obs.ref.key, asg, at, message, az, source, obs.capacity_type, itype)


@dataclass
class SpotWatch:
    ctx: ControlContext
    scaler: Scaler
    activities: LaunchActivityReader

    @cached_property
    def warnings(self) -> CapacityWarnings:
        """One per container: its reservation watch remembers which reservation ends it has told."""
        reservations = ReservationWatch(self.ctx, self.scaler, self.activities)
        return CapacityWarnings(self.ctx, self.scaler, self.activities, reservations)

    def handle(self, event: Any, now: datetime) -> dict[str, Any]:
        """Raises InvalidEvent (UnsupportedEvent for an alarm, say) before anything is read or changed."""
        events = self.ctx.begin(event, "spot_watch", ACCEPTS)
        results = []
        for e in events:
            if isinstance(e, LaunchUnsuccessful):
                results.append(self.on_launch_event(e, now))
            elif isinstance(e, InstanceWarning):
                results.append(self.warnings.on_instance(e, now))
            elif isinstance(e, CapacityBlockEvent):
                results.append(self.warnings.reservations.on_capacity_block(e, now))
            else:
                results.append(self.sweep(now, e.event_id))
        return {"results": results}

    # ---- sources ----

    def on_launch_event(self, launch: LaunchUnsuccessful, now: datetime) -> dict[str, Any]:
        policy = self.ctx.load_policy()
        obs = next((o for o, _ in self.ctx.managed(policy) if (o.asg_name or o.ref.name) == launch.asg_name), None)
        if obs is None:
            return {"event_id": launch.event_id, "ignored": f"{launch.asg_name} is not a managed group"}
        obs = self._with_market(obs)
        failure = _failure(
            obs,
            launch.activity_id,
            launch.asg_name,
            launch.at,
            launch.message,
            launch.availability_zone,
            FailureSource.EVENT,
        )
        return {"event_id": launch.event_id, "groups": [self.process(obs, [failure], now, launch.event_id, policy)]}

    def sweep(self, now: datetime, event_id: str) -> dict[str, Any]:
        """Managed groups (ASGs and the ASGs behind EKS node groups) that are short of capacity or still owe a
        fallback: their failed activities of the last SWEEP_LOOKBACK (seen ids dedup against the event path).
        A group whose desired capacity is all in service has nothing pending to fail, so it is not read."""
        policy = self.ctx.load_policy()
        managed = [obs for obs, _ in self.ctx.managed(policy)]
        states = self.ctx.docs.load_docs([o.ref.key for o in managed], SPOT_SK, SpotState)
        results = []
        for obs in managed:
            state = states[obs.ref.key]
            if obs.desired > obs.in_service or state.streak_started_at or state.fallback_added:
                try:
                    results.append(self.process(obs, self._failures(obs, now), now, event_id, policy, state=state))
                except Exception as exc:  # one group's failure never stops the sweep of the others
                    self.ctx.logger.exception("spot sweep failed for a group", extra={"group": obs.ref.key})
                    results.append({"group": obs.ref.key, "error": f"{type(exc).__name__}: {exc}"})
        self.ctx.emf.add_metric(name="SpotGroupsSwept", unit=MetricUnit.Count, value=len(results))
        return {
            "event_id": event_id,
            "groups": results,
            "groups_managed": len(managed),
            **self.warnings.on_sweep(managed, policy, now, event_id),
        }

    def _with_market(self, obs: GroupObservation) -> GroupObservation:
        """A plain launch-template group's market, from the template (read only when a failure needs it)."""
        if obs.capacity_type is not CapacityType.UNKNOWN or obs.launch_template is None:
            return obs
        return obs.model_copy(update={"capacity_type": self.activities.market_of(obs.launch_template)})

    def _failures(self, obs: GroupObservation, now: datetime) -> list[LaunchFailure]:
        if not traits(obs.ref.kind).in_asg:  # no ASG holds its nodes: an ASG of the same name is not it
            return []
        asg = obs.asg_name or obs.ref.name
        activities = self.activities.failed_since(asg, now - SWEEP_LOOKBACK)
        obs = self._with_market(obs) if activities else obs
        found = [
            _failure(
                obs,
                a["ActivityId"],
                a["AutoScalingGroupName"],
                a["StartTime"],
                activity_message(a),
                activity_az(a),
                FailureSource.SWEEP,
            )
            for a in activities
        ]
        if not found:
            for issue in self.activities.health_issues(obs.ref):
                if issue.get("code") == "AsgInstanceLaunchFailures":
                    message = str(issue.get("message", ""))
                    found.append(
                        _failure(obs, eks_issue_id(message, now), asg, now, message, None, FailureSource.EKS_HEALTH)
                    )
        return found

    # ---- one group ----

    def process(
        self,
        obs: GroupObservation,
        failures: list[LaunchFailure],
        now: datetime,
        event_id: str,
        policy: FleetPolicy,
        state: SpotState | None = None,
    ) -> dict[str, Any]:
        before = state or self.ctx.docs.load_doc(obs.ref.key, SPOT_SK, SpotState)
        after, new = fold_failures(before, failures, now, policy.spot)
        plan, acted, owed = self._fallback(obs, after, new, now, event_id, policy)
        after = after.model_copy(update={"fallback_added": owed})
        fallback = (acted, plan.reason if plan else acted.reason) if acted is not None else None  # resumed: no plan
        streak_over = after.streak_started_at is not None and not new and obs.desired <= obs.in_service
        if streak_over and after.fallback_added == 0:
            after = after.model_copy(update={"streak_started_at": None, "notified_classes": ()})
        notes = spot_notes(
            obs,
            before,
            after,
            new,
            fallback,
            streak_over,
            policy.spot.prices,
            now=now,
            event_id=event_id,
            region=self.ctx.region,
        )
        if new:
            classes = tuple(sorted({*after.notified_classes, *(f.failure_class for f in new)}))
            after = after.model_copy(update={"notified_classes": classes})
        # Tell first (the fallback change's audit and outbox go with it), remember after: a crash or a queue
        # outage in between tells again next sweep rather than never.
        told = self.ctx.executor.record([acted] if acted else [], policy, extra=notes, tell=False)
        if told and not self.ctx.docs.save_changes(obs.ref.key, SPOT_SK, before, after):
            self.ctx.logger.warning("spot state changed concurrently; retried next sweep", extra={"group": obs.ref.key})
        self._report(obs, new)
        return _summary(obs, new, after, plan, acted)

    def _fallback(
        self,
        obs: GroupObservation,
        after: SpotState,
        new: list[LaunchFailure],
        now: datetime,
        event_id: str,
        policy: FleetPolicy,
    ) -> tuple[FallbackPlan | None, Decision | None, int]:
        """The fallback group's change for this spot group, executed like the scaler's own (lease, bounds,
        cooldowns, idle-only hand-back, dry-run, audit), and what is owed back to spot after it. What is
        owed is the fallback group's own ledger, committed in the same write as the change, so a crash
        after the change can never make the next run raise the fallback again."""
        settings = policy.spot.settings_for(obs.ref.key)
        if settings is None or settings.fallback is None:
            return None, None, 0
        fb = self.ctx.fleet.observe_one(GroupRef.parse_key(settings.fallback.group))
        fb_settings = policy.settings_for(fb.ref, fb.tags) if fb is not None else None
        if fb is None or fb_settings is None:
            self.ctx.logger.warning(
                "fallback group missing or not managed", extra={"fallback": settings.fallback.group}
            )
            return None, None, after.fallback_added
        fb = self.scaler.with_demand(fb, fb_settings, now, policy)  # hand-back: never a node running work
        fb_state = self.ctx.states([fb], policy)[fb.ref.key]
        owed = fb_state.owed.get(obs.ref.key, 0)
        resumed = self.ctx.executor.resume(fb, fb_state, event_id, now)  # a change a crash left half done
        if resumed is not None:
            return None, resumed, owed_after(owed, resumed) if resumed.owed_to == obs.ref.key else owed
        plan = plan_fallback(obs, fb, settings, after, new, now, owed=owed)
        dry = self.ctx.dry(policy)
        decision = fallback_change(plan, fb, fb_settings, fb_state, now, event_id=event_id, global_dry_run=dry)
        if decision is not None and decision.needs_instance_metrics:
            fb = with_instance_metrics(self.scaler.metrics, [fb], now, policy, self.ctx.fleet)[0]
            decision = fallback_change(plan, fb, fb_settings, fb_state, now, event_id=event_id, global_dry_run=dry)
        if decision is None:
            return plan, None, owed
        acted = self.scaler.carry_out(decision, fb, fb_state)
        return plan, acted, owed_after(owed, acted)

    def _report(self, obs: GroupObservation, new: list[LaunchFailure]) -> None:
        for f in new:
            self.ctx.logger.warning(
                f"{obs.ref.key}: launch failed ({f.failure_class}) {f.offering}",
                extra={"failure": f.model_dump(mode="json"), "hint": f.hint},
            )
        if new:
            self.ctx.emf.add_metric(name="LaunchFailures", unit=MetricUnit.Count, value=len(new))


def _summary(
    obs: GroupObservation, new: list[LaunchFailure], after: SpotState, plan: FallbackPlan | None, acted: Decision | None
) -> dict[str, Any]:
    """What one group's pass found and did, for the invocation's result."""
    return {
        "group": obs.ref.key,
        "new_failures": [
            {"activity": f.activity_id, "class": str(f.failure_class), "offering": f.offering} for f in new
        ],
        "backoff_until": after.backoff_until.isoformat() if after.backoff_until else None,
        "unavailable": sorted(after.unavailable),
        "fallback_owed": after.fallback_added,
        "fallback": plan.model_dump(mode="json") if plan else None,
        "fallback_action": acted.model_dump(mode="json", exclude={"bounds", "needs_instance_metrics", "skipped"})
        if acted
        else None,
    }
