"""The scaler's glue: typed event -> observe -> load state -> decide (`scaling.core`) -> execute
(`scaling.execution`) -> audit -> notify. No rules live here.

`Scaler.handle` takes a raw Lambda event and `now`; the handler passes the real clock, the rehearsal a
simulated one. Every decision, acted or not, is logged, counted and audited.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.aws.alarms import AlarmReader
from gpufleet.aws.busy_marks import BusyMarks
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
from gpufleet.scaling.busy_protection import keep_busy_protected
from gpufleet.scaling.core import decide_alarm, decide_reconcile, decide_request, skip_reason
from gpufleet.scaling.demand_source import DemandReader
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.metric_trust import Verdict, alarm_checked, hold, series_acted_on
from gpufleet.scaling.needs import AlarmsRead, Need, Weighed, bad_statistic
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
    """The scaler's paths: an alarm delivery, a reconcile tick (`ReconcileTick` weighs its groups), and
    another controller's request or change (the OOM guard, the spot fallback).

    Long because every path enters and finishes here, on the same reads and the same executor: split by
    path, each part would carry the others' wiring back.
    """

    ctx: ControlContext
    metrics: GpuMetricsReader
    alarms: AlarmReader
    # Wraps `process` with Powertools Idempotency keyed on the event's id (None: off).
    idempotent: Callable[[Process], Process] | None = None
    # Reads the groups' demand sources (waiting pods, queues, backlog metrics); None: utilization rules only.
    demand: DemandReader | None = None
    # The queue workers' busy marks, kept as scale-in protection each tick (None: not kept here).
    busy: BusyMarks | None = None
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
        if alarm.state is AlarmState.ALARM and target.direction is Direction.IN:
            obs = with_instance_metrics(self.metrics, [obs], now, policy, self.ctx.fleet)[0]
            obs = self.with_demand(obs, settings, now, policy)  # no scale-in while work waits or runs
        dry = self.ctx.dry(policy)
        decision = decide_alarm(obs, settings, state, now, alarm=alarm, direction=target.direction, global_dry_run=dry)
        decision = decision.model_copy(update={"reason": f"{decision.reason} [{target.found_by}]"})
        decision, told = self.alarm_series_checked(decision, alarm, obs, now, policy)
        return self.ctx.executor.act(decision, obs, state, alarm.event_id, now), told

    def alarm_series_checked(
        self, decision: Decision, alarm: AlarmEvent, obs: GroupObservation, now: datetime, policy: FleetPolicy
    ) -> tuple[Decision, list[Notification]]:
        """An alarm on the group's own GPU series acts only if that series passes the check (`metric_trust`),
        and only with a statistic the check holds down (Average); where only the members' own series pass,
        their mean is weighed against the alarm's threshold (one DescribeAlarms, on those deliveries alone).
        A read that fails raises: the delivery is retried (its idempotency record is released), never
        decided as a hold for good."""
        bad_stat = bad_statistic(decision, {alarm.alarm_name: alarm.metrics})
        if bad_stat is not None:
            return hold(decision, bad_stat), []
        metric = series_acted_on(decision, obs.ref, {alarm.alarm_name: alarm.metrics})
        if metric is None:
            return decision, []
        wanted = {obs.ref.key: (obs, metric)}
        if not alarm.described:  # an EventBridge delivery: no threshold or range in it (SNS and actions were re-read)
            found = self.alarms.describe(alarm.alarm_name)
            alarm = alarm.model_copy(update={"condition": described_condition(found), "range_s": alarm_range_s(found)})
        # The alarm may look further back than the policy's lookback (10 periods of 60 s): check all it read.
        lookback = max(policy.metric_lookback_s, alarm.range_s)
        rate = policy.node_samples_per_gpu_s
        verdict = trust_reads.verdicts(self.metrics, wanted, now, lookback, rate, policy.node_window_s)[obs.ref.key]
        told = [forged_series_note(obs.ref.key, verdict, now, alarm.event_id, self.ctx.region)] if verdict.tell else []
        weigh = not verdict.from_group and verdict.trusted
        condition = alarm.condition if weigh else None
        return alarm_checked(decision, verdict, condition), told

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
            decision = self.ctx.executor.act(decided, obs, state, event_id, now)
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
        told: list[Notification] = []
        if self.busy is not None:
            managed, told = keep_busy_protected(
                self.busy, self.ctx.fleet.groups, managed, now, self.ctx.region, self.ctx.logger
            )
        states = self.ctx.states([obs for obs, _ in managed], policy)
        watch_owners(self.ctx, [obs for obs, _ in managed], states, now)
        tracked = [obs.ref for obs, s in managed if s.target.enabled]
        utils = self.metrics.group_utilization(tracked, now, policy.metric_lookback_s) if tracked else {}
        firing, alarm_metrics, conditions = firing_alarms(self.alarms, tick, policy, self.ctx.logger)
        pairs = [(obs.model_copy(update={"gpu_utilization": utils.get(obs.ref.key)}), s) for obs, s in managed]
        if self.demand is not None:
            pairs, attached = _attached(self.demand, self.ctx.logger, pairs, now, policy, self.ctx.region)
            told += attached
        alarms = AlarmsRead(metrics=alarm_metrics, conditions=conditions)
        weighed, doubted = ReconcileTick(self, tick, policy, now, states, firing, alarms).weigh(pairs)
        acted = [_act(self.ctx, w.decision, w.obs, states[w.obs.ref.key], tick.event_id, now) for w in weighed]
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
        return self.ctx.executor.act(decision, obs, state, decision.event_id, decision.at)


@dataclass(frozen=True)
class ReconcileTick:
    """One reconcile tick's needs loop: each group decided on what the tick read for all of them, then
    each read a decision lacks (`scaling.needs`) made once for every group that lacks it, and those
    groups decided again. What the tick read stays here, so no list is changed in place."""

    scaler: Scaler
    tick: ScheduleTick
    policy: FleetPolicy
    now: datetime
    states: Mapping[str, GroupState]
    firing: Mapping[str, Sequence[tuple[str, Direction]]]
    alarms: AlarmsRead

    def weigh(
        self, pairs: Sequence[tuple[GroupObservation, GroupSettings]]
    ) -> tuple[list[Weighed], list[Notification]]:
        """Every group decided, then for each need in order (`Need`) the groups that lack it fetched in one
        read and decided again; and what the series check must tell. Ticks where nothing lacks a read read
        nothing more."""
        weighed = [Weighed(obs, s, self.decide(obs, s)).screened(self.alarms) for obs, s in pairs]
        told: list[Notification] = []
        for need in Need:
            lacking = [i for i, w in enumerate(weighed) if w.lacks(need, self.alarms, self.now.minute)]
            if not lacking:
                continue
            answered, said = self.fetched(need, [weighed[i] for i in lacking])
            again = dict(zip(lacking, answered, strict=True))
            weighed = [again.get(i, w) for i, w in enumerate(weighed)]
            told += said
        return weighed, told

    def fetched(self, need: Need, lacking: list[Weighed]) -> tuple[list[Weighed], list[Notification]]:
        """The groups that lack `need`, given it in one read and decided again."""
        if need is Need.SERIES:
            return self.series_checked(lacking)
        ctx = self.scaler.ctx
        enriched = _metrics_or_none(self.scaler.metrics, [w.obs for w in lacking], self.now, self.policy, ctx)
        return [w.loaded(obs, self.decide) for w, obs in zip(lacking, enriched, strict=True)], []

    def series_checked(self, lacking: list[Weighed]) -> tuple[list[Weighed], list[Notification]]:
        """Decisions that would act on a group's GPU series (the band, an alarm on it), or audit it, act
        only on a series its members could have written (`metric_trust`); and what to tell."""
        wanted: dict[str, tuple[GroupObservation, schema.Metric]] = {}
        for w in lacking:
            metric = w.series_lacked(self.alarms, self.now.minute)
            if metric is not None:
                wanted[w.obs.ref.key] = (w.obs, metric)
        ctx = self.scaler.ctx
        verdicts = series_verdicts(self.scaler.metrics, ctx.logger, wanted, self.now, self.policy)
        out, told = [], []
        for w in lacking:
            verdict = verdicts.get(w.obs.ref.key)
            if verdict is None:
                out.append(w)
                continue
            if verdict.tell:
                told.append(forged_series_note(w.obs.ref.key, verdict, self.now, self.tick.event_id, ctx.region))
            out.append(w.checked(verdict, self.alarms, self.decide))
        return out, told

    def decide(self, obs: GroupObservation, settings: GroupSettings) -> Decision:
        """One group's decision; whatever it raises is this group's alone and the tick goes on."""
        ctx = self.scaler.ctx
        try:
            return decide_reconcile(
                obs,
                settings,
                self.states[obs.ref.key],
                self.now,
                event_id=self.tick.event_id,
                firing_alarms=self.firing.get(obs.ref.key, ()),
                global_dry_run=ctx.dry(self.policy),
            )
        except Exception as exc:
            ctx.logger.exception("group decision failed; the others carry on", extra={"group": obs.ref.key})
            why = f"no decision: {type(exc).__name__}: {exc}"
            return _no_action(obs.ref.key, _RECONCILE, self.tick.event_id, self.now, why)


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
        return ctx.executor.act(decision, obs, state, event_id, now)
    except Exception as exc:
        ctx.logger.exception("group failed; the others carry on", extra={"group": obs.ref.key})
        return decision.model_copy(update={"outcome": Outcome.FAILED, "detail": f"{type(exc).__name__}: {exc}"})


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
