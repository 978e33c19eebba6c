"""spot_watch's glue: failed launches (EventBridge event or describe sweep) -> classify -> backoff and
unavailable offerings -> fallback decision -> act through the scaler's execution path -> notify the
group's capacity incident. Rules live in `gpufleet.spot`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict, ValidationError

from gpufleet.aws.activities import LaunchActivityReader, activity_az, activity_message
from gpufleet.controller import Controller
from gpufleet.decide import choose_scale_in_victims, cooldown_left
from gpufleet.fleet_policy import FleetPolicy, describe_validation_error
from gpufleet.models import Action, Bounds, Decision, Direction, GroupKind, GroupObservation, GroupRef
from gpufleet.notifications import (
    IncidentState,
    Notification,
    Severity,
    console_links,
    notification_id,
    scaling_incident_key,
)
from gpufleet.spot import (
    FailureClass,
    FallbackDecision,
    LaunchFailure,
    SpotState,
    decide_fallback,
    describe_failure,
    fold_failures,
    hourly_cost_difference,
    in_service,
)
from gpufleet.triggers import InvalidEvent, parse_trigger_events

SPOT_SK = "SPOT"
LAUNCH_UNSUCCESSFUL = "EC2 Instance Launch Unsuccessful"
SWEEP_LOOKBACK = timedelta(minutes=15)


class _LaunchDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    AutoScalingGroupName: str
    ActivityId: str
    StatusCode: str
    StatusMessage: str = ""
    Description: str = ""
    StartTime: datetime
    Details: dict[str, Any] = {}


def parse_launch_event(event: Any) -> _LaunchDetail | None:
    """The EventBridge `EC2 Instance Launch Unsuccessful` event, or None for any other event."""
    if not isinstance(event, dict) or event.get("detail-type") != LAUNCH_UNSUCCESSFUL:
        return None
    if event.get("source") != "aws.autoscaling":
        raise InvalidEvent(f"{LAUNCH_UNSUCCESSFUL} from source {event.get('source')!r}, expected 'aws.autoscaling'")
    try:
        return _LaunchDetail.model_validate(event.get("detail"))
    except ValidationError as err:
        raise InvalidEvent(f"{LAUNCH_UNSUCCESSFUL}: " + "; ".join(describe_validation_error(err))) from None


def instance_type(obs: GroupObservation) -> str | None:
    """The group's instance type when all its instances share one (the usual single-type GPU group)."""
    types = {i.instance_type for i in obs.instances if i.instance_type}
    return types.pop() if len(types) == 1 else None


def capacity_type(obs: GroupObservation) -> str:
    value = obs.tags.get("gpufleet:capacity-type") or obs.tags.get("eks.amazonaws.com/capacityType", "")
    return {"spot": "spot", "on_demand": "on-demand", "on-demand": "on-demand"}.get(value.lower(), "unknown")


