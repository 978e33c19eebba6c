"""What the report is made of: the period and the groups it covers, and the lines, findings, flagged
records and chart bars it holds. Pure values; report.usage fills them in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from gpufleet_node.schema import USAGE_WINDOW_S
from gpufleet_tools.report.records import SkipReason, WorkloadId

HOUR = 3600
DAY = 86400
HOURLY_BELOW = timedelta(days=2)  # a shorter period is charted per hour, a longer one per day


@dataclass(frozen=True, slots=True)
class Period:
    """[start, end), UTC: the usage windows that start in it."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("a report period is in UTC (timezone-aware)")
        if self.end <= self.start:
            raise ValueError(f"the period ends before it starts ({self.start:%Y-%m-%d %H:%M} .. {self.end:%H:%M})")

    @classmethod
    def last(cls, span: timedelta, now: datetime) -> Period:
        """The last `span` up to `now`, on window boundaries (the window still open has no record yet)."""
        end = datetime.fromtimestamp(int(now.timestamp()) // USAGE_WINDOW_S * USAGE_WINDOW_S, UTC)
        return cls(end - span, end)

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / HOUR

    @property
    def hourly(self) -> bool:
        return self.end - self.start < HOURLY_BELOW

    @property
    def slice_s(self) -> int:
        """The chart's bucket and the reader's time slice: an hour under HOURLY_BELOW, else a day."""
        return HOUR if self.hourly else DAY

    @property
    def slice_origin(self) -> int:
        """Where the reader's slices are counted from (epoch s): the period's start on the whole hour, so
        that no hour, and so no window a node writes (report.bounds), is read in two slices."""
        return int(self.start.timestamp()) // HOUR * HOUR

    def slice_of(self, epoch: int) -> int:
        """The reader's slice a window starting at `epoch` is read in."""
        return (epoch - self.slice_origin) // self.slice_s

    def bucket(self, epoch: int) -> int:
        """The chart bucket (hour or UTC day) a window starting at `epoch` counts in."""
        size = HOUR if self.hourly else DAY
        return epoch // size * size

    def buckets(self) -> list[int]:
        size = HOUR if self.hourly else DAY
        first, last = self.bucket(int(self.start.timestamp())), int(self.end.timestamp()) - 1
        return list(range(first, last + 1, size))

    def covered(self, bucket: int) -> float:
        """The share of a chart bucket (hour or day) inside the period: a period that ends at 10:05 has
        1/12 of its 10:00 hour, and a bar for that hour stands for 5 minutes, not 60."""
        size = HOUR if self.hourly else DAY
        start, end = int(self.start.timestamp()), int(self.end.timestamp())
        return max(0, min(bucket + size, end) - max(bucket, start)) / size

    def describe(self) -> str:
        days = (self.end - self.start) / timedelta(days=1)
        span = f"{days:.3g} days" if days >= 1 else f"{self.hours:.3g} hours"
        return f"{self.start:%Y-%m-%d %H:%M} .. {self.end:%Y-%m-%d %H:%M} UTC ({span})"


@dataclass(frozen=True, slots=True)
class Selection:
    """Which groups count: `groups` by key, `clusters` by EKS cluster name; none of either: all."""

    groups: frozenset[str] = frozenset()
    clusters: frozenset[str] = frozenset()

    def matches(self, group: str | None) -> bool:
        if not self.groups and not self.clusters:
            return True
        if group is None:
            return False
        return group in self.groups or any(group.startswith(f"eks:{c}/") for c in self.clusters)

    def describe(self) -> str:
        parts = sorted(self.groups) + [f"cluster {c}" for c in sorted(self.clusters)]
        return ", ".join(parts) or "all groups"


@dataclass(frozen=True, slots=True)
class Usage:
    """GPU-hours and money of one line of a table."""

    held_h: float = 0.0
    busy_h: float = 0.0
    idle_h: float = 0.0
    peak_mib: float = 0.0
    cost: float = 0.0  # $ of the priced hours
    unpriced_h: float = 0.0  # hours on instance types without a price

    @property
    def idle_pct(self) -> float:
        return 100.0 * self.idle_h / self.held_h if self.held_h else 0.0

    @property
    def busy_pct(self) -> float:
        return 100.0 * self.busy_h / self.held_h if self.held_h else 0.0


@dataclass(frozen=True, slots=True)
class TeamLine:
    team: str
    usage: Usage
    workloads: int
    shared: float = 0.0  # $ of the unallocated GPUs shared to this team (--share-unallocated)

    @property
    def total_cost(self) -> float:
        return self.usage.cost + self.shared


@dataclass(frozen=True, slots=True)
class WorkloadLine:
    workload: WorkloadId
    usage: Usage
    gpus: int  # distinct (node, GPU) it held
    nodes: int
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class GroupLine:
    group: str
    nodes: int
    seen: Usage  # every GPU-hour the group's nodes reported
    allocated: Usage
    unallocated: Usage


class FindingKind(StrEnum):
    IDLE_GPUS = "idle-gpus"  # a workload holding GPUs it does not use
    UNALLOCATED = "unallocated"  # a group's GPUs nobody held
    UNKNOWN = "unknown"  # records that could not say who held the GPUs
    NO_PRICE = "no-price"  # an instance type without a price


@dataclass(frozen=True, slots=True)
class Finding:
    kind: FindingKind
    subject: str
    text: str  # one line a tired engineer can act on
    cost: float | None  # $ at stake; None: unknown

    def line(self) -> str:
        return f"{self.text}: ${self.cost:,.2f}" if self.cost is not None else self.text


@dataclass(frozen=True, slots=True)
class Bar:
    """One team's GPU-hours in one chart bucket (hour or day)."""

    bucket: datetime
    team: str
    held_h: float
    busy_h: float
    covered: float = 1.0  # the share of the bucket inside the period (the first and last may be partial)


class FlagKind(StrEnum):
    """Why a well-formed record was not summed: it claims what its node cannot have done."""

    STREAM = "stream"  # names another node than the log stream it was written to
    STAMP = "stamp"  # its log event is not stamped with its window's start, as a node stamps it
    WINDOW = "window"  # a window no node writes: longer than an hour, or off its own grid
    GPUS = "gpus"  # more GPUs, or a higher GPU index, than a node of its type has
    HELD = "held"  # a GPU held longer than the window
    CONFLICT = "conflict"  # records of one window (or of overlapping ones) together hold more than the node can
    NODE = "node"  # a node id no source knows, a window when the node did not run, or another type (--verify-nodes)


class NodeSource(StrEnum):
    """What can vouch that an instance id existed (report.fleet)."""

    EC2 = "EC2 DescribeInstances"
    ASG = "Auto Scaling activities"
    HYPERPOD = "SageMaker ListClusterNodes"


@dataclass(frozen=True, slots=True)
class NodeCheck:
    """What the node ids were checked against (--verify-nodes), for the report to say."""

    sources: tuple[NodeSource, ...]
    known: int  # instance ids known
    asked: datetime


@dataclass(frozen=True, slots=True)
class FlagLine:
    """Flagged records of one stream, node and kind: what they claimed and what the node could hold.
    Their GPU-hours are in no table and no total."""

    kind: FlagKind
    stream: str  # the log stream they were read from ("?" when not read from CloudWatch Logs)
    node: str  # the node they name
    instance_type: str
    records: int
    first: datetime  # the earliest and latest window start among them
    last: datetime
    claimed_h: float  # GPU-hours the records claim
    bound_h: float  # GPU-hours the node could have held in those windows (room left, for a conflict)
    teams: tuple[str, ...]  # teams the claims name (up to 5)
    detail: str  # the first record's reason, in one line

    def line(self) -> str:
        when = f"{self.first:%Y-%m-%d %H:%M}"
        if self.last != self.first:
            when += f" .. {self.last:%Y-%m-%d %H:%M}"
        teams = f" (teams {', '.join(self.teams)})" if self.teams else ""
        return (
            f"stream {self.stream}: {self.records:,} record{'s' if self.records != 1 else ''} of node {self.node} "
            f"({self.instance_type}, {when}) claim {self.claimed_h:,.1f} GPU-h{teams}, "
            f"the node could hold {self.bound_h:,.1f}: {self.detail}; not summed"
        )


@dataclass(frozen=True, slots=True)
class PriceUsed:
    instance_type: str
    gpus: int
    per_gpu_hour: float | None
    source: str  # "policy", "table" or "none"


@dataclass(frozen=True)
class Report:
    period: Period
    selection: Selection
    records: int
    nodes: int
    skipped: dict[SkipReason, int]
    duplicates: int
    outside: int
    teams: tuple[TeamLine, ...]  # by cost, the unallocated line apart
    unallocated: TeamLine  # team TEAM_UNALLOCATED
    workloads: tuple[WorkloadLine, ...]
    groups: tuple[GroupLine, ...]
    total: Usage  # every GPU-hour seen, allocated or not
    findings: tuple[Finding, ...]  # by money, unknown money last
    bars: tuple[Bar, ...]
    prices: tuple[PriceUsed, ...]
    share_unallocated: bool
    flagged: tuple[FlagLine, ...] = ()  # records not summed, by GPU-hours claimed
    payers: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (workload key, its teams): keys billed to several
    nodes_checked: NodeCheck | None = None  # what the node ids were checked against (None: not checked)

    @property
    def flagged_records(self) -> int:
        return sum(f.records for f in self.flagged)

    @property
    def node_flags(self) -> tuple[int, int, float, tuple[str, ...]]:
        """Records flagged for their node id (FlagKind.NODE): (nodes, records, GPU-hours, teams)."""
        lines = [f for f in self.flagged if f.kind is FlagKind.NODE]
        teams = tuple(sorted({t for f in lines for t in f.teams}))
        return len({f.node for f in lines}), sum(f.records for f in lines), sum(f.claimed_h for f in lines), teams

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())
