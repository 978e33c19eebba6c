"""What a reconcile decision still lacks, and what each answer makes of it (pure).

The scaler decides every group on what the tick reads for all of them: utilization, alarms, demand and
state. A decision may lack one of two more reads. The scaler makes each read once, for every group that
lacks it, and decides those groups again:
- SERIES: the decision would act on a GPU series any node may write (the band, an alarm on the group's
  series), or holds on the band on an audit minute. The series is checked first (`metric_trust`).
- INSTANCE_METRICS: the decision is a scale-in that must choose victims. It needs its nodes' GPU metrics
  and the adapter's word on which nodes run work (HyperPod: Slurm's report).
They come in that order. A series verdict can make or unmake a scale-in, because the band decides again
on the checked mean. So the nodes' metrics are read only for the decisions that still need them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum

from gpufleet.domain.models import Action, AlarmCondition, Decision, GroupObservation, MetricRef, TriggerKind
from gpufleet.policy.fleet import GroupSettings
from gpufleet.scaling.metric_trust import (
    Verdict,
    alarm_checked,
    doubted,
    hold,
    series_acted_on,
    series_audited,
    statistic_problem,
)
from gpufleet_node import schema

Decide = Callable[[GroupObservation, GroupSettings], Decision]


class Need(Enum):
    """A read a decision may lack, in the order the scaler makes them."""

    SERIES = "the GPU series it acts on, checked"
    INSTANCE_METRICS = "its nodes' GPU metrics and work marks"


@dataclass(frozen=True)
class AlarmsRead:
    """What the tick read of the alarms still firing: each one's metrics and its threshold. An alarm on
    a group's GPU series is checked before it acts."""

    metrics: Mapping[str, Sequence[MetricRef]]
    conditions: Mapping[str, AlarmCondition | None]


def bad_statistic(decision: Decision, alarm_metrics: Mapping[str, Sequence[MetricRef]]) -> str | None:
    """Why an alarm's scale step cannot act on the statistic it reads (`statistic_problem`), or None."""
    if decision.action not in (Action.SCALE_OUT, Action.SCALE_IN) or decision.trigger.kind is not TriggerKind.ALARM:
        return None
    return statistic_problem(alarm_metrics.get(decision.trigger.name or "", ()))


def held_without_metrics(decision: Decision) -> Decision:
    """A scale-in whose nodes' metrics cannot be read: no victim can be told idle, so the group holds."""
    reason = f"{decision.reason}, but the instances' GPU metrics cannot be read: none removed"
    return decision.model_copy(update={"action": Action.HOLD, "needs_instance_metrics": False, "reason": reason})


@dataclass(frozen=True)
class Weighed:
    """One group as the tick weighs it: its observation (richer as reads arrive), its settings, and its
    decision so far."""

    obs: GroupObservation
    settings: GroupSettings
    decision: Decision

    def screened(self, alarms: AlarmsRead) -> Weighed:
        """An alarm's scale step on a statistic one datum can set holds at once: no read can save it."""
        bad = bad_statistic(self.decision, alarms.metrics)
        return self if bad is None else replace(self, decision=hold(self.decision, bad))

    def series_lacked(self, alarms: AlarmsRead, minute: int) -> schema.Metric | None:
        """The GPU series the decision acts on, or audits this minute; None: it lacks no series check."""
        return series_acted_on(self.decision, self.obs.ref, alarms.metrics) or series_audited(self.decision, minute)

    def lacks(self, need: Need, alarms: AlarmsRead, minute: int) -> bool:
        if need is Need.SERIES:
            return self.series_lacked(alarms, minute) is not None
        return self.decision.needs_instance_metrics

    def checked(self, verdict: Verdict, alarms: AlarmsRead, decide: Decide) -> Weighed:
        """The decision against its series' verdict. An alarm's acts as `alarm_checked` says. The band's
        holds when the series cannot be believed; else the band decides again on the checked mean (the
        members' own where the group series fails). That new decision holds if it turns out to act on an
        alarm's series, which was not checked this tick."""
        d = self.decision
        if d.trigger.kind is not TriggerKind.UTILIZATION_BAND:
            return replace(self, decision=alarm_checked(d, verdict, alarms.conditions.get(d.trigger.name or "")))
        if verdict.held is not None:
            return replace(self, decision=doubted(d, verdict))
        obs = self.obs.model_copy(update={"gpu_utilization": verdict.utilization})
        again = decide(obs, self.settings)
        if verdict.note:
            again = again.model_copy(update={"reason": f"{again.reason} [{verdict.note}]"})
        unchecked = again.trigger.kind is TriggerKind.ALARM and (
            series_acted_on(again, obs.ref, alarms.metrics) or bad_statistic(again, alarms.metrics)
        )
        if unchecked:
            again = hold(again, "its alarm's series was not checked this tick")
        return Weighed(obs, self.settings, again)

    def loaded(self, obs: GroupObservation | None, decide: Decide) -> Weighed:
        """The group decided again with its nodes' metrics (`obs`); None: they could not be read, it holds."""
        if obs is None:
            return replace(self, decision=held_without_metrics(self.decision))
        return Weighed(obs, self.settings, decide(obs, self.settings))
