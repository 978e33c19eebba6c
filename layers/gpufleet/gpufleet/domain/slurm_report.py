"""Slurm's idle report on a HyperPod cluster's nodes, and what it says of them.

Which nodes run a Slurm job is Slurm's to say, not the node's. The backlog publisher on the cluster's
controller node (ami/slurm_pending_gpus.py --hyperpod) puts, each minute, `IdleNode` = 1 for every node
Slurm reports IDLE, `DrainedNode` = 1 for every node Slurm shows drained by gpufleet with no job, and the
group's `PendingGPUs` in the same PutMetricData call: the marker that a run's report landed. aws.hyperpod
reads it in one GetMetricData call; the rules of what it says live here, pure, so the purity check sees
them. A node is removable only on the newest landed report's word; a stale report, an unreadable one, or
a drain the report does not show yet keeps it (fail closed).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpufleet.domain import defaults
from gpufleet.domain.models import GroupObservation, GroupRef, NodeMark
from gpufleet_node import schema

# Slurm's report, as the controller node's publisher puts it (ami/slurm_pending_gpus.py --hyperpod).
IDLE_NODE = schema.Metric(defaults.HYPERPOD_IDLE_METRIC, "Count", "1 each minute Slurm calls the node idle")
DRAINED_NODE = schema.Metric(
    defaults.HYPERPOD_DRAINED_METRIC, "Count", "1 each minute Slurm shows the node drained by gpufleet, no job"
)
REPORT_LANDED = schema.Metric(
    defaults.HYPERPOD_PENDING_METRIC, "Count", "the group's backlog, sent with its run's IdleNode data"
)


def minute_of(at: datetime) -> datetime:
    """The whole minute (UTC) a datum's timestamp falls in: the key GetMetricData's 60 s buckets share."""
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def by_minute(points: Iterable[tuple[datetime, float]]) -> dict[datetime, float]:
    """Each datum by its minute; two data in one minute: a not-1 sticks."""
    series: dict[datetime, float] = {}
    for at, value in points:
        if series.get(minute_of(at), 1.0) == 1.0:
            series[minute_of(at)] = value
    return series


def report_minute(reports: Collection[datetime], end: datetime) -> datetime | None:
    """The newest minute, up to and including the current one (`end`), in which the group's report
    landed (its PendingGPUs datum: the publisher sends it in the same PutMetricData call as that run's
    IdleNode data); None when neither the current nor the previous whole minute holds one: the report
    is stale, and no node is idle by it."""
    recent = [m for m in reports if end - timedelta(minutes=1) <= m <= end]
    return max(recent, default=None)


def idle_nodes(
    minutes: Mapping[str, Mapping[datetime, float]], reports: Collection[datetime], end: datetime
) -> set[str]:
    """Nodes Slurm called idle through the window. `end` is the current minute (whole, UTC); `reports`
    the minutes in which the group's report landed; the window is the HYPERPOD_IDLE_MINUTES minutes
    ending at the newest of them (report_minute). A node is idle only if
    - its IdleNode is 1 in that newest landed minute: the publisher sends nothing for a node a job holds,
      so a report that landed without the node is Slurm saying busy (or not idle), never forgiven;
    - every datum read says 1 (a 0 or a NaN - anywhere, the current partial minute too - keeps it);
    - at most HYPERPOD_IDLE_MISSING_OK older minutes of the window are missing (cron jitter, a late
      ingestion).
    No landed report in the current or the previous minute, or a node with no series: not idle."""
    newest = report_minute(reports, end)
    if newest is None:
        return set()
    older = [newest - timedelta(minutes=k) for k in range(1, defaults.HYPERPOD_IDLE_MINUTES)]
    idle = set()
    for iid, series in minutes.items():
        if any(v != 1.0 for v in series.values()) or series.get(newest) != 1.0:
            continue
        if sum(1 for m in older if m not in series) <= defaults.HYPERPOD_IDLE_MISSING_OK:
            idle.add(iid)
    return idle


def drained_nodes(
    drained: Mapping[str, Mapping[datetime, float]], asked: Mapping[str, datetime], newest: datetime
) -> set[str]:
    """The nodes gpufleet asked to drain that Slurm itself shows drained by gpufleet, no job: DrainedNode 1
    in the newest landed report minute (`newest`), a report made after the ask (its minute starts after
    it). The clock is never trusted: a drain the controller never applied (scontrol failing, a publisher
    run without --marks-table) or one it resumed since keeps the node open, never removable; a node
    resumed and asked again counts only once a report after the new ask says drained."""
    return {iid for iid, at in asked.items() if drained.get(iid, {}).get(newest) == 1.0 and at < newest}


def nodes_to_read(
    observations: Iterable[GroupObservation], candidates: Mapping[str, Collection[str]] | None
) -> list[tuple[GroupRef, str]]:
    """The InService nodes whose word is read: `candidates` (per group key) the only nodes that could be
    victims (their GPUs read idle); None: every InService node. Every other node runs work unread."""
    return [
        (o.ref, i.instance_id)
        for o in observations
        for i in o.instances
        if i.in_service and (candidates is None or i.instance_id in candidates.get(o.ref.key, ()))
    ]


def asked_drains(observations: Iterable[GroupObservation]) -> dict[str, datetime]:
    """Instance id -> when gpufleet asked Slurm to drain it, for the nodes the observations mark GPUFLEET."""
    return {
        i.instance_id: i.marked_at or datetime.min.replace(tzinfo=UTC)
        for o in observations
        for i in o.instances
        if i.mark is NodeMark.GPUFLEET
    }


@dataclass
class SlurmWord:
    """What Slurm's report says of the nodes read: `idle` (no job: it holds no GPU), of them `removable`
    (idle, and, for a node gpufleet asked to drain, shown drained by gpufleet), and per group key why it
    cannot be told (`closed`)."""

    idle: set[str] = field(default_factory=set)
    removable: set[str] = field(default_factory=set)
    closed: dict[str, str] = field(default_factory=dict)

    @classmethod
    def unknown(cls, keys: Iterable[str], why: str) -> SlurmWord:
        """The report could not be read: every group read is closed for scale-in, for `why`."""
        return cls(closed=dict.fromkeys(keys, why))

    def marked(self, obs: GroupObservation) -> GroupObservation:
        """The group as this word says. A node that is not removable runs work (never a victim); with the
        report unreadable, every node does and the group is closed for scale-in. GPUs held, from Slurm's
        idle word alone (a node gpufleet asked to drain that is idle but not yet shown drained holds none,
        though it is not yet removable): Slurm's report says idle or not, never a partial allocation, so a
        node running work holds all its GPUs (the group's GPUs per node, when its demand says) and an idle
        one none; unknown when the report is unreadable."""
        closed = self.closed.get(obs.ref.key)
        per_node = obs.demand.gpus_per_node if obs.demand is not None else None

        def held(iid: str) -> float | None:
            if closed is not None:
                return None
            return 0.0 if iid in self.idle else per_node

        instances = tuple(
            i.model_copy(
                update={
                    "runs_work": closed is not None or i.instance_id not in self.removable,
                    "gpus_held": held(i.instance_id),
                }
            )
            for i in obs.instances
        )
        return obs.model_copy(update={"instances": instances, "scale_in_closed": closed})


@dataclass(frozen=True)
class SlurmReport:
    """One read of Slurm's report, each datum keyed by its minute: per node its IdleNode (`minutes`), per
    node gpufleet asked to drain its DrainedNode (`drained`), per group key the minutes its report landed
    (`reports`)."""

    minutes: Mapping[str, Mapping[datetime, float]]
    drained: Mapping[str, Mapping[datetime, float]]
    reports: Mapping[str, Collection[datetime]]

    def word(self, running: Sequence[tuple[GroupRef, str]], end: datetime, asked: Mapping[str, datetime]) -> SlurmWord:
        """The Running nodes read that Slurm has called idle through the window (idle_nodes says the rule);
        of them the removable ones (a node gpufleet asked to drain, `asked`: id -> when, only once the newest
        landed report says Slurm shows it drained by gpufleet: drained_nodes); and per group key why that
        cannot be told (then none of its nodes is): no report of the group landed in the current or the
        previous minute (stale). `end`: the current minute."""
        word = SlurmWord()
        for key in sorted({ref.key for ref, _ in running}):
            newest = report_minute(self.reports[key], end)
            if newest is None:
                word.closed[key] = (
                    f"Slurm's idle report is stale: none landed at {end - timedelta(minutes=1):%H:%M} or "
                    f"{end:%H:%M} UTC (is the controller node's publisher running?)"
                )
                continue
            minutes = {iid: self.minutes[iid] for ref, iid in running if ref.key == key}
            idle = idle_nodes(minutes, self.reports[key], end)
            word.idle |= idle
            word.removable |= {i for i in idle if i not in asked} | drained_nodes(self.drained, asked, newest) & idle
        return word


def late_drains(word: SlurmWord, asked: Mapping[str, datetime], now: datetime, told: set[str]) -> list[str]:
    """Nodes Slurm calls idle whose drain gpufleet asked for HYPERPOD_DRAIN_LATE_MIN ago or more and Slurm's
    report still does not show: they are never removed until it does (is the controller's publisher run
    with --marks-table? does scontrol fail?). Told once per node (`told`)."""
    late = timedelta(minutes=defaults.HYPERPOD_DRAIN_LATE_MIN)
    out = []
    for iid in sorted(word.idle - word.removable):
        at = asked.get(iid)
        if at is not None and now - at >= late and iid not in told:
            told.add(iid)
            out.append(
                f"{iid}: Slurm drain asked at {at:%H:%M} UTC, not in Slurm's report yet: the node stays until it "
                "is (is the controller's publisher run with --marks-table? does scontrol fail?)"
            )
    return out
