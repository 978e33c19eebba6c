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

A record is a claim (report.bounds): one that claims more than its node could have done, or that a node
wrote under another's name, is flagged with its log stream and not summed; so are all the records of a
window that together hold more than the node can. A window's records are judged together once all of them
are read: records are summed as their windows are judged (`add`, `slice_read`, `report`).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime

from gpufleet_node.schema import TEAM_UNALLOCATED
from gpufleet_tools.report.bounds import RESENT, Judged, Ledger, Verdict, check, claimed
from gpufleet_tools.report.fleet import KnownNodes
from gpufleet_tools.report.model import (
    DAY,
    HOUR,
    Bar,
    Finding,
    FindingKind,
    FlagKind,
    FlagLine,
    GroupLine,
    Period,
    PriceUsed,
    Report,
    Selection,
    TeamLine,
    Usage,
    WorkloadLine,
)
from gpufleet_tools.report.prices import GpuHourPrice, PriceBook
from gpufleet_tools.report.records import Skipped, SkipReason, UsageRecord, WorkloadId, WorkloadKind

__all__ = [
    "DAY",
    "HOUR",
    "Bar",
    "Finding",
    "FindingKind",
    "FlagKind",
    "FlagLine",
    "GroupLine",
    "Period",
    "PriceUsed",
    "Report",
    "Selection",
    "TeamLine",
    "Usage",
    "UsageSums",
    "WorkloadLine",
]

IDLE_FINDING = 0.90  # a GPU idle at least this share of the time a workload held it is waste
MIN_FINDING_HELD_H = 1.0  # a workload that held its GPUs for less is not worth a line
UNALLOCATED_FINDING = 0.10  # a group whose GPUs sat unallocated at least this share of their time
NO_GROUP = "(no group)"
FLAG_TEAMS = 5  # teams a flagged line names


class _Sum:
    """Seconds (held, busy, idle) and the peak MiB of one cell."""

    __slots__ = ("busy", "held", "idle", "peak")

    def __init__(self) -> None:
        self.held = self.busy = self.idle = self.peak = 0.0


# (instance type, group): a node's GPUs, so its price per GPU-hour, may depend on both (report.prices)
Priced = tuple[str, str | None]


@dataclass
class _Gone:
    nodes: set[str] = field(default_factory=set)
    records: int = 0
    held_s: defaultdict[Priced, float] = field(default_factory=lambda: defaultdict(float))


class _Flags:
    """Flagged records of one (kind, stream, node), summed for one line."""

    __slots__ = ("bound", "claimed", "detail", "first", "itype", "last", "records", "teams")

    def __init__(self, r: UsageRecord, verdict: Verdict) -> None:
        self.records, self.first, self.last, self.claimed, self.bound = 0, r.start, r.start, 0.0, 0.0
        self.itype, self.detail, self.teams = r.instance_type, verdict.detail, set[str]()

    def add(self, r: UsageRecord, verdict: Verdict) -> None:
        self.records += 1
        self.first, self.last = min(self.first, r.start), max(self.last, r.start)
        self.claimed += verdict.claimed_s
        self.bound += verdict.bound_s
        self.teams.update(row.workload.team for row in r.rows if row.workload is not None)


# (workload line (WorkloadId.line: its key and payer) or None, node, GPU index, instance type, group, chart bucket)
CellKey = tuple[str | None, str, int, str, str | None, int]


