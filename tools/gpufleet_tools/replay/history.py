"""What gpufleet's policy would have done on a real group, from its CloudWatch history (pure: the
service reads the series, this replays them).

Two readings of the same minutes, both through `scaling.core.decide_reconcile`:
- on the group as it was (open loop): each minute the core sees what the scaler would have read then
  (the group's in-service count, its GPU utilization over the lookback, each instance's busiest GPU and
  memory over the lookback); cooldowns count its own would-be changes. This tells when it would have
  scaled, which idle nodes it would have removed (and for how long they then stayed idle: node-hours
  reclaimed), and how often every node was busy so it would have refused to remove one. Nodes the group
  really removed while busy are counted from the instance series (a series that stops while busy).
- with its own capacity (closed loop): the work of each minute (utilization x in-service GPUs, in
  GPU-equivalents) is replayed on the capacity gpufleet would have kept, nodes joining after the boot
  delay; node-hours and the GPU-minutes the work would have been short are totals of that run. Which
  nodes would have been idle there is estimated from the real group: as many nodes are busy as were
  really busy (or the work needs, if more).
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from datetime import datetime, timedelta
from statistics import fmean

from gpufleet.domain.models import (
    Action,
    Decision,
    Frozen,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    SkipReason,
)
from gpufleet.policy.fleet import GroupSettings
from gpufleet.scaling.core import decide_reconcile, skip_reason


class InstanceSeries(Frozen):
    """One instance's per-minute busiest-GPU utilization and fullest-GPU memory (None: no datapoint)."""

    instance_id: str
    utilization: tuple[float | None, ...]
    memory: tuple[float | None, ...]


class History(Frozen):
    """A group's minutes as CloudWatch kept them, aligned on `start` (one value per minute)."""

    group: GroupRef
    start: datetime
    gpu_utilization: tuple[float | None, ...]
    in_service: tuple[int | None, ...]
    instances: tuple[InstanceSeries, ...] = ()
    min_size: int = 0
    max_size: int = 1000
    # What CloudWatch (or Auto Scaling) had nothing for in the window, each with what that leaves empty:
    # said in the report, so a 0 there reads as "no data", not as "nothing happened".
    missing: tuple[str, ...] = ()

    @property
    def minutes(self) -> int:
        return len(self.gpu_utilization)


class HistoryReport(Frozen):
    group: str
    minutes: int
    actual_node_hours: float
    actual_changes: int
    gpufleet_node_hours: float
    gpufleet_scale_outs: int
    gpufleet_scale_ins: int
    short_gpu_minutes: float
    idle_node_hours: float
    idle_node_hours_reclaimed: float
    busy_refusals: int
    busy_nodes_removed_by_group: int
    missing: tuple[str, ...] = ()


def _window_max(values: tuple[float | None, ...], t: int, lookback: int) -> float | None:
    seen = [v for v in values[max(0, t - lookback + 1) : t + 1] if v is not None]
    return max(seen) if seen else None


def _instances_at(h: History, t: int, lookback: int) -> tuple[InstanceObservation, ...]:
    out = []
    for s in h.instances:
        util, mem = _window_max(s.utilization, t, lookback), _window_max(s.memory, t, lookback)
        if util is not None or mem is not None:
            out.append(InstanceObservation(instance_id=s.instance_id, gpu_utilization=util, gpu_memory_percent=mem))
    return tuple(out)


def _filled(values: tuple[int | None, ...]) -> list[int]:
    """In-service counts with gaps carried forward (a missing datapoint is not an empty group)."""
    out, last = [], 0
    for v in values:
        last = v if v is not None else last
        out.append(last)
    return out


class _Cooled:
    """Cooldown marks of the would-be changes, committed like StateStore.commit."""

    def __init__(self) -> None:
        self.state = GroupState()

    def commit(self, d: Decision) -> None:
        if d.changes_capacity:
            key = "last_scale_out_at" if d.raises_capacity else "last_scale_in_at"
            self.state = self.state.model_copy(update={key: d.at, "version": self.state.version + 1})


