"""The reconcile tick's needs (scaling.needs): what a decision lacks, in the order the reads come, and
what each answer makes of it. The scaler's loop over them is shown on moto (test_scaler_moto.py,
test_forged_metrics_moto.py); here, the rules alone."""

from __future__ import annotations

from datetime import UTC, datetime

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    AlarmCondition,
    Decision,
    GroupObservation,
    GroupRef,
    MetricRef,
    Trigger,
    TriggerKind,
)
from gpufleet.policy.fleet import GroupSettings
from gpufleet.scaling.metric_trust import Verdict
from gpufleet.scaling.needs import AlarmsRead, Need, Weighed
from gpufleet_node import schema

NOW = datetime(2026, 11, 26, 8, 13, tzinfo=UTC)
REF = GroupRef(kind=GroupKind.ASG, name="infer")
OBS = GroupObservation(ref=REF, min_size=0, max_size=8, desired=3, gpu_utilization=10.0)
SETTINGS = GroupSettings()
ON_SERIES = MetricRef(namespace=schema.NAMESPACE, name="GPUUtilization", dimensions=REF.metric_dimensions)
NO_ALARMS = AlarmsRead(metrics={}, conditions={})


def _decision(action: Action, kind: TriggerKind, name: str = "", needs: bool = False) -> Decision:
    return Decision(
        group=REF.key, action=action, current=3, desired=3, reason="r", trigger=Trigger(kind=kind, name=name),
        event_id="e", at=NOW, needs_instance_metrics=needs,
    )  # fmt: skip


def _weighed(decision: Decision) -> Weighed:
    return Weighed(OBS, SETTINGS, decision)


def test_a_band_scale_in_lacks_its_series_first_then_its_nodes_metrics() -> None:
    w = _weighed(_decision(Action.SCALE_IN, TriggerKind.UTILIZATION_BAND, needs=True))
    assert [n for n in Need if w.lacks(n, NO_ALARMS, NOW.minute)] == [Need.SERIES, Need.INSTANCE_METRICS]
    assert list(Need) == [Need.SERIES, Need.INSTANCE_METRICS]  # the series verdict can unmake the scale-in


def test_a_hold_inside_the_band_lacks_its_series_on_an_audit_minute_only() -> None:
    w = _weighed(_decision(Action.HOLD, TriggerKind.UTILIZATION_BAND))
    assert not w.lacks(Need.SERIES, NO_ALARMS, 13) and w.lacks(Need.SERIES, NO_ALARMS, 10)
    assert not w.lacks(Need.INSTANCE_METRICS, NO_ALARMS, 10)


def test_an_alarm_on_a_statistic_one_datum_sets_holds_before_any_read() -> None:
    alarms = AlarmsRead(metrics={"a": (ON_SERIES.model_copy(update={"stat": "Maximum"}),)}, conditions={})
    w = _weighed(_decision(Action.SCALE_OUT, TriggerKind.ALARM, "a")).screened(alarms)
    assert w.decision.action is Action.HOLD and "statistic Maximum" in w.decision.reason
    assert not any(w.lacks(n, alarms, NOW.minute) for n in Need)


def test_the_band_decides_again_on_the_checked_mean_saying_whose() -> None:
    seen: list[float | None] = []

    def decide(obs: GroupObservation, settings: GroupSettings) -> Decision:
        seen.append(obs.gpu_utilization)
        return _decision(Action.HOLD, TriggerKind.UTILIZATION_BAND)

    w = _weighed(_decision(Action.SCALE_IN, TriggerKind.UTILIZATION_BAND, needs=True))
    checked = w.checked(Verdict(utilization=55.0, note="members' own"), NO_ALARMS, decide)
    assert seen == [55.0] and checked.obs.gpu_utilization == 55.0
    assert checked.decision.reason == "r [members' own]" and not checked.decision.needs_instance_metrics


def test_a_held_series_holds_the_band_without_deciding_again() -> None:
    def decide(obs: GroupObservation, settings: GroupSettings) -> Decision:
        raise AssertionError("not decided again")

    w = _weighed(_decision(Action.SCALE_IN, TriggerKind.UTILIZATION_BAND, needs=True))
    checked = w.checked(Verdict(held="forged"), NO_ALARMS, decide)
    assert checked.decision.action is Action.HOLD and "forged" in checked.decision.reason
    assert checked.obs is OBS


def test_an_alarm_acts_on_the_members_mean_only_on_its_side_of_the_threshold() -> None:
    condition = AlarmCondition(threshold=20.0, comparison="LessThanThreshold")
    alarms = AlarmsRead(metrics={"low": (ON_SERIES,)}, conditions={"low": condition})
    w = _weighed(_decision(Action.SCALE_IN, TriggerKind.ALARM, "low", needs=True))
    members = Verdict(utilization=50.0, dropped=("over the bound",), note="members' own")
    checked = w.checked(members, alarms, lambda o, s: w.decision)
    assert checked.decision.action is Action.HOLD and "is not LessThanThreshold 20" in checked.decision.reason


def test_nodes_metrics_that_cannot_be_read_hold_the_scale_in() -> None:
    w = _weighed(_decision(Action.SCALE_IN, TriggerKind.UTILIZATION_BAND, needs=True))
    held = w.loaded(None, lambda o, s: w.decision)
    assert held.decision.action is Action.HOLD and "cannot be read: none removed" in held.decision.reason
    loaded = OBS.model_copy(update={"instance_metrics_loaded": True})
    assert w.loaded(loaded, lambda o, s: _decision(Action.HOLD, TriggerKind.UTILIZATION_BAND)).obs is loaded