@dataclass(kw_only=True)
class SpotWatch(Controller):
    activities: LaunchActivityReader

    def handle(self, event: Any, now: datetime) -> dict[str, Any]:
        launch = parse_launch_event(event)
        if launch is not None:
            return {"results": [self.on_launch_event(launch, event.get("id", launch.ActivityId), now)]}
        return {"results": [self.sweep(now, t.event_id) for t in parse_trigger_events(event)]}

    # ---- sources ----

    def on_launch_event(self, launch: _LaunchDetail, event_id: str, now: datetime) -> dict[str, Any]:
        policy = self.load_policy()
        obs = self._group_of_asg(launch.AutoScalingGroupName, policy)
        if obs is None:
            return {"event_id": event_id, "ignored": f"{launch.AutoScalingGroupName} is not a managed group"}
        failure = describe_failure(
            launch.ActivityId,
            obs.ref.key,
            launch.AutoScalingGroupName,
            launch.StartTime,
            launch.StatusMessage or launch.Description,
            str(launch.Details.get("Availability Zone") or "") or None,
            "event",
            capacity_type(obs),
            instance_type(obs),
        )
        return {"event_id": event_id, "groups": [self.process(obs, [failure], now, event_id, policy)]}

    def sweep(self, now: datetime, event_id: str) -> dict[str, Any]:
        """Managed groups (ASGs and the ASGs behind EKS node groups) that are short of capacity or still owe a
        fallback: their failed activities of the last SWEEP_LOOKBACK (seen ids dedup against the event path).
        A group whose desired capacity is all in service has nothing pending to fail, so it is not read."""
        policy = self.load_policy()
        managed = [
            o
            for o in self.fleet.observe(policy.discovery, policy.explicit_groups())
            if policy.settings_for(o.ref, o.tags)
        ]
        states = self.state.load_docs([o.ref.key for o in managed], SPOT_SK, SpotState)
        results = []
        for obs in managed:
            state = states[obs.ref.key]
            short = obs.desired > in_service(obs)
            if not (short or state.streak_started_at or state.fallback_added):
                continue
            failures = [
                describe_failure(
                    a["ActivityId"],
                    obs.ref.key,
                    a["AutoScalingGroupName"],
                    a["StartTime"],
                    activity_message(a),
                    activity_az(a),
                    "sweep",
                    capacity_type(obs),
                    instance_type(obs),
                )
                for a in self.activities.failed_since(obs.asg_name or obs.ref.name, now - SWEEP_LOOKBACK)
            ]
            if obs.ref.kind is GroupKind.EKS_NODEGROUP and obs.ref.cluster and not failures:
                for issue in self.activities.nodegroup_issues(obs.ref.cluster, obs.ref.name):
                    if issue.get("code") == "AsgInstanceLaunchFailures":
                        message = str(issue.get("message", ""))
                        failures.append(
                            describe_failure(
                                f"eks-health:{hash(message) & 0xFFFFFFFF:x}:{now:%Y%m%d%H}",
                                obs.ref.key,
                                obs.asg_name or "",
                                now,
                                message,
                                None,
                                "eks-health",
                                capacity_type(obs),
                                instance_type(obs),
                            )
                        )
            results.append(self.process(obs, failures, now, event_id, policy, state=state))
        self.emf.add_metric(name="SpotGroupsSwept", unit=MetricUnit.Count, value=len(results))
        return {"event_id": event_id, "groups": results, "groups_managed": len(managed)}

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
        sp = policy.spot
        before = state or self.state.load_doc(obs.ref.key, SPOT_SK, SpotState)
        after, new = fold_failures(before, failures, now, sp)
        settings = sp.settings_for(obs.ref.key)
        unfulfilled = max(0, obs.desired - in_service(obs))
        streak_over = after.streak_started_at is not None and not new and unfulfilled == 0
        decision: FallbackDecision | None = None
        acted: Decision | None = None
        if settings is not None and settings.fallback is not None:
            fb_obs = self.fleet.observe_one(GroupRef.parse_key(settings.fallback.group))
            decision = decide_fallback(obs, fb_obs, settings, after, new, now)
            if (
                fb_obs is not None
                and decision.fallback_desired is not None
                and decision.fallback_desired != fb_obs.desired
            ):
                acted = self._resize_fallback(fb_obs, decision, now, event_id, policy)
                if acted.outcome.value in ("applied", "dry-run"):
                    owed = max(0, before.fallback_added + acted.desired - acted.current)  # what was really done
                    after = after.model_copy(update={"fallback_added": owed})
        if streak_over and after.fallback_added == 0:
            after = after.model_copy(update={"streak_started_at": None, "notified_classes": ()})
        notes = self._notes(obs, before, after, new, decision, acted, now, event_id, policy, streak_over)
        if new:
            after = after.model_copy(
                update={
                    "notified_classes": tuple(sorted({*after.notified_classes, *(str(f.failure_class) for f in new)}))
                }
            )
        changed = after.model_dump(exclude={"version"}) != before.model_dump(exclude={"version"})
        if changed and not self.state.save_doc(obs.ref.key, SPOT_SK, after, before.version):
            self.logger.warning("spot state changed concurrently; retried next sweep", extra={"group": obs.ref.key})
        self._send(notes)
        for f in new:
            self.logger.warning(
                f"{obs.ref.key}: launch failed ({f.failure_class}) {f.offering}",
                extra={"failure": f.model_dump(mode="json"), "hint": f.hint},
            )
            self.emf.add_metric(name="LaunchFailures", unit=MetricUnit.Count, value=1)
        return {
            "group": obs.ref.key,
            "new_failures": [
                {"activity": f.activity_id, "class": str(f.failure_class), "offering": f.offering} for f in new
            ],
            "backoff_until": after.backoff_until.isoformat() if after.backoff_until else None,
            "unavailable": sorted(after.unavailable),
            "fallback": decision.model_dump(mode="json") if decision else None,
            "fallback_action": acted.model_dump(mode="json", exclude={"bounds", "needs_instance_metrics"})
            if acted
            else None,
        }

    def _resize_fallback(
        self, fb: GroupObservation, d: FallbackDecision, now: datetime, event_id: str, policy: FleetPolicy
    ) -> Decision:
        """The fallback group's change goes through the scaler's execution (lease, dry-run, audit), inside
        its bounds and its cooldown."""
        settings = policy.settings_for(fb.ref, fb.tags)
        desired = d.fallback_desired if d.fallback_desired is not None else fb.desired
        direction = Direction.OUT if desired > fb.desired else Direction.IN
        state = self.scaler.state.load([fb.ref.key])[fb.ref.key]
        base = {
            "group": fb.ref.key,
            "current": fb.desired,
            "trigger": f"spot-fallback:{d.spot_group}",
            "event_id": event_id,
            "at": now,
            "bounds": Bounds(min=fb.min_size, max=fb.max_size),
            "dry_run": self.global_dry_run or policy.dry_run or bool(settings and settings.dry_run),
        }
        if settings is None:
            return Decision(
                **base, action=Action.HOLD, desired=fb.desired, reason=f"{d.reason}, but {fb.ref.key} is not managed"
            )
        left = cooldown_left(direction, state, settings, now)
        if direction is Direction.IN and left > timedelta(0):
            return self.scaler.apply_external(
                Decision(
                    **base,
                    action=Action.HOLD,
                    desired=fb.desired,
                    reason=f"{d.reason}; waits {int(left.total_seconds())}s of cooldown",
                ),
                fb,
                policy,
                state,
            )
        if direction is Direction.OUT:
            return self.scaler.apply_external(
                Decision(**base, action=Action.SCALE_OUT, desired=desired, reason=d.reason), fb, policy, state
            )
        # Handing back removes idle fallback nodes only, chosen like the scaler's own scale-in: never a
        # node with busy GPUs, GPU memory in use, no metrics, or scale-in protection.
        measured = self.scaler.with_instance_metrics([fb], now, policy)[0]
        victims, note = choose_scale_in_victims(measured.instances, fb.desired - desired, settings.idle)
        if not victims:
            decision = Decision(
                **base,
                action=Action.HOLD,
                desired=fb.desired,
                reason=f"{d.reason}, but no fallback node is idle: {note}",
            )
        else:
            decision = Decision(
                **base,
                action=Action.SCALE_IN,
                desired=fb.desired - len(victims),
                victims=tuple(victims),
                reason=f"{d.reason}: terminating idle {', '.join(victims)} ({note})",
            )
        return self.scaler.apply_external(decision, measured, policy, state)

    def _group_of_asg(self, asg_name: str, policy: FleetPolicy) -> GroupObservation | None:
        for obs in self.fleet.observe(policy.discovery, policy.explicit_groups()):
            if (obs.asg_name or obs.ref.name) == asg_name and policy.settings_for(obs.ref, obs.tags):
                return obs
        return None

    # ---- telling: one incident per chain, the group's capacity incident ----

    def _notes(
        self,
        obs: GroupObservation,
        before: SpotState,
        after: SpotState,
        new: list[LaunchFailure],
        decision: FallbackDecision | None,
        acted: Decision | None,
        now: datetime,
        event_id: str,
        policy: FleetPolicy,
        streak_over: bool,
    ) -> list[Notification]:
        key = obs.ref.key
        out = []
        by_class: dict[FailureClass, list[LaunchFailure]] = {}
        for f in new:
            by_class.setdefault(f.failure_class, []).append(f)
        for cls, fs in by_class.items():
            if str(cls) in before.notified_classes:
                continue
            severity = Severity.WARNING if cls.falls_back else Severity.CRITICAL
            offerings = sorted({f.offering for f in fs})
            facts = {
                "class": str(cls),
                "failed launches": str(len(fs)),
                "type/AZ/capacity": ", ".join(offerings)[:500],
                "in service": f"{in_service(obs)} of {obs.desired} desired",
                "next retry (backoff)": f"{after.backoff_until:%H:%M:%S} UTC" if after.backoff_until else "-",
                "fix": fs[-1].hint,
            }
            out.append(
                self._note(
                    key,
                    f"{key}: {len(fs)} launch(es) failed: {cls}",
                    facts,
                    fs[-1].message[:500],
                    severity,
                    now,
                    event_id,
                    str(cls),
                )
            )
        if decision is not None and acted is not None and acted.outcome.value in ("applied", "dry-run"):
            itype = next((f.instance_type for f in new if f.instance_type), None)
            delta = acted.desired - acted.current
            cost = hourly_cost_difference(itype, abs(delta), policy.spot.prices)
            facts = {
                "fallback group": acted.group,
                "capacity": f"{acted.current} -> {acted.desired}",
                "owed back to spot": str(decision.added_after),
                "outcome": str(acted.outcome),
            }
            if cost is not None:
                facts["cost"] = f"{'+' if delta > 0 else '-'}${cost:.2f}/h vs spot ({itype})"
            verb = "fell back to on-demand" if delta > 0 else "handing capacity back to spot"
            out.append(
                self._note(
                    key,
                    f"{key}: {verb}: {acted.group} {acted.current} -> {acted.desired}",
                    facts,
                    decision.reason,
                    Severity.WARNING,
                    now,
                    event_id,
                    f"fallback-{acted.desired}",
                )
            )
        if streak_over and after.fallback_added == 0 and before.streak_started_at is not None:
            out.append(
                self._note(
                    key,
                    f"{key}: launches recovered, capacity back on spot",
                    {"in service": f"{in_service(obs)} of {obs.desired} desired"},
                    "spot launches succeed again and nothing is owed to the fallback group",
                    Severity.INFO,
                    now,
                    event_id,
                    "recovered",
                    resolved=True,
                )
            )
        return out

    def _note(
        self,
        group: str,
        title: str,
        facts: dict[str, str],
        reason: str,
        severity: Severity,
        now: datetime,
        event_id: str,
        what: str,
        resolved: bool = False,
    ) -> Notification:
        return Notification(
            notification_id=notification_id(event_id, group, "spot", what),
            kind="spot",
            severity=severity,
            group=group,
            incident_key=scaling_incident_key(group),
            title=title,
            facts=facts,
            reason=reason,
            links=console_links(group, self.region),
            state=IncidentState.RESOLVED if resolved else IncidentState.FIRING,
            at=now,
            source="spot_watch",
        )
