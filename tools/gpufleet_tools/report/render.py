"""The report as text: a terminal table, Markdown, CSV (every line, for a spreadsheet) and JSON (every
number), plus the chart's series (drawn by report.chart). Pure: strings and values out, no files.

Flagged records (report.bounds) come first, right after the summary: money that one node's say-so would
have moved belongs where the reader looks before the teams' bills."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from gpufleet_node.schema import IDLE_UTIL_PERCENT, TEAM_UNALLOCATED
from gpufleet_tools.report.model import FlagLine, Report, TeamLine, Usage, WorkloadLine
from gpufleet_tools.report.prices import PRICES_SOURCE

DEFAULT_TOP = 20
OTHER = "other teams"


class Format(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"
    MARKDOWN = "markdown"


# Every name in the report is a node's say-so (a user, a namespace, a unit, a gone reason): in the table and
# Markdown a control character is shown escaped, so a newline cannot print rows of its own and an ANSI escape
# never reaches the terminal; C0, DEL, C1, the Unicode line breaks and the bidirectional overrides (which
# reorder what a terminal shows).
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPED = {c: f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}" for c in _CONTROLS}
# In CSV a text cell a spreadsheet would read as a formula gets a leading ' (OWASP, CSV injection): = + - @,
# tab, CR, and LF. Numbers are written as numbers, never changed: -5.0 stays a number.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r", "\n")


def escape(text: str) -> str:
    """`text` with its control characters shown as \\xNN (\\uNNNN): one line, nothing a terminal acts on."""
    return text.translate(_ESCAPED)


def csv_cell(value: Any) -> Any:
    """A CSV cell: text that starts like a formula gets a leading ' ; numbers and the rest as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def money(cost: float, unpriced_h: float = 0.0) -> str:
    """`$1,234.56`; `unknown` when none of it has a price; `$12.00 + ?` when part of it has none."""
    if unpriced_h > 0:
        return "unknown" if cost == 0 else f"${cost:,.2f} + ?"
    return f"-${-cost:,.2f}" if cost < 0 else f"${cost:,.2f}"


def _h(hours: float) -> str:
    return f"{hours:,.1f}"


def _gib(mib: float) -> str:
    return f"{mib / 1024:,.1f}"


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f} %" if whole > 0 else "-"


# ---- the lines every text format shows ----


def _summary(r: Report) -> list[str]:
    lines = [
        f"GPU usage {r.period.describe()}, {r.selection.describe()}",
        f"{r.records:,} usage records from {r.nodes:,} node{'s' if r.nodes != 1 else ''}",
    ]
    if r.skipped_total:
        why = ", ".join(f"{n:,} {reason}" for reason, n in sorted(r.skipped.items()))
        lines[-1] += f"; {r.skipped_total:,} skipped ({why})"
    if r.duplicates:
        lines[-1] += f"; {r.duplicates:,} resent records counted once"
    if r.flagged:
        lines[-1] += f"; {r.flagged_records:,} flagged, not summed"
    nodes, records, held_h, teams = r.node_flags
    if records:
        whose = f" (teams {', '.join(teams[:5])})" if teams else ""
        lines.append(
            f"{records:,} records of {nodes:,} node{'s' if nodes != 1 else ''} that no source knows, or not running "
            f"then, claim {_h(held_h)} GPU-h{whose}: flagged, not summed"
        )
    allocated = r.total.held_h - r.unallocated.usage.held_h
    lines.append(
        f"GPU-hours seen {_h(r.total.held_h)}: allocated {_h(allocated)}, busy {_h(r.total.busy_h)}, "
        f"unallocated {_h(r.unallocated.usage.held_h)}; cost {money(r.total.cost, r.total.unpriced_h)} on-demand"
    )
    return lines


def _team_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    head = ["team", "workloads", "GPU-h held", "busy", "idle", "idle %", "peak GiB", "cost"]
    if r.share_unallocated:
        head += ["+ unallocated", "total"]

    def row(t: TeamLine, workloads: str) -> list[str]:
        u = t.usage
        cells = [t.team, workloads, _h(u.held_h), _h(u.busy_h), _h(u.idle_h), _pct(u.idle_h, u.held_h)]
        cells += [_gib(u.peak_mib), money(u.cost, u.unpriced_h)]
        if r.share_unallocated:
            cells += [money(t.shared), money(t.total_cost, u.unpriced_h)]
        return cells

    rows = [row(t, str(t.workloads)) for t in r.teams]
    rows.append(row(r.unallocated, "-"))
    shared = sum(t.shared for t in r.teams) + r.unallocated.shared
    total = TeamLine("total", r.total, sum(t.workloads for t in r.teams), shared)
    rows.append(row(total, str(total.workloads)))
    return head, rows


