"""Who used the GPUs: usage records summed per team, workload and group, priced, and the money wasted
found and ranked. Pure: records in, a Report out (the caller reads the clock and the logs).

One pass keeps one small sum per (workload, node, GPU, instance type, group, day or hour); every table,
the chart's series and the findings are read off those sums at the end, so a month of a 1,000-node fleet
is one dictionary update per usage row.

Words, as in the tables:
- held (allocated): GPU-hours a workload had the GPU; unallocated: GPU-hours no workload had it
  (team TEAM_UNALLOCATED, like OpenCost's __idle__); seen = held + unallocated.
- busy: utilization-weighted GPU-hours; idle: GPU-hours at or below IDLE_UTIL_PERCENT.
- cost: held (or unallocated) GPU-hours x the instance's price per GPU-hour (prices.py). Hours on an
  instance type without a price are counted apart (`unpriced_h`) and their cost shown as unknown.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from gpufleet_node.schema import TEAM_UNALLOCATED, USAGE_WINDOW_S
from gpufleet_tools.report.prices import GpuHourPrice, PriceBook
from gpufleet_tools.report.records import Skipped, SkipReason, UsageRecord, WorkloadId, WorkloadKind

HOUR = 3600
DAY = 86400
HOURLY_BELOW = timedelta(days=2)  # a shorter period is charted per hour, a longer one per day
IDLE_FINDING = 0.90  # a GPU idle at least this share of the time a workload held it is waste
RESEND_MEMORY = 600  # windows per node (~2 days of 5-minute windows) kept to tell a resend from a record
MIN_FINDING_HELD_H = 1.0  # a workload that held its GPUs for less is not worth a line
UNALLOCATED_FINDING = 0.10  # a group whose GPUs sat unallocated at least this share of their time
NO_GROUP = "(no group)"


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

    def bucket(self, epoch: int) -> int:
        """The chart bucket (hour or UTC day) a window starting at `epoch` counts in."""
        size = HOUR if self.hourly else DAY
        return epoch // size * size

    def buckets(self) -> list[int]:
        size = HOUR if self.hourly else DAY
        first, last = self.bucket(int(self.start.timestamp())), int(self.end.timestamp()) - 1
        return list(range(first, last + 1, size))

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


class _Sum:
    """Seconds (held, busy, idle) and the peak MiB of one cell."""

    __slots__ = ("busy", "held", "idle", "peak")

    def __init__(self) -> None:
        self.held = self.busy = self.idle = self.peak = 0.0


@dataclass
class _Gone:
    nodes: set[str] = field(default_factory=set)
    records: int = 0
    held_s: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # by instance type


# (workload key or None, node, GPU index, instance type, group, chart bucket)
CellKey = tuple[str | None, str, int, str, str | None, int]


class UsageSums:
    """Records folded in one at a time (`add`), in any order; `report()` reads the tables off the sums."""

    def __init__(self, period: Period, selection: Selection = Selection()) -> None:
        self.period = period
        self.selection = selection
        self._start, self._end = int(period.start.timestamp()), int(period.end.timestamp())
        self.cells: dict[CellKey, _Sum] = {}
        self.workloads: dict[str, WorkloadId] = {}
        self.records = 0
        self.skipped: Counter[SkipReason] = Counter()
        self.outside = 0  # well-formed, but another period or group
        self.duplicates = 0  # identical resends, counted once
        self.nodes: set[str] = set()
        self.gpus_of_type: dict[str, int] = {}
        self.gone: dict[tuple[str, str], _Gone] = {}
        self._last: dict[str, dict[int, set[int]]] = {}  # node -> recent window starts -> digests seen

    def add(self, parsed: UsageRecord | Skipped) -> None:
        if isinstance(parsed, Skipped):
            self.skipped[parsed.reason] += 1
            return
        r = parsed
        if not self._start <= r.start < self._end or not self.selection.matches(r.group):
            self.outside += 1
            return
        if self._resent(r):
            self.duplicates += 1
            return
        self.records += 1
        self.nodes.add(r.node)
        if r.gpus > self.gpus_of_type.get(r.instance_type, 0):
            self.gpus_of_type[r.instance_type] = r.gpus
        bucket = self.period.bucket(r.start)
        cells, workloads = self.cells, self.workloads
        for row in r.rows:
            w = row.workload
            if w is not None and w.key not in workloads:
                workloads[w.key] = w
            key = (w.key if w is not None else None, r.node, row.gpu, r.instance_type, r.group, bucket)
            cell = cells.get(key)
            if cell is None:
                cell = cells[key] = _Sum()
            cell.held += row.held_s
            cell.busy += row.busy_s
            cell.idle += row.idle_s
            if row.peak_mib > cell.peak:
                cell.peak = row.peak_mib
        for what_why in r.gone:
            gone = self.gone.get(what_why)
            if gone is None:
                gone = self.gone[what_why] = _Gone()
            gone.nodes.add(r.node)
            gone.records += 1
            gone.held_s[r.instance_type] += sum(row.held_s for row in r.rows)

    def _resent(self, r: UsageRecord) -> bool:
        """The same message again (a resend whose first send got through). A resend has its original's
        timestamp, so it is read from the same time slice shortly after it, but slices read side by side
        interleave: each node remembers its last RESEND_MEMORY windows (oldest read forgotten first). A node
        restarted mid-window writes a second, different record of the same window, which counts."""
        seen = self._last.setdefault(r.node, {})
        digests = seen.get(r.start)
        if digests is None:
            if len(seen) >= RESEND_MEMORY:
                del seen[next(iter(seen))]
            seen[r.start] = {r.digest}
            return False
        if r.digest in digests:
            return True
        digests.add(r.digest)
        return False

    def report(self, prices: PriceBook, share_unallocated: bool = False) -> Report:
        return _build(self, prices, share_unallocated)


# ---- the report ----


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


class _Acc:
    __slots__ = ("busy", "cost", "held", "idle", "peak", "unpriced")

    def __init__(self) -> None:
        self.held = self.busy = self.idle = self.peak = self.cost = self.unpriced = 0.0

    def add(self, cell: _Sum, price: GpuHourPrice | None) -> None:
        self.held += cell.held
        self.busy += cell.busy
        self.idle += cell.idle
        self.peak = max(self.peak, cell.peak)
        if price is None:
            self.unpriced += cell.held
        else:
            self.cost += cell.held / HOUR * price.usd

    def usage(self) -> Usage:
        return Usage(self.held / HOUR, self.busy / HOUR, self.idle / HOUR, self.peak, self.cost, self.unpriced / HOUR)


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

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())


class _Tables:
    """The cells summed per line of each table (seconds and $), before they become Usage lines."""

    def __init__(self) -> None:
        self.teams: defaultdict[str, _Acc] = defaultdict(_Acc)
        self.team_workloads: defaultdict[str, set[str]] = defaultdict(set)
        self.workloads: defaultdict[str, _Acc] = defaultdict(_Acc)
        self.placed: defaultdict[str, set[tuple[str, int]]] = defaultdict(set)  # workload -> (node, GPU)
        self.workload_groups: defaultdict[str, set[str]] = defaultdict(set)
        self.seen: defaultdict[str, _Acc] = defaultdict(_Acc)  # by group, from here on
        self.allocated: defaultdict[str, _Acc] = defaultdict(_Acc)
        self.unallocated: defaultdict[str, _Acc] = defaultdict(_Acc)
        self.group_nodes: defaultdict[str, set[str]] = defaultdict(set)
        self.per_gpu: defaultdict[tuple[str, str, int], _Acc] = defaultdict(_Acc)  # (workload, node, GPU)
        self.gpu_type: dict[tuple[str, str, int], str] = {}
        self.bars: defaultdict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.total = _Acc()


def _tables(sums: UsageSums, price: dict[str, GpuHourPrice | None]) -> _Tables:
    t = _Tables()
    for (wkey, node, gpu, itype, group, bucket), cell in sums.cells.items():
        p, g = price[itype], group or NO_GROUP
        t.total.add(cell, p)
        t.seen[g].add(cell, p)
        t.group_nodes[g].add(node)
        if wkey is None:
            team = TEAM_UNALLOCATED
            t.unallocated[g].add(cell, p)
        else:
            team = sums.workloads[wkey].team
            t.team_workloads[team].add(wkey)
            t.allocated[g].add(cell, p)
            t.workloads[wkey].add(cell, p)
            t.placed[wkey].add((node, gpu))
            t.workload_groups[wkey].add(g)
            t.per_gpu[(wkey, node, gpu)].add(cell, p)
            t.gpu_type[(wkey, node, gpu)] = itype
        t.teams[team].add(cell, p)
        bar = t.bars[(bucket, team)]
        bar[0] += cell.held
        bar[1] += cell.busy
    return t


def _team_lines(t: _Tables, share_unallocated: bool) -> tuple[list[TeamLine], TeamLine]:
    unallocated = TeamLine(TEAM_UNALLOCATED, t.teams.pop(TEAM_UNALLOCATED, _Acc()).usage(), 0)
    teams = [TeamLine(team, acc.usage(), len(t.team_workloads[team])) for team, acc in t.teams.items()]
    if share_unallocated:
        teams, unallocated = _share(teams, unallocated)
    teams.sort(key=lambda line: (-line.total_cost, -line.usage.held_h, line.team))
    return teams, unallocated


def _workload_lines(sums: UsageSums, t: _Tables) -> list[WorkloadLine]:
    lines = [
        WorkloadLine(
            sums.workloads[k],
            acc.usage(),
            gpus=len(t.placed[k]),
            nodes=len({node for node, _ in t.placed[k]}),
            groups=tuple(sorted(t.workload_groups[k])),
        )
        for k, acc in t.workloads.items()
    ]
    return sorted(lines, key=lambda w: (-w.usage.cost, -w.usage.held_h, w.workload.key))


def _build(sums: UsageSums, book: PriceBook, share_unallocated: bool) -> Report:
    types = {key[3] for key in sums.cells} | {t for g in sums.gone.values() for t in g.held_s}
    price = {t: book.per_gpu_hour(t, sums.gpus_of_type.get(t, 0)) for t in types}
    t = _tables(sums, price)
    teams, unallocated = _team_lines(t, share_unallocated)
    groups = sorted(
        (
            GroupLine(g, len(t.group_nodes[g]), acc.usage(), t.allocated[g].usage(), t.unallocated[g].usage())
            for g, acc in t.seen.items()
        ),
        key=lambda g: (-g.seen.cost, g.group),
    )
    findings = [
        *_idle_findings(sums, t.per_gpu, t.gpu_type, price),
        *_unallocated_findings(groups, sums.period),
        *_unknown_findings(sums, price),
        *_price_findings(sums, price),
    ]
    findings.sort(key=lambda f: (f.cost is None, -(f.cost or 0.0), f.kind, f.subject))
    return Report(
        period=sums.period,
        selection=sums.selection,
        records=sums.records,
        nodes=len(sums.nodes),
        skipped=dict(sums.skipped),
        duplicates=sums.duplicates,
        outside=sums.outside,
        teams=tuple(teams),
        unallocated=unallocated,
        workloads=tuple(_workload_lines(sums, t)),
        groups=tuple(groups),
        total=t.total.usage(),
        findings=tuple(findings),
        bars=_bars(sums.period, t.bars),
        prices=tuple(
            PriceUsed(i, sums.gpus_of_type.get(i, 0), p.usd if p else None, p.source.value if p else "none")
            for i, p in sorted(price.items())
        ),
        share_unallocated=share_unallocated,
    )


def _share(teams: list[TeamLine], unallocated: TeamLine) -> tuple[list[TeamLine], TeamLine]:
    """The unallocated GPUs' cost spread over the teams in proportion to their allocated GPU-hours; the
    total stays the same. Nothing to spread it over (no allocated hours): it stays where it is."""
    held = sum(t.usage.held_h for t in teams)
    money = unallocated.usage.cost
    if held <= 0 or money <= 0:
        return teams, unallocated
    shared = [TeamLine(t.team, t.usage, t.workloads, money * t.usage.held_h / held) for t in teams]
    return shared, TeamLine(unallocated.team, unallocated.usage, 0, -money)


def _priced(seconds_by_type: dict[str, float], price: dict[str, GpuHourPrice | None]) -> tuple[float | None, str]:
    """$ of GPU-seconds by instance type, and what to say of the part without a price (None: none of
    it has one)."""
    cost, unpriced = 0.0, 0.0
    for itype, seconds in seconds_by_type.items():
        p = price[itype]
        if p is None:
            unpriced += seconds
        else:
            cost += seconds / HOUR * p.usd
    if not unpriced:
        return cost, ""
    if cost == 0:
        return None, " (its instance type has no price)"
    return cost, f" (+ {unpriced / HOUR:,.1f} GPU-h without a price)"


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _count(n: int, of: int) -> str:
    if n == of and n > 1:
        return f"all {n}"
    return "one" if n == 1 else str(n)


def _pct(fraction: float) -> int:
    """Whole percent, rounded down: `100 %` means all of it."""
    return math.floor(100.0 * fraction + 1e-9)


def _idle_findings(
    sums: UsageSums,
    per_gpu: dict[tuple[str, str, int], _Acc],
    gpu_type: dict[tuple[str, str, int], str],
    price: dict[str, GpuHourPrice | None],
) -> list[Finding]:
    """A workload that held a GPU it left idle at least IDLE_FINDING of the time: the idle hours of
    those GPUs are the money (the GPUs it used are not)."""
    by_workload: defaultdict[str, list[tuple[str, int]]] = defaultdict(list)
    for wkey, node, gpu in per_gpu:
        by_workload[wkey].append((node, gpu))
    found = []
    for wkey, gpus in by_workload.items():
        accs = {(n, g): per_gpu[(wkey, n, g)] for n, g in gpus}
        if sum(a.held for a in accs.values()) / HOUR < MIN_FINDING_HELD_H:
            continue
        idle = [(ng, a) for ng, a in accs.items() if a.held > 0 and a.idle / a.held >= IDLE_FINDING]
        if not idle:
            continue
        w = sums.workloads[wkey]
        fraction = sum(a.idle for _, a in idle) / sum(a.held for _, a in idle)
        idle_s: defaultdict[str, float] = defaultdict(float)
        for (node, gpu), acc in idle:
            idle_s[gpu_type[(wkey, node, gpu)]] += acc.idle
        cost, unpriced = _priced(idle_s, price)
        if len(gpus) == 1:
            text = f"{w.subject} held 1 GPU idle {_pct(fraction)} %"
        else:
            verb = {WorkloadKind.POD: "requested", WorkloadKind.SLURM: "was allocated"}.get(w.kind, "held")
            whose = "its" if len(idle) == 1 else "their"
            text = f"{w.subject} {verb} {len(gpus)} GPUs, {_count(len(idle), len(gpus))} idle"
            text += f" {_pct(fraction)} % of {whose} life"
        text += unpriced
        found.append(Finding(FindingKind.IDLE_GPUS, w.key, text, cost))
    return found


def _unallocated_findings(groups: list[GroupLine], period: Period) -> list[Finding]:
    found = []
    for g in groups:
        share = g.unallocated.held_h / g.seen.held_h if g.seen.held_h else 0.0
        if share < UNALLOCATED_FINDING or g.unallocated.held_h <= 0:
            continue
        average = g.unallocated.held_h / period.hours
        text = (
            f"group {g.group}: {average:.1f} GPUs unallocated on average over the period, "
            f"{_pct(share)} % of its GPU-hours"
        )
        u = g.unallocated
        cost: float | None = u.cost
        if u.unpriced_h:
            cost = u.cost or None
            text += (
                " (its instance type has no price)" if not u.cost else f" (+ {u.unpriced_h:,.1f} GPU-h without a price)"
            )
        found.append(Finding(FindingKind.UNALLOCATED, g.group, text, cost))
    return found


def _unknown_findings(sums: UsageSums, price: dict[str, GpuHourPrice | None]) -> list[Finding]:
    """Records that said what the node could not know: their GPU-hours are the money not surely
    attributed (the node, its kubelet socket or its permissions are the fix)."""
    found = []
    for (what, why), gone in sums.gone.items():
        hours = sum(gone.held_s.values()) / HOUR
        cost, unpriced = _priced(gone.held_s, price)
        text = (
            f"{what} unknown on {_nodes(len(gone.nodes))}: {why}; "
            f"{hours:,.1f} GPU-h in {gone.records} record{'s' if gone.records != 1 else ''} not surely attributed"
            f"{unpriced}"
        )
        found.append(Finding(FindingKind.UNKNOWN, f"{what}: {why}", text, cost))
    return found


def _price_findings(sums: UsageSums, price: dict[str, GpuHourPrice | None]) -> list[Finding]:
    seconds: defaultdict[str, float] = defaultdict(float)
    nodes: defaultdict[str, set[str]] = defaultdict(set)
    for (_, node, _, itype, _, _), cell in sums.cells.items():
        if price.get(itype) is None:
            seconds[itype] += cell.held
            nodes[itype].add(node)
    return [
        Finding(
            FindingKind.NO_PRICE,
            itype,
            f"no price for {itype} ({_nodes(len(nodes[itype]))}, {held / HOUR:,.1f} GPU-h): cost unknown; "
            f"set spot.prices.on_demand.{itype} in the policy (--policy)",
            None,
        )
        for itype, held in sorted(seconds.items())
    ]


def _bars(period: Period, bars: dict[tuple[int, str], list[float]]) -> tuple[Bar, ...]:
    teams = sorted({team for _, team in bars})
    return tuple(
        Bar(datetime.fromtimestamp(b, UTC), team, held / HOUR, busy / HOUR)
        for b in period.buckets()
        for team in teams
        for held, busy in [bars.get((b, team), [0.0, 0.0])]
    )