def open_loop(h: History, settings: GroupSettings, lookback: int) -> dict[str, float]:
    """The core on the group as it was. Long because it walks every minute once and keeps four tallies
    (changes, refusals, idle and reclaimed node-minutes) that need the same per-minute observation."""
    counts = _filled(h.in_service)
    cooled = _Cooled()
    recent: deque[float] = deque(maxlen=lookback)
    tallies = {"outs": 0.0, "ins": 0.0, "refusals": 0.0, "idle_minutes": 0.0, "reclaimed_minutes": 0.0}
    reclaimed_until: dict[str, int] = {}
    for t in range(h.minutes):
        if h.gpu_utilization[t] is not None:
            recent.append(h.gpu_utilization[t])  # type: ignore[arg-type]
        instances = _instances_at(h, t, lookback)
        idle = {i.instance_id for i in instances if skip_reason(i, settings.idle) is None}
        tallies["idle_minutes"] += len(idle)
        tallies["reclaimed_minutes"] += sum(1 for i in idle if reclaimed_until.get(i, -1) >= t)
        obs = GroupObservation(
            ref=h.group,
            min_size=h.min_size,
            max_size=h.max_size,
            desired=counts[t],
            gpu_utilization=fmean(recent) if recent else None,
            instances=instances,
            instance_metrics_loaded=True,
        )
        d = decide_reconcile(obs, settings, cooled.state, h.start + timedelta(minutes=t), event_id=f"history-{t}")
        cooled.commit(d)
        tallies["outs"] += d.action is Action.SCALE_OUT and d.changes_capacity
        tallies["ins"] += d.action is Action.SCALE_IN and d.changes_capacity
        tallies["refusals"] += d.action is Action.HOLD and d.skipped.get(SkipReason.BUSY, 0) > 0 and not d.victims
        for victim in d.victims:
            reclaimed_until[victim] = _idle_until(h, victim, t, settings)
    return tallies


def _idle_until(h: History, instance_id: str, t: int, settings: GroupSettings) -> int:
    """Last minute from t on that the instance stayed idle (its series until it was busy or ended)."""
    series = next(s for s in h.instances if s.instance_id == instance_id)
    idle = settings.idle
    for k in range(t, h.minutes):
        u, m = series.utilization[k], series.memory[k]
        if (u is not None and u > idle.gpu_utilization) or (m is not None and m > idle.memory_percent):
            return k - 1
    return h.minutes - 1


def busy_removed(h: History, settings: GroupSettings, lookback: int) -> int:
    """Instances whose series stopped (the group removed them) while busy within the lookback."""
    hits = 0
    for s in h.instances:
        last = max((k for k, v in enumerate(s.utilization) if v is not None), default=None)
        if last is None or last >= h.minutes - 1:
            continue
        u, m = _window_max(s.utilization, last, lookback), _window_max(s.memory, last, lookback)
        if (u or 0.0) > settings.idle.gpu_utilization or (m or 0.0) > settings.idle.memory_percent:
            hits += 1
    return hits


def closed_loop(h: History, settings: GroupSettings, lookback: int, gpus_per_node: int, boot: int) -> dict[str, float]:
    """gpufleet's own capacity for the same work. Long because the minute loop carries the booting
    nodes, the lookback window and three totals that the report needs together."""
    counts = _filled(h.in_service)
    cooled = _Cooled()
    recent: deque[float] = deque(maxlen=lookback)
    desired = ready = counts[0] if counts else 0
    booting: deque[int] = deque()  # minute each launched node becomes ready
    totals = {"node_minutes": 0.0, "short": 0.0, "outs": 0.0, "ins": 0.0}
    for t in range(h.minutes):
        while booting and booting[0] <= t:
            booting.popleft()
            ready += 1
        work = (h.gpu_utilization[t] or 0.0) / 100 * counts[t] * gpus_per_node
        capacity = ready * gpus_per_node
        totals["short"] += max(0.0, work - capacity)
        totals["node_minutes"] += desired
        if ready:
            recent.append(min(100.0, work / capacity * 100))
        obs = GroupObservation(
            ref=h.group,
            min_size=h.min_size,
            max_size=h.max_size,
            desired=desired,
            gpu_utilization=fmean(recent) if recent else None,
        )
        now = h.start + timedelta(minutes=t)
        d = decide_reconcile(obs, settings, cooled.state, now, event_id=f"history-{t}")
        if d.needs_instance_metrics:
            busy = min(ready, max(_busy_at(h, t, settings, lookback), math.ceil(work / gpus_per_node)))
            obs = obs.model_copy(update={"instances": _estimated(ready, busy), "instance_metrics_loaded": True})
            d = decide_reconcile(obs, settings, cooled.state, now, event_id=f"history-{t}")
        if d.changes_capacity:
            cooled.commit(d)
            if d.desired > desired:
                booting.extend([t + boot] * (d.desired - desired))
                totals["outs"] += 1
            else:
                ready -= len(d.victims)
                totals["ins"] += 1
            desired = d.desired
    return totals