def _workload_rows(r: Report, top: int) -> tuple[list[str], list[list[str]]]:
    head = ["workload", "team", "GPUs", "GPU-h held", "busy %", "idle %", "peak GiB", "cost"]
    rows = [
        [
            w.workload.subject,
            w.workload.team,
            str(w.gpus),
            _h(w.usage.held_h),
            _pct(w.usage.busy_h, w.usage.held_h),
            _pct(w.usage.idle_h, w.usage.held_h),
            _gib(w.usage.peak_mib),
            money(w.usage.cost, w.usage.unpriced_h),
        ]
        for w in r.workloads[:top]
    ]
    return head, rows


def _group_rows(r: Report) -> tuple[list[str], list[list[str]]]:
    head = ["group", "nodes", "GPU-h seen", "allocated", "busy", "idle (allocated)", "unallocated", "cost"]
    head.append("unallocated $")
    rows = [
        [
            g.group,
            str(g.nodes),
            _h(g.seen.held_h),
            _h(g.allocated.held_h),
            _h(g.seen.busy_h),
            _h(g.allocated.idle_h),
            f"{_h(g.unallocated.held_h)} ({_pct(g.unallocated.held_h, g.seen.held_h)})",
            money(g.seen.cost, g.seen.unpriced_h),
            money(g.unallocated.cost, g.unallocated.unpriced_h),
        ]
        for g in r.groups
    ]
    return head, rows


def _notes(r: Report) -> list[str]:
    notes = [f"idle: utilization <= {IDLE_UTIL_PERCENT:g} %; busy: utilization-weighted GPU-hours"]
    priced = [
        f"{p.instance_type} ${p.per_gpu_hour:,.3f}/GPU-h ({p.source})" for p in r.prices if p.per_gpu_hour is not None
    ]
    if priced:
        notes.append("prices: " + ", ".join(priced) + f"; table: {PRICES_SOURCE}")
    if r.share_unallocated:
        notes.append(f"{TEAM_UNALLOCATED} cost shared over the teams by their allocated GPU-hours")
    if r.outside:
        notes.append(f"{r.outside:,} records of other groups or outside the period left out")
    if r.nodes_checked is None:
        notes.append(
            "node ids not checked against EC2, Auto Scaling or HyperPod (--verify-nodes): a made-up id is billed"
        )
    else:
        c = r.nodes_checked
        notes.append(
            f"node ids checked against {', '.join(c.sources)} ({c.known:,} instances, {c.asked:%Y-%m-%d %H:%M} UTC)"
        )
    for key, teams in r.payers:
        notes.append(f"{key} is billed to {len(teams)} payers: {', '.join(teams)} (its records disagree on who pays)")
    return notes