class UsageSums:
    """Records folded in one at a time (`add`), in any order; `report()` reads the tables off the sums.
    `book` says how many GPUs a node of each type has (the bound on its records) and prices them; `known`
    (--verify-nodes): the instances that existed, a record of any other node id is flagged."""

    def __init__(
        self,
        period: Period,
        selection: Selection | None = None,
        book: PriceBook | None = None,
        known: KnownNodes | None = None,
    ) -> None:
        self.period = period
        self.known = known
        self.selection = selection or Selection()
        self.book = book or PriceBook()
        self._start, self._end = int(period.start.timestamp()), int(period.end.timestamp())
        self.cells: dict[CellKey, _Sum] = {}
        self.workloads: dict[str, WorkloadId] = {}
        self.records = 0
        self.skipped: Counter[SkipReason] = Counter()
        self.outside = 0  # well-formed, but another period or group
        self.duplicates = 0  # resends (the same content again), counted once
        self.nodes: set[str] = set()
        self.gone: dict[tuple[str, str], _Gone] = {}
        self.flags: dict[tuple[FlagKind, str, str], _Flags] = {}
        self._ledger = Ledger(period.slice_s, period.slice_origin)

    def add(self, parsed: UsageRecord | Skipped) -> None:
        if isinstance(parsed, Skipped):
            self.skipped[parsed.reason] += 1
            return
        r = parsed
        if not self._start <= r.start < self._end or not self.selection.matches(r.group):
            self.outside += 1
            return
        gpus, claim = self.book.gpus(r.instance_type, r.group), claimed(r)
        verdict = check(r, gpus, claim)
        if verdict is None and self.known is not None:
            verdict = self.known.verdict(r, claim)
        if verdict is not None:
            self._flag(r, verdict)
            return
        self._settle(self._ledger.admit(r, gpus))

    def slice_read(self, start_ms: int, end_ms: int) -> None:
        """The reader is done with the slice [start_ms, end_ms): its records' windows are judged now, and
        their memory let go (report.reader's `on_slice`)."""
        del end_ms  # a slice is known by its start
        self._settle(self._ledger.slice_read(self.period.slice_of(start_ms // 1000)))

    def _settle(self, judged: list[Judged]) -> None:
        """Records whose window the ledger has judged: summed, counted once more as a resend, or flagged."""
        for r, verdict in judged:
            if verdict is RESENT:
                self.duplicates += 1
            elif verdict is None:
                self._sum(r)
            else:
                self._flag(r, verdict)

    def _flag(self, r: UsageRecord, verdict: Verdict) -> None:
        key = (verdict.kind, r.stream or "?", r.node)
        flags = self.flags.get(key)
        if flags is None:
            flags = self.flags[key] = _Flags(r, verdict)
        flags.add(r, verdict)

    def _sum(self, r: UsageRecord) -> None:
        self.records += 1
        self.nodes.add(r.node)
        bucket = self.period.bucket(r.start)
        cells, workloads = self.cells, self.workloads
        for row in r.rows:
            w = row.workload
            if w is not None and w.line not in workloads:
                workloads[w.line] = w
            key = (w.line if w is not None else None, r.node, row.gpu, r.instance_type, r.group, bucket)
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
            gone.held_s[(r.instance_type, r.group)] += sum(row.held_s for row in r.rows)

    def report(self, prices: PriceBook | None = None, share_unallocated: bool = False) -> Report:
        """`prices`: the book to price with (default: the one the records were bounded with)."""
        self._settle(self._ledger.flush())  # the windows still open: every record has been read
        return _build(self, prices or self.book, share_unallocated)


# ---- the report ----


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
        self.gpu_type: dict[tuple[str, str, int], Priced] = {}
        self.bars: defaultdict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        self.total = _Acc()


def _tables(sums: UsageSums, price: dict[Priced, GpuHourPrice | None]) -> _Tables:
    t = _Tables()
    for (wkey, node, gpu, itype, group, bucket), cell in sums.cells.items():
        p, g = price[(itype, group)], group or NO_GROUP
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
            t.gpu_type[(wkey, node, gpu)] = (itype, group)
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
    return sorted(lines, key=lambda w: (-w.usage.cost, -w.usage.held_h, w.workload.key, w.workload.line))


def _build(sums: UsageSums, book: PriceBook, share_unallocated: bool) -> Report:
    kinds = {(key[3], key[4]) for key in sums.cells} | {t for g in sums.gone.values() for t in g.held_s}
    price = {k: book.per_gpu_hour(*k) for k in kinds}
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
        *_price_findings(sums, book, price),
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
        prices=_prices_used(book, price),
        share_unallocated=share_unallocated,
        flagged=_flag_lines(sums),
        payers=_payers(sums, t),
        nodes_checked=sums.known.check if sums.known is not None else None,
    )


def _payers(sums: UsageSums, t: _Tables) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """Workload keys whose records name more than one payer: a Slurm job has one user (and account,
    partition), so either the records disagree (someone wrote another's) or job ids repeat across clusters.
    Each is billed as its records say; this says where to look."""
    teams: defaultdict[str, set[str]] = defaultdict(set)
    for line in t.workloads:
        w = sums.workloads[line]
        teams[w.key].add(w.team)
    return tuple((key, tuple(sorted(ts))) for key, ts in sorted(teams.items()) if len(ts) > 1)


def _prices_used(book: PriceBook, price: dict[Priced, GpuHourPrice | None]) -> tuple[PriceUsed, ...]:
    """One line per instance type and GPU count (a type the table does not know may differ by group)."""
    used = set()
    for (itype, group), p in price.items():
        gpus = book.gpus(itype, group)
        used.add(PriceUsed(itype, gpus.count if gpus else 0, p.usd if p else None, p.source.value if p else "none"))
    return tuple(sorted(used, key=lambda u: (u.instance_type, u.gpus)))


def _flag_lines(sums: UsageSums) -> tuple[FlagLine, ...]:
    lines = [
        FlagLine(
            kind,
            stream,
            node,
            f.itype,
            f.records,
            datetime.fromtimestamp(f.first, UTC),
            datetime.fromtimestamp(f.last, UTC),
            f.claimed / HOUR,
            f.bound / HOUR,
            tuple(sorted(f.teams)[:FLAG_TEAMS]),
            f.detail,
        )
        for (kind, stream, node), f in sums.flags.items()
    ]
    return tuple(sorted(lines, key=lambda f: (-f.claimed_h, f.stream, f.node, f.kind)))


def _share(teams: list[TeamLine], unallocated: TeamLine) -> tuple[list[TeamLine], TeamLine]:
    """The unallocated GPUs' cost spread over the teams in proportion to their allocated GPU-hours; the
    total stays the same. Nothing to spread it over (no allocated hours): it stays where it is."""
    held = sum(t.usage.held_h for t in teams)
    money = unallocated.usage.cost
    if held <= 0 or money <= 0:
        return teams, unallocated
    shared = [TeamLine(t.team, t.usage, t.workloads, money * t.usage.held_h / held) for t in teams]
    return shared, TeamLine(unallocated.team, unallocated.usage, 0, -money)


def _priced(seconds_by_type: dict[Priced, float], price: dict[Priced, GpuHourPrice | None]) -> tuple[float | None, str]:
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
    gpu_type: dict[tuple[str, str, int], Priced],
    price: dict[Priced, GpuHourPrice | None],
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
        idle_s: defaultdict[Priced, float] = defaultdict(float)
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


def _unknown_findings(sums: UsageSums, price: dict[Priced, GpuHourPrice | None]) -> list[Finding]:
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


def _price_findings(sums: UsageSums, book: PriceBook, price: dict[Priced, GpuHourPrice | None]) -> list[Finding]:
    """Hours without a price: the type has none, or its GPU count is known to nobody trusted (a type the
    table does not know, in a group the policy gives no demand.gpus_per_node)."""
    seconds: defaultdict[str, float] = defaultdict(float)
    nodes: defaultdict[str, set[str]] = defaultdict(set)
    no_gpus: defaultdict[str, set[str]] = defaultdict(set)  # type -> groups
    for (_, node, _, itype, group, _), cell in sums.cells.items():
        if price.get((itype, group)) is None:
            seconds[itype] += cell.held
            nodes[itype].add(node)
            if book.gpus(itype, group) is None:
                no_gpus[itype].add(group or NO_GROUP)
    found = []
    for itype, held in sorted(seconds.items()):
        text = f"no price for {itype} ({_nodes(len(nodes[itype]))}, {held / HOUR:,.1f} GPU-h): cost unknown; "
        if itype in book.policy and no_gpus[itype]:
            groups = ", ".join(sorted(no_gpus[itype]))
            text += (
                f"the price table does not know its GPUs: set demand.gpus_per_node for {groups} in the policy "
                "(a record's own GPU count is a claim, not a price's divisor)"
            )
        else:
            text += f"set spot.prices.on_demand.{itype} in the policy (--policy)"
        found.append(Finding(FindingKind.NO_PRICE, itype, text, None))
    return found


def _bars(period: Period, bars: dict[tuple[int, str], list[float]]) -> tuple[Bar, ...]:
    teams = sorted({team for _, team in bars})
    return tuple(
        Bar(datetime.fromtimestamp(b, UTC), team, held / HOUR, busy / HOUR, period.covered(b))
        for b in period.buckets()
        for team in teams
        for held, busy in [bars.get((b, team), [0.0, 0.0])]
    )