def _busy_at(h: History, t: int, settings: GroupSettings, lookback: int) -> int:
    return sum(1 for i in _instances_at(h, t, lookback) if skip_reason(i, settings.idle) is not None)


def _estimated(ready: int, busy: int) -> tuple[InstanceObservation, ...]:
    return tuple(
        InstanceObservation(
            instance_id=f"node-{k}",
            gpu_utilization=100.0 if k < busy else 0.0,
            gpu_memory_percent=100.0 if k < busy else 0.0,
        )
        for k in range(ready)
    )


def unreplayable(h: History) -> list[str]:
    """What the replay cannot go without and the history lacks for every minute: the work (the group's
    GPU utilization) and the group's size. Without either, every number it printed would be 0."""
    lacking = []
    if all(v is None for v in h.gpu_utilization):
        lacking.append("GPU utilization")
    if all(v is None for v in h.in_service):
        lacking.append("size")
    return lacking


def replay_history(h: History, settings: GroupSettings, lookback: int, gpus_per_node: int, boot: int) -> HistoryReport:
    counts = _filled(h.in_service)
    seen = open_loop(h, settings, lookback)
    own = closed_loop(h, settings, lookback, gpus_per_node, boot)
    return HistoryReport(
        group=h.group.key,
        minutes=h.minutes,
        actual_node_hours=round(sum(counts) / 60, 2),
        actual_changes=sum(1 for a, b in itertools.pairwise(counts) if a != b),
        gpufleet_node_hours=round(own["node_minutes"] / 60, 2),
        gpufleet_scale_outs=int(own["outs"]),
        gpufleet_scale_ins=int(own["ins"]),
        short_gpu_minutes=round(own["short"], 1),
        idle_node_hours=round(seen["idle_minutes"] / 60, 2),
        idle_node_hours_reclaimed=round(seen["reclaimed_minutes"] / 60, 2),
        busy_refusals=int(seen["refusals"]),
        busy_nodes_removed_by_group=busy_removed(h, settings, lookback),
        missing=h.missing,
    )


def history_md(r: HistoryReport) -> str:
    rows = [
        ("node-hours", f"{r.actual_node_hours:,.1f}", f"{r.gpufleet_node_hours:,.1f}"),
        ("capacity changes", f"{r.actual_changes}", f"{r.gpufleet_scale_outs} out, {r.gpufleet_scale_ins} in"),
        ("GPU-minutes of work short of capacity", "-", f"{r.short_gpu_minutes:,.0f}"),
        (
            "idle node-hours (idle per the policy)",
            f"{r.idle_node_hours:,.1f}",
            f"{r.idle_node_hours_reclaimed:,.1f} reclaimed",
        ),
        ("busy nodes removed", f"{r.busy_nodes_removed_by_group}", "0 (refused every busy node)"),
        ("minutes it wanted to scale in but every node was busy", "-", f"{r.busy_refusals}"),
    ]
    lines = [
        f"# {r.group}: what gpufleet would have done ({r.minutes / 1440:.1f} days)",
        "",
        "| | the group | gpufleet |",
        "|---|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if r.missing:
        lines += ["", "Missing in the window (the numbers that need it are 0 for want of data):", ""]
        lines += [f"- {m}" for m in r.missing]
    return "\n".join(lines) + "\n"