def _grid(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Columns padded to their widest cell; the first left-aligned, numbers right; every cell escaped."""
    head, rows = [escape(c) for c in head], [[escape(c) for c in r] for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows, strict=True)]

    def fmt(cells: Sequence[str]) -> str:
        first = f"{cells[0]:<{widths[0]}}"
        return "  ".join([first, *(f"{c:>{w}}" for c, w in zip(cells[1:], widths[1:], strict=True))]).rstrip()

    return [fmt(head), *(fmt(r) for r in rows)]


def table(r: Report, top: int = DEFAULT_TOP) -> str:
    out = _summary(r)
    out += _flagged(r, top)
    if not r.records:
        out.append("no usage records in this period: is attribution on in the publisher config, and did the nodes run?")
        return _lines(out)
    out += ["", "TEAMS", *_grid(*_team_rows(r))]
    head, rows = _workload_rows(r, top)
    more = len(r.workloads) - len(rows)
    out += ["", f"WORKLOADS (top {len(rows)} by cost)", *_grid(head, rows)]
    if more > 0:
        out.append(f"... {more} more (--top N, or --format csv for all)")
    out += ["", "GROUPS", *_grid(*_group_rows(r))]
    out += ["", "FINDINGS (by money)"]
    out += [f"{i:>3}. {f.line()}" for i, f in enumerate(r.findings[:top], 1)] or ["  none"]
    out += ["", *(f"note: {n}" for n in _notes(r))]
    return _lines(out)


def _lines(out: list[str]) -> str:
    """The lines, each escaped (a name's newline stays in its line), joined."""
    return "\n".join(escape(line) for line in out) + "\n"


FLAGGED_HEADING = "FLAGGED RECORDS (not summed: more than their node could have done, or another node's name)"


def _flagged(r: Report, top: int) -> list[str]:
    if not r.flagged:
        return []
    out = ["", FLAGGED_HEADING, *(f"{i:>3}. {f.line()}" for i, f in enumerate(r.flagged[:top], 1))]
    if len(r.flagged) > top:
        out.append(f"... {len(r.flagged) - top} more (--top N, or --format json for all)")
    return out


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def esc(c: str) -> str:
        return escape(c).replace("|", "\\|")

    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|",
    ]
    return lines + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]


def markdown(r: Report, top: int = DEFAULT_TOP) -> str:
    out = ["# GPU usage report", "", *(f"- {line}" for line in _summary(r))]
    if r.flagged:
        out += ["", "## Flagged records (not summed)", ""]
        out += [f"{i}. {f.line()}" for i, f in enumerate(r.flagged, 1)]
    if not r.records:
        return _lines(out)
    out += ["", "## Teams", "", *_md_table(*_team_rows(r))]
    out += ["", f"## Workloads (top {min(top, len(r.workloads))} by cost)", "", *_md_table(*_workload_rows(r, top))]
    out += ["", "## Groups", "", *_md_table(*_group_rows(r))]
    out += ["", "## Findings (by money)", ""]
    out += [f"{i}. {f.line()}" for i, f in enumerate(r.findings, 1)] or ["none"]
    out += ["", "## Notes", "", *(f"- {n}" for n in _notes(r))]
    return _lines(out)


CSV_COLUMNS = (
    "section",
    "name",
    "team",
    "kind",
    "groups",
    "gpus",
    "nodes",
    "gpu_hours_held",
    "gpu_hours_busy",
    "gpu_hours_idle",
    "gpu_hours_unallocated",
    "peak_mib",
    "cost_usd",
    "shared_unallocated_usd",
    "unpriced_gpu_hours",
    "note",
)


def _usage_cells(u: Usage) -> dict[str, Any]:
    return {
        "gpu_hours_held": round(u.held_h, 4),
        "gpu_hours_busy": round(u.busy_h, 4),
        "gpu_hours_idle": round(u.idle_h, 4),
        "peak_mib": round(u.peak_mib, 1),
        "cost_usd": round(u.cost, 4) if not u.unpriced_h or u.cost else "",
        "unpriced_gpu_hours": round(u.unpriced_h, 4),
    }


class _SafeCsv:
    """CSV_COLUMNS rows whose text cells cannot be read as formulas (`csv_cell`)."""

    def __init__(self, buf: io.StringIO) -> None:
        self._out = csv.DictWriter(buf, CSV_COLUMNS, restval="", lineterminator="\n")

    def writeheader(self) -> None:
        self._out.writeheader()

    def writerow(self, cells: Mapping[str, Any]) -> None:
        self._out.writerow({k: csv_cell(v) for k, v in cells.items()})


