"""The scaler's glue: typed event -> observe -> load state -> decide (`scaling.core`) -> execute
(`scaling.execution`) -> audit -> notify. No rules live here.

`Scaler.handle` takes a raw Lambda event and `now`; the handler passes the real clock, the rehearsal a
simulated one. Every decision, acted or not, is logged, counted and audited.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.fleet import FleetReader
from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.domain.errors import ActionFailed
from gpufleet.domain.models import (
    Action,
    AlarmCondition,
    AlarmState,
    Decision,
    Demand,
    Direction,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    MetricRef,
    Outcome,
    Trigger,
    TriggerKind,
)
from gpufleet.domain.notification import Notification
from gpufleet.events import EventKind
from gpufleet.events.alarms import alarm_range_s, as_cloudwatch_says, described_condition, from_described_alarm
from gpufleet.events.model import AlarmEvent, AlarmSource, ScheduleTick
from gpufleet.policy.fleet import FleetPolicy, GroupSettings
from gpufleet.scaling import trust_reads
from gpufleet.scaling.core import decide_alarm, decide_reconcile, decide_request, skip_reason
from gpufleet.scaling.demand_source import DemandReader
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.metric_trust import (
    Verdict,
    alarm_checked,
    doubted,
    hold,
    series_acted_on,
    series_audited,
    statistic_problem,
)
from gpufleet.scaling.notes import (
    CANNOT_ACT,
    alarm_resolved_notes,
    broken_alarm_notes,
    demand_notes,
    forged_series_note,
)
from gpufleet.scaling.ownership import watch_owners
from gpufleet.scaling.targets import not_gpufleets, resolve_alarm_target
from gpufleet_node import schema

UNRESOLVED_GROUP = "unresolved"
# Deliveries re-read from CloudWatch before acting, and how a reason names them.
RE_READ = {AlarmSource.SNS: "SNS", AlarmSource.ALARM_ACTION: "the alarm action"}
ACCEPTS = (EventKind.ALARM, EventKind.SCHEDULE)
_RECONCILE = Trigger(kind=TriggerKind.UTILIZATION_BAND, name="reconcile")

Process = Callable[..., dict[str, Any]]


@dataclass
class Scaler:
    ctx: ControlContext
    metrics: GpuMetricsReader
    alarms: AlarmReader
    # Wraps `process` with Powertools Idempotency keyed on the event's id (None: off).
    idempotent: Callable[[Process], Process] | None = None
    # Reads the groups' demand sources (waiting pods, queues, backlog metrics); None: utilization rules only.
    demand: DemandReader | None = None
    _process: Process = field(init=False)

    def __post_init__(self) -> None:
        self._process = self.idempotent(self.process) if self.idempotent else self.process

    def handle(self, event: Any, now: datetime) -> dict[str, Any]:
        """Raises InvalidEvent / PolicyError before anything is read or changed."""
        events = self.ctx.begin(event, "scaler", ACCEPTS)
        policy = self.ctx.load_policy()
        results = []
        for e in events:
            self.ctx.logger.set_correlation_id(e.event_id)
            if isinstance(e, AlarmEvent):
                said = as_cloudwatch_says_now(self.alarms, e)
                if isinstance(said, str):  # refused before idempotency: a forged delivery stores no key
                    results.append(self.refuse(e, said, policy, now))
                    continue
                e = said
            results.append(self._process(trigger=e, policy=policy, now=now))
        return {"results": results}

    def refuse(self, alarm: AlarmEvent, why: str, policy: FleetPolicy, now: datetime) -> dict[str, Any]:
        """A delivery CloudWatch does not confirm: audited and answered, never acted on."""
        decision = _no_action(UNRESOLVED_GROUP, _by(alarm), alarm.event_id, now, why)
        self.finish([decision], policy)
        return {"event_id": alarm.event_id, "kind": str(alarm.kind), "decisions": [_shown(decision)]}

    def process(self, *, trigger: AlarmEvent | ScheduleTick, policy: FleetPolicy, now: datetime) -> dict[str, Any]:
        broken: list[Notification] = []
        if isinstance(trigger, ScheduleTick):
            decisions, broken = self.reconcile(trigger, policy, now)
        else:
            decision, doubted = self.on_alarm(trigger, policy, now)
            decisions = [decision]
            broken = broken_alarm_notes(trigger, decisions, self.ctx.region) + doubted
        self.finish(decisions, policy, trigger, broken)
        failed = [d for d in decisions if d.outcome is Outcome.FAILED]
        if failed and isinstance(trigger, AlarmEvent):
            raise ActionFailed("; ".join(f"{d.group}: {d.detail}" for d in failed))
        return {
            "event_id": trigger.event_id,
            "kind": str(trigger.kind),
            "decisions": [_shown(d) for d in decisions],
        }

    def finish(
        self,
        decisions: Sequence[Decision],
        policy: FleetPolicy,
        trigger: AlarmEvent | ScheduleTick | None = None,
        extra: Sequence[Notification] = (),
    ) -> None:
        """Audit, log, count and tell on-call (changes, would-be changes, failures, an alarm back to OK,
        an alarm that cannot act)."""
        notes = list(extra)
        if isinstance(trigger, AlarmEvent):
            told = [d for d in decisions if d.group != UNRESOLVED_GROUP and d.bounds]
            notes += alarm_resolved_notes(trigger, told, self.ctx.region)
        self.ctx.executor.record(decisions, policy, notes)

    # ---- alarm path ----

    def _managed_one(self, group: GroupRef, policy: FleetPolicy) -> tuple[GroupObservation, GroupSettings] | str:
        """The group and its settings, or why it cannot be acted on."""
        obs = self.ctx.fleet.observe_one(group)
        if obs is None:
            return f"group {group.key} not found"
        settings = policy.settings_for(obs.ref, obs.tags)
        if settings is None:
            tag = f"{policy.discovery.tag_key}={policy.discovery.tag_value}"
            return f"group {obs.ref.key} is not managed (not tagged {tag} and no policy rule matches)"
        return obs, settings

    def on_alarm(self, alarm: AlarmEvent, policy: FleetPolicy, now: datetime) -> tuple[Decision, list[Notification]]:
        """`alarm` as CloudWatch says it (SNS and alarm-action deliveries were re-read in `handle`), and
        what to tell when the group series it reads holds data no member could publish."""
        trigger = _by(alarm)
        tags = self.alarms.tags(alarm.alarm_arn)
        not_ours = not_gpufleets(alarm, tags, policy)
        if not_ours:
            return _no_action(UNRESOLVED_GROUP, trigger, alarm.event_id, now, not_ours), []
        target = resolve_alarm_target(alarm, tags, policy)
        if target.group is None or target.direction is None:
            group = target.group.key if target.group else UNRESOLVED_GROUP
            why = f"alarm {alarm.alarm_name} ({alarm.state}): no action, {target.found_by}"
            return _no_action(group, trigger, alarm.event_id, now, why, cannot_act=True), []
        found = self._managed_one(target.group, policy)
        if isinstance(found, str):
            why = f"alarm {alarm.alarm_name}: {found}"
            return _no_action(target.group.key, trigger, alarm.event_id, now, why, cannot_act=True), []
        obs, settings = found
        state = self.ctx.states([obs], policy)[obs.ref.key]
        resumed = self.ctx.executor.resume(obs, state, alarm.event_id, now)
        if resumed is not None:
            return resumed, []
        if alarm.state is AlarmState.ALARM and target.direction is Direction.IN:
            obs = with_instance_metrics(self.metrics, [obs], now, policy, self.ctx.fleet)[0]
            obs = self.with_demand(obs, settings, now, policy)  # no scale-in while work waits or runs
        dry = self.ctx.dry(policy)
        decision = decide_alarm(obs, settings, state, now, alarm=alarm, direction=target.direction, global_dry_run=dry)
        decision = decision.model_copy(update={"reason": f"{decision.reason} [{target.found_by}]"})
        decision, told = alarm_series_checked(self, decision, alarm, obs, now, policy)
        return self.ctx.executor.execute(decision, obs, state), told

    # ---- requests from other controllers ----

    def request(
        self, group: GroupRef, direction: Direction, trigger: Trigger, why: str, now: datetime, event_id: str
    ) -> Decision:
        """A scale step asked for by another controller (the OOM guard's memory pressure), decided and
        acted on exactly like an alarm: bounds, windows, cooldowns, lease, dry-run, audit, notification."""
        policy = self.ctx.load_policy()
        found = self._managed_one(group, policy)
        if isinstance(found, str):
            decision = _no_action(group.key, trigger, event_id, now, f"{why}, but {found}")
        else:
            obs, settings = found
            state = self.ctx.states([obs], policy)[obs.ref.key]
            step = partial(decide_request, event_id=event_id, direction=direction, trigger=trigger, why=why)
            decided = step(obs, settings, state, now, global_dry_run=self.ctx.dry(policy))
            resumed = self.ctx.executor.resume(obs, state, event_id, now)
            decision = resumed or self.ctx.executor.execute(decided, obs, state)
        self.finish([decision], policy)
        return decision

    # ---- reconcile path ----

    def reconcile(
        self, tick: ScheduleTick, policy: FleetPolicy, now: datetime
    ) -> tuple[list[Decision], list[Notification]]:
        """Every managed group: finish a change left in progress, else decide (bounds and windows, work
        waiting for it, alarms still firing, the GPU target band) and act; and what the demand path must
        tell (work that fits no group, nodes never GPU-ready). One group's failure never stops the others."""
        managed = self.ctx.managed(policy)
        if not managed:
            return [], []
        states = self.ctx.states([obs for obs, _ in managed], policy)
        watch_owners(self.ctx, [obs for obs, _ in managed], states, now)
        tracked = [obs.ref for obs, s in managed if s.target.enabled]
        utils = self.metrics.group_utilization(tracked, now, policy.metric_lookback_s) if tracked else {}
        firing, alarm_metrics, conditions = firing_alarms(self.alarms, tick, policy, self.ctx.logger)

        def decide(obs: GroupObservation, settings: GroupSettings) -> Decision:
            alarms = firing.get(obs.ref.key, ())
            dry = self.ctx.dry(policy)
            state = states[obs.ref.key]
            return decide_reconcile(
                obs, settings, state, now, event_id=tick.event_id, firing_alarms=alarms, global_dry_run=dry
            )

        def isolated(obs: GroupObservation, settings: GroupSettings) -> Decision:
            return _isolated(decide, obs, settings, self.ctx.logger, tick.event_id, now)

        pairs = [(obs.model_copy(update={"gpu_utilization": utils.get(obs.ref.key)}), s) for obs, s in managed]
        told: list[Notification] = []
        if self.demand is not None:
            pairs, told = _attached(self.demand, self.ctx.logger, pairs, now, policy, self.ctx.region)
        first = [isolated(obs, s) for obs, s in pairs]
        read = (alarm_metrics, conditions)
        doubted = checked_series(self, pairs, first, read, isolated, tick.event_id, now, policy)
        want = [i for i, d in enumerate(first) if d.needs_instance_metrics]
        if want:
            enriched = _metrics_or_none(self.metrics, [pairs[i][0] for i in want], now, policy, self.ctx)
            for i, obs in zip(want, enriched, strict=True):
                if obs is None:  # without the metrics no victim can be told idle: this group holds
                    first[i] = _held_without_metrics(first[i])
                    continue
                pairs[i] = (obs, pairs[i][1])
                first[i] = isolated(obs, pairs[i][1])
        acted = [
            _act(self.ctx, d, obs, states[obs.ref.key], tick.event_id, now)
            for d, (obs, _) in zip(first, pairs, strict=True)
        ]
        return acted, told + doubted

    def with_demand(
        self, obs: GroupObservation, settings: GroupSettings, now: datetime, policy: FleetPolicy
    ) -> GroupObservation:
        """The group with its demand attached, for another controller's scale-in (the spot fallback's
        hand-back): nodes running work are marked and a source that cannot say closes scale-in, as for the
        scaler's own."""
        if self.demand is None or settings.demand is None:
            return obs
        return _attached(self.demand, self.ctx.logger, [(obs, settings)], now, policy, self.ctx.region)[0][0][0]

    def carry_out(self, decision: Decision, obs: GroupObservation, state: GroupState) -> Decision:
        """A change decided by another controller (the spot fallback) carried out like the scaler's own:
        a change left in progress on that group is finished first. The caller records and tells."""
        return self.ctx.executor.resume(obs, state, decision.event_id, decision.at) or self.ctx.executor.execute(
            decision, obs, state
        )


def series_verdicts(
    metrics: GpuMetricsReader,
    logger: Logger,
    wanted: dict[str, tuple[GroupObservation, schema.Metric]],
    now: datetime,
    policy: FleetPolicy,
) -> dict[str, Verdict]:
    """The series these groups' decisions would act on, checked; a read that fails holds them."""
    try:
        rate, window = policy.node_samples_per_gpu_s, policy.node_window_s
        return trust_reads.verdicts(metrics, wanted, now, policy.metric_lookback_s, rate, window)
    except Exception as exc:
        logger.exception("GPU series could not be checked; those groups hold", extra={"n": len(wanted)})
        why = f"the GPU series could not be checked ({type(exc).__name__}: {exc})"
        return {key: Verdict(held=why, source="none", tell=True) for key in wanted}


def checked_series(
    scaler: Scaler,
    pairs: list[tuple[GroupObservation, GroupSettings]],
    first: list[Decision],
    alarms_read: tuple[dict[str, tuple[MetricRef, ...]], dict[str, AlarmCondition | None]],
    isolated: Callable[[GroupObservation, GroupSettings], Decision],
    event_id: str,
    now: datetime,
    policy: FleetPolicy,
) -> list[Notification]:
    """Decisions that would act on a group's GPU series (the band, an alarm on it) act only on a series
    its members could have written (`metric_trust`): the band then decides on the checked mean (the
    members' own where the group series fails), an alarm as `alarm_checked` says; an alarm whose
    statistic one datum can set holds. Updates `pairs` and `first` in place; returns what to tell. Ticks
    where nothing would act read nothing more."""
    alarm_metrics, conditions = alarms_read
    wanted: dict[str, tuple[GroupObservation, schema.Metric]] = {}
    for i, ((obs, _), d) in enumerate(zip(pairs, first, strict=True)):
        bad_stat = _bad_statistic(d, alarm_metrics)
        if bad_stat is not None:
            first[i] = hold(d, bad_stat)
            continue
        metric = series_acted_on(d, obs.ref, alarm_metrics) or series_audited(d, now.minute)
        if metric is not None:
            wanted[obs.ref.key] = (obs, metric)
    verdicts = series_verdicts(scaler.metrics, scaler.ctx.logger, wanted, now, policy) if wanted else {}
    told = []
    for i, ((obs, settings), d) in enumerate(zip(pairs, first, strict=True)):
        verdict = verdicts.get(obs.ref.key)
        if verdict is None:
            continue
        if verdict.tell:
            told.append(forged_series_note(obs.ref.key, verdict, now, event_id, scaler.ctx.region))
        if d.trigger.kind is not TriggerKind.UTILIZATION_BAND:
            first[i] = alarm_checked(d, verdict, conditions.get(d.trigger.name or ""))
        elif verdict.held is not None:
            first[i] = doubted(d, verdict)
        else:
            pairs[i] = (obs.model_copy(update={"gpu_utilization": verdict.utilization}), settings)
            again = isolated(*pairs[i])
            if verdict.note:
                again = again.model_copy(update={"reason": f"{again.reason} [{verdict.note}]"})
            unchecked = again.trigger.kind is TriggerKind.ALARM and (
                series_acted_on(again, obs.ref, alarm_metrics) or _bad_statistic(again, alarm_metrics)
            )
            first[i] = hold(again, "its alarm's series was not checked this tick") if unchecked else again
    return told


def alarm_series_checked(
    scaler: Scaler, decision: Decision, alarm: AlarmEvent, obs: GroupObservation, now: datetime, policy: FleetPolicy
) -> tuple[Decision, list[Notification]]:
    """An alarm on the group's own GPU series acts only if that series passes the check (`metric_trust`),
    and only with a statistic the check holds down (Average); where only the members' own series pass,
    their mean is weighed against the alarm's threshold (one DescribeAlarms, on those deliveries alone).
    A read that fails raises: the delivery is retried (its idempotency record is released), never
    decided as a hold for good."""
    bad_stat = _bad_statistic(decision, {alarm.alarm_name: alarm.metrics})
    if bad_stat is not None:
        return hold(decision, bad_stat), []
    metric = series_acted_on(decision, obs.ref, {alarm.alarm_name: alarm.metrics})
    if metric is None:
        return decision, []
    wanted = {obs.ref.key: (obs, metric)}
    if not alarm.described:  # an EventBridge delivery: no threshold or range in it (SNS and actions were re-read)
        found = scaler.alarms.describe(alarm.alarm_name)
        alarm = alarm.model_copy(update={"condition": described_condition(found), "range_s": alarm_range_s(found)})
    # The alarm may look further back than the policy's lookback (10 periods of 60 s): check all it read.
    lookback = max(policy.metric_lookback_s, alarm.range_s)
    rate = policy.node_samples_per_gpu_s
    verdict = trust_reads.verdicts(scaler.metrics, wanted, now, lookback, rate, policy.node_window_s)[obs.ref.key]
    told = [forged_series_note(obs.ref.key, verdict, now, alarm.event_id, scaler.ctx.region)] if verdict.tell else []
    weigh = not verdict.from_group and verdict.trusted
    condition = alarm.condition if weigh else None
    return alarm_checked(decision, verdict, condition), told


def _bad_statistic(decision: Decision, alarm_metrics: dict[str, tuple[MetricRef, ...]]) -> str | None:
    """Why an alarm's scale step cannot act on the statistic it reads (`statistic_problem`), or None."""
    if decision.action not in (Action.SCALE_OUT, Action.SCALE_IN) or decision.trigger.kind is not TriggerKind.ALARM:
        return None
    return statistic_problem(alarm_metrics.get(decision.trigger.name or "", ()))


def as_cloudwatch_says_now(alarms: AlarmReader, alarm: AlarmEvent) -> AlarmEvent | str:
    """SNS and the alarm action are not proof of anything: anyone allowed to publish or invoke can send
    them. The delivery only names an alarm; DescribeAlarms says what it is (ARN, metrics, state), and
    the scaler acts only if CloudWatch still has it in the delivered state with its actions enabled.
    EventBridge events with an aws.* source cannot be put by anyone but AWS: taken as delivered."""
    if alarm.source not in RE_READ:
        return alarm
    described = alarms.describe(alarm.alarm_name)
    via = f"alarm {alarm.alarm_name} delivered by {RE_READ[alarm.source]}"
    if described is None:
        return f"{via} does not exist in CloudWatch: no action"
    said = as_cloudwatch_says(described, alarm)
    if said.actions_suppressed_by or said.muted_by:  # the decision holds and says why
        return said
    if said.state is not alarm.state or not described.get("ActionsEnabled", True):
        enabled = described.get("ActionsEnabled")
        return f"{via} is {said.state} in CloudWatch now (actions enabled: {enabled}): no action"
    return said


def _by(alarm: AlarmEvent) -> Trigger:
    return Trigger(kind=TriggerKind.ALARM, name=alarm.alarm_name)


def _shown(d: Decision) -> dict[str, Any]:
    return d.model_dump(mode="json", exclude={"bounds", "needs_instance_metrics", "skipped"})


def _no_action(
    group: str, trigger: Trigger, event_id: str, now: datetime, reason: str, cannot_act: bool = False
) -> Decision:
    """A hold with its reason; `cannot_act`: the alarm is gpufleet's but its target is missing or unknown
    (a broken alarm, told to on-call instead of failing silently)."""
    return Decision(
        group=group,
        action=Action.HOLD,
        current=0,
        desired=0,
        reason=reason,
        trigger=trigger,
        event_id=event_id,
        at=now,
        outcome=Outcome.NOT_NEEDED,
        detail=CANNOT_ACT if cannot_act else "",
    )


def with_instance_metrics(
    metrics: GpuMetricsReader,
    observations: list[GroupObservation],
    now: datetime,
    policy: FleetPolicy,
    fleet: FleetReader,
) -> list[GroupObservation]:
    """The groups with their instances' GPU metrics and what their adapter says of which nodes run work
    (HyperPod: Slurm's idle report, read only now, when a scale-in is weighed, and only for the nodes
    whose GPUs read idle: no other can be a victim): victims are chosen from nothing less."""
    ids = [i.instance_id for obs in observations for i in obs.instances]
    gpu = metrics.instance_gpu(ids, now, policy.metric_lookback_s) if ids else {}

    def enrich(inst: InstanceObservation) -> InstanceObservation:
        util, mem = gpu.get(inst.instance_id, (None, None))
        return inst.model_copy(update={"gpu_utilization": util, "gpu_memory_percent": mem})

    enriched = [
        obs.model_copy(update={"instances": tuple(enrich(i) for i in obs.instances), "instance_metrics_loaded": True})
        for obs in observations
    ]
    return fleet.work_marks(enriched, now, idle_candidates(enriched, policy))


def idle_candidates(observations: list[GroupObservation], policy: FleetPolicy) -> dict[str, set[str]]:
    """Per group key, the nodes that could be victims now: GPUs idle by the group's own idle thresholds
    (the settings the core chooses victims by), in service, not protected, not known to run work. The
    adapter's word on which nodes run work is read for these only; any other node is never a victim."""
    out: dict[str, set[str]] = {}
    for obs in observations:
        idle = (policy.settings_for(obs.ref, obs.tags) or policy.defaults).idle
        out[obs.ref.key] = {i.instance_id for i in obs.instances if skip_reason(i, idle) is None}
    return out


def firing_alarms(
    alarms: AlarmReader, tick: ScheduleTick, policy: FleetPolicy, logger: Logger
) -> tuple[dict[str, list[tuple[str, Direction]]], dict[str, tuple[MetricRef, ...]], dict[str, AlarmCondition | None]]:
    """Alarms still in ALARM send no new event; the tick re-raises them (cooldowns decide). Also each
    alarm's metrics and threshold: an alarm on a group's GPU series is checked before it acts."""
    out: dict[str, list[tuple[str, Direction]]] = defaultdict(list)
    metrics: dict[str, tuple[MetricRef, ...]] = {}
    conditions: dict[str, AlarmCondition | None] = {}
    for described in alarms.firing(policy.alarm_prefix):
        alarm = from_described_alarm(described, tick)
        target = resolve_alarm_target(alarm, alarms.tags(alarm.alarm_arn), policy)
        if target.group is not None and target.direction is not None and not alarm.actions_suppressed_by:
            out[target.group.key].append((alarm.alarm_name, target.direction))
            metrics[alarm.alarm_name] = alarm.metrics
            conditions[alarm.alarm_name] = alarm.condition
        else:
            logger.info("firing alarm ignored", extra={"alarm": alarm.alarm_name, "why": target.found_by})
    return out, metrics, conditions


def _attached(
    reader: DemandReader,
    logger: Logger,
    pairs: list[tuple[GroupObservation, GroupSettings]],
    now: datetime,
    policy: FleetPolicy,
    region: str,
) -> tuple[list[tuple[GroupObservation, GroupSettings]], list[Notification]]:
    """Every group's demand, and what it must tell. The reader isolates its sources; should it fail as a
    whole, the groups with a source are closed for scale-in and the others decide as they would."""
    try:
        attached = reader.attach(pairs, now, spot_fallbacks(policy))
    except Exception:
        logger.exception("demand reader failed; groups with a source fail closed")
        closed = Demand(source="demand", unreadable="the demand reader failed")
        return [(o.model_copy(update={"demand": closed}) if s.demand else o, s) for o, s in pairs], []
    try:
        return attached, demand_notes([obs for obs, _ in attached], now, region)
    except Exception:
        logger.exception("demand findings could not be told this tick")
        return attached, []


def _act(
    ctx: ControlContext, decision: Decision, obs: GroupObservation, state: GroupState, event_id: str, now: datetime
) -> Decision:
    """Finish a change left in progress, or carry out this decision; an error is this group's alone."""
    try:
        return ctx.executor.resume(obs, state, event_id, now) or ctx.executor.execute(decision, obs, state)
    except Exception as exc:
        ctx.logger.exception("group failed; the others carry on", extra={"group": obs.ref.key})
        return decision.model_copy(update={"outcome": Outcome.FAILED, "detail": f"{type(exc).__name__}: {exc}"})


def _isolated(
    decide: Callable[[GroupObservation, GroupSettings], Decision],
    obs: GroupObservation,
    settings: GroupSettings,
    logger: Logger,
    event_id: str,
    now: datetime,
) -> Decision:
    """One group's decision; whatever it raises is this group's alone and the tick goes on."""
    try:
        return decide(obs, settings)
    except Exception as exc:
        logger.exception("group decision failed; the others carry on", extra={"group": obs.ref.key})
        return _no_action(obs.ref.key, _RECONCILE, event_id, now, f"no decision: {type(exc).__name__}: {exc}")


def _metrics_or_none(
    metrics: GpuMetricsReader,
    observations: list[GroupObservation],
    now: datetime,
    policy: FleetPolicy,
    ctx: ControlContext,
) -> list[GroupObservation | None]:
    """The groups with their instances' GPU metrics, or None each when those cannot be read."""
    try:
        return list(with_instance_metrics(metrics, observations, now, policy, ctx.fleet))
    except Exception:
        ctx.logger.exception("instance metrics unreadable; scale-in waits", extra={"groups": len(observations)})
        return [None] * len(observations)


def _held_without_metrics(decision: Decision) -> Decision:
    reason = f"{decision.reason}, but the instances' GPU metrics cannot be read: none removed"
    return decision.model_copy(update={"action": Action.HOLD, "needs_instance_metrics": False, "reason": reason})


def spot_fallbacks(policy: FleetPolicy) -> frozenset[str]:
    """Keys of the groups that are another group's on-demand fallback: they share a backlog after it."""
    out = set()
    for spot in policy.spot.groups:
        if spot.fallback is not None:
            try:
                out.add(GroupRef.parse_key(spot.fallback.group).key)
            except ValueError:
                out.add(spot.fallback.group)
    return frozenset(out)