def csv_text(r: Report) -> str:
    """One row per team, the unallocated line, workload, group and finding, and the total."""
    buf = io.StringIO()
    out = _SafeCsv(buf)
    out.writeheader()
    for t in (*r.teams, r.unallocated):
        section = "unallocated" if t is r.unallocated else "team"
        out.writerow(
            {
                "section": section,
                "name": t.team,
                "team": t.team,
                **_usage_cells(t.usage),
                "shared_unallocated_usd": t.shared,
            }
        )
    for w in r.workloads:
        cells: dict[str, Any] = {"section": "workload", "name": w.workload.label, "team": w.workload.team}
        cells["kind"] = w.workload.kind
        cells |= {"groups": " ".join(w.groups), "gpus": w.gpus, "nodes": w.nodes, **_usage_cells(w.usage)}
        out.writerow(cells)
    for g in r.groups:
        cells = {"section": "group", "name": g.group, "groups": g.group, "nodes": g.nodes}
        cells |= _usage_cells(g.allocated)
        cells |= {"gpu_hours_unallocated": round(g.unallocated.held_h, 4), "cost_usd": round(g.seen.cost, 4)}
        out.writerow(cells)
    total = {"section": "total", "name": "total", "nodes": r.nodes, **_usage_cells(r.total)}
    total |= {"gpu_hours_held": round(r.total.held_h - r.unallocated.usage.held_h, 4)}
    total |= {"gpu_hours_unallocated": round(r.unallocated.usage.held_h, 4)}
    out.writerow(total)
    for f in r.findings:
        cost = "" if f.cost is None else round(f.cost, 4)
        out.writerow({"section": "finding", "name": f.subject, "kind": f.kind, "cost_usd": cost, "note": f.text})
    for flag in r.flagged:
        cells = {"section": "flagged", "name": flag.stream, "team": " ".join(flag.teams), "kind": flag.kind}
        out.writerow(cells | {"nodes": 1, "gpu_hours_held": round(flag.claimed_h, 4), "note": flag.line()})
    return buf.getvalue()


def _usage_json(u: Usage) -> dict[str, Any]:
    return {
        "gpu_hours_held": u.held_h,
        "gpu_hours_busy": u.busy_h,
        "gpu_hours_idle": u.idle_h,
        "peak_mib": u.peak_mib,
        "cost_usd": u.cost if not u.unpriced_h or u.cost else None,
        "unpriced_gpu_hours": u.unpriced_h,
    }


def _workload_json(w: WorkloadLine) -> dict[str, Any]:
    who = {"key": w.workload.key, "label": w.workload.label, "kind": str(w.workload.kind), "team": w.workload.team}
    return who | {"gpus": w.gpus, "nodes": w.nodes, "groups": list(w.groups), **_usage_json(w.usage)}


def _flag_json(f: FlagLine) -> dict[str, Any]:
    return {
        "kind": str(f.kind),
        "stream": f.stream,
        "node": f.node,
        "instance_type": f.instance_type,
        "records": f.records,
        "first": f.first.isoformat(),
        "last": f.last.isoformat(),
        "claimed_gpu_hours": f.claimed_h,
        "bound_gpu_hours": f.bound_h,
        "teams": list(f.teams),
        "detail": f.detail,
        "text": f.line(),
    }


def json_doc(r: Report) -> dict[str, Any]:
    return {
        "period": {"start": r.period.start.isoformat(), "end": r.period.end.isoformat()},
        "selection": {"groups": sorted(r.selection.groups), "clusters": sorted(r.selection.clusters)},
        "records": r.records,
        "nodes": r.nodes,
        "skipped": {str(k): v for k, v in r.skipped.items()},
        "duplicates": r.duplicates,
        "outside": r.outside,
        "total": _usage_json(r.total),
        "share_unallocated": r.share_unallocated,
        "teams": [
            {"team": t.team, "workloads": t.workloads, **_usage_json(t.usage), "shared_unallocated_usd": t.shared}
            for t in r.teams
        ],
        "unallocated": {**_usage_json(r.unallocated.usage), "shared_out_usd": -r.unallocated.shared},
        "workloads": [_workload_json(w) for w in r.workloads],
        "groups": [
            {"group": g.group, "nodes": g.nodes, "seen": _usage_json(g.seen)}
            | {"allocated": _usage_json(g.allocated), "unallocated": _usage_json(g.unallocated)}
            for g in r.groups
        ],
        "findings": [
            {"kind": str(f.kind), "subject": f.subject, "text": f.text, "cost_usd": f.cost} for f in r.findings
        ],
        "flagged": [_flag_json(f) for f in r.flagged],
        "payers": [{"key": key, "teams": list(teams)} for key, teams in r.payers],
        "nodes_checked": None
        if r.nodes_checked is None
        else {"sources": [str(s) for s in r.nodes_checked.sources], "known": r.nodes_checked.known},
        "prices": [
            {"instance_type": p.instance_type, "gpus": p.gpus, "usd_per_gpu_hour": p.per_gpu_hour, "source": p.source}
            for p in r.prices
        ],
        "series": [
            {"start": b.bucket.isoformat(), "team": b.team, "gpu_hours_held": b.held_h, "gpu_hours_busy": b.busy_h}
            | {"covered": b.covered}
            for b in r.bars
        ],
    }


def json_text(r: Report) -> str:
    return json.dumps(json_doc(r), indent=2) + "\n"


def render(r: Report, fmt: Format, top: int = DEFAULT_TOP) -> str:
    if fmt is Format.CSV:
        return csv_text(r)
    if fmt is Format.JSON:
        return json_text(r)
    if fmt is Format.MARKDOWN:
        return markdown(r, top)
    return table(r, top)


# ---- the chart's series ----

BAR_WIDTH = 0.8  # of a bucket's slot on the x axis


@dataclass(frozen=True)
class ChartSeries:
    """GPU-hours per bucket, one series per team in stacking order (the biggest first; the rest folded
    into OTHER; the unallocated GPUs last). `spans`: the part of each bucket inside the period, as
    (from, to) fractions of it; the first and last bucket may be partial."""

    buckets: tuple[datetime, ...]
    hourly: bool
    teams: tuple[str, ...]
    held: dict[str, tuple[float, ...]]
    busy: dict[str, tuple[float, ...]]
    title: str
    spans: tuple[tuple[float, float], ...] = ()

    def covered(self, i: int) -> float:
        frm, to = self.spans[i] if self.spans else (0.0, 1.0)
        return to - frm

    def partial(self, i: int) -> bool:
        return self.covered(i) < 1.0 - 1e-9

    def bar(self, i: int) -> tuple[float, float]:
        """(left edge, width) of bucket i's bar: as wide as the part of the bucket the period covers, and
        where in the slot it lies (a period ending at 10:05 draws its 10:00 bar one twelfth wide, on
        the left), so a partial hour never looks like a whole one."""
        frm, to = self.spans[i] if self.spans else (0.0, 1.0)
        return i - BAR_WIDTH / 2 + BAR_WIDTH * frm, BAR_WIDTH * (to - frm)

    def rate(self, values: tuple[float, ...]) -> tuple[float, ...]:
        """Heights to draw: GPU-hours per whole bucket at the rate of its covered part. A bar's area is
        then its GPU-hours, and 5 minutes of 8 busy GPUs stands as tall as an hour of them instead of a
        twelfth of it (usage does not seem to drop at the end of the period)."""
        return tuple(v / self.covered(i) if self.covered(i) > 0 else 0.0 for i, v in enumerate(values))


def _spans(r: Report, buckets: tuple[datetime, ...]) -> tuple[tuple[float, float], ...]:
    size = r.period.slice_s
    start, end = int(r.period.start.timestamp()), int(r.period.end.timestamp())
    out = []
    for b in buckets:
        at = int(b.timestamp())
        out.append((max(0, start - at) / size, max(0, min(size, end - at)) / size))
    return tuple(out)


def chart_series(r: Report, max_teams: int = 8) -> ChartSeries:
    buckets = tuple(sorted({b.bucket for b in r.bars}))
    index = {b: i for i, b in enumerate(buckets)}
    ranked = [t.team for t in r.teams]
    shown = ranked[:max_teams]
    order = [*shown, *([OTHER] if len(ranked) > max_teams else []), TEAM_UNALLOCATED]
    held = {t: [0.0] * len(buckets) for t in order}
    busy = {t: [0.0] * len(buckets) for t in order}
    for b in r.bars:
        team = b.team if b.team in shown or b.team == TEAM_UNALLOCATED else OTHER
        if team not in held:
            continue
        held[team][index[b.bucket]] += b.held_h
        busy[team][index[b.bucket]] += b.busy_h
    per = "hour" if r.period.hourly else "day"
    return ChartSeries(
        buckets=buckets,
        hourly=r.period.hourly,
        teams=tuple(order),
        held={t: tuple(v) for t, v in held.items()},
        busy={t: tuple(v) for t, v in busy.items()},
        title=f"GPU-hours per team per {per}, {r.period.describe()}, {r.selection.describe()}",
        spans=_spans(r, buckets),
    )
