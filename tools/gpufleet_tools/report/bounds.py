"""What a usage record may claim, alone and with the node's other records of its window. Pure.

A node's role may write any stream of the usage log group: IAM cannot scope PutLogEvents to a stream
named after the caller (docs/report.md, "What a record is trusted with"). So a record is a claim, and
the report sums only what the node it names could have done; the rest is flagged with its stream, never
summed. A record alone (`check`):
- written to its own node's stream (the publisher writes to a stream named after its instance id);
- stamped with its window's start (the publisher stamps it so: a window's records then all lie in one
  time slice of the reader, in timestamp order, since FilterLogEvents returns events by timestamp);
- a window a node writes: at most MAX_WINDOW_S long, dividing an hour, on its own grid
  (gpufleet_node.config's windows all divide an hour, so a window never crosses an hour, nor a slice);
- no more GPUs than a node of its type has: the price table's count, else the policy's for its group
  (report.prices), else MAX_NODE_GPUS; never the record's own `gpus`;
- no GPU held longer than the window, give or take one sample (`slack`).
Then the node's records of one window, and of any window that overlaps it, together (`Ledger`): an
identical record again (same content, whatever its bytes) is a resend, counted once. Different records
whose windows overlap are judged as one group, once all of them are read: if no GPU is held longer in
them together than their span, give or take `together_slack` (a record split in parts, a node restarted
mid-window), all count; else none does, and every one is flagged as a conflict. Which of them is true
cannot be told from them (a forger can write a node's window first, and in the node's own stream), so
none is believed: a forger can turn a node's window into a flagged conflict, never bill it to a team.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gpufleet_tools.report.model import HOUR, FlagKind
from gpufleet_tools.report.prices import NodeGpus
from gpufleet_tools.report.records import UsageRecord

MAX_WINDOW_S = 3600  # the longest usage_window_s a node writes (gpufleet_node.config)
SAMPLE_SLACK_S = 60.0  # a lone record: its first sample stands for the time since the last one, up to a
# sample interval (sample_interval_s is at most 60 s); with usage_window_s 60 that can be twice the window
SLACK_SHARE = 0.01  # and rounding (0.1 s a row) and clock jitter
# Records of one window together (`together_slack`): a node's samples, however many records they go
# into, add up to the time between its first sample's predecessor and its last sample (tracker.py: each
# stands for the time since the one before), so per GPU they exceed the window by the reach of its
# first sample before the window's start only: one sample interval, 1 s by default (config.py).
TOGETHER_SAMPLE_S = 1.0
TOGETHER_SHARE = 0.02  # and a stall that reached further back (up to 2 % of the window), rounding, jitter
MAX_NODE_GPUS = 16  # a type neither the table nor the policy knows (EC2's GPU instances have 8 at most)
MAX_GROUP_RECORDS = 4096  # records of one group of overlapping windows held until it is judged; past it,
# a conflict (a window a node splits in parts has tens of them; thousands are a forger's)
GROUPS_KEPT = 32  # judged groups remembered per node and slice (a record read late, out of order)
SLICES_KEPT = 16  # per node: the slices being read side by side (--workers), and a few more


def slack(seconds: float) -> float:
    """How far past `seconds` an honest node's GPU time in a window's one record can go."""
    return SAMPLE_SLACK_S + SLACK_SHARE * seconds


def together_slack(seconds: float) -> float:
    """How far past `seconds` an honest node's GPU time in all its records of a span can go together."""
    return TOGETHER_SAMPLE_S + TOGETHER_SHARE * seconds


@dataclass(frozen=True, slots=True)
class Verdict:
    """Why a record is not summed: what it claimed and what the node could hold (GPU-seconds)."""

    kind: FlagKind
    detail: str
    claimed_s: float
    bound_s: float


class Resent(Enum):
    """The same content again: counted once, not flagged."""

    RESENT = "resent"


RESENT = Resent.RESENT

# A record and what became of it: None, counted; RESENT, seen; a Verdict, flagged
Judged = tuple[UsageRecord, Verdict | Resent | None]


def claimed(r: UsageRecord) -> float:
    """The GPU-seconds a record claims (held, allocated or not)."""
    return sum(row.held_s for row in r.rows)


def held_per_gpu(r: UsageRecord) -> dict[int, float]:
    per_gpu: dict[int, float] = {}
    for row in r.rows:
        per_gpu[row.gpu] = per_gpu.get(row.gpu, 0.0) + row.held_s
    return per_gpu


def _gpus_text(r: UsageRecord, gpus: NodeGpus | None) -> str:
    if gpus is None:
        return f"at most {MAX_NODE_GPUS} for a type neither the price table nor the policy knows"
    return f"a {r.instance_type} has {gpus.count} ({gpus.source})"


def check(r: UsageRecord, gpus: NodeGpus | None, claim: float) -> Verdict | None:
    """The record alone (see the module's list), `claim` its GPU-seconds; None: within bounds."""
    count = gpus.count if gpus else MAX_NODE_GPUS
    bound = count * min(r.seconds, MAX_WINDOW_S)
    if r.stream is not None and r.stream != r.node:
        return Verdict(FlagKind.STREAM, f"names node {r.node} but was written to stream {r.stream}", claim, 0.0)
    if r.stamp_ms is not None and r.stamp_ms != r.start * 1000:
        detail = f"its log event is stamped {r.stamp_ms} ms, not its window's start {r.start * 1000} ms"
        return Verdict(FlagKind.STAMP, detail, claim, bound)
    if r.seconds > MAX_WINDOW_S or HOUR % r.seconds or r.start % r.seconds:
        detail = f"a {r.seconds:,} s window at {r.start} (nodes write windows that divide an hour, on their grid)"
        return Verdict(FlagKind.WINDOW, detail, claim, bound)
    per_gpu = held_per_gpu(r)
    top = max(per_gpu, default=-1)
    if r.gpus > count or top >= count:
        said = f"{r.gpus:,} GPUs" if r.gpus > count else f"GPU index {top:,}"
        return Verdict(FlagKind.GPUS, f"claims {said}; {_gpus_text(r, gpus)}", claim, bound)
    held, gpu = max((held, gpu) for gpu, held in per_gpu.items()) if per_gpu else (0.0, 0)
    if held > r.seconds + slack(r.seconds):
        return Verdict(FlagKind.HELD, f"GPU {gpu} held {held:,.0f} s in a {r.seconds} s window", claim, bound)
    return None


class _Group:
    """One node's records whose windows overlap (one window, or windows of other lengths over it), held
    until the node's records of that slice move past it, then judged together: all count or none does."""

    __slots__ = ("count", "digests", "end", "held", "records", "start", "verdict")

    def __init__(self, r: UsageRecord, count: int) -> None:
        self.start, self.end, self.count = r.start, r.start + r.seconds, count
        self.records: list[UsageRecord] = []  # until judged
        self.held: dict[int, float] = {}  # GPU -> seconds its different records claim together (judged)
        self.digests: set[int] = set()
        self.verdict: bool | None = None  # None: not judged yet; True: counted; False: a conflict

    def overlaps(self, r: UsageRecord) -> bool:
        return r.start < self.end and r.start + r.seconds > self.start

    def add(self, r: UsageRecord, count: int) -> None:
        self.start, self.end = min(self.start, r.start), max(self.end, r.start + r.seconds)
        self.count = min(self.count, count)  # one node has one type: the least any record's type holds
        self.records.append(r)

    def hold(self, r: UsageRecord) -> None:
        for gpu, held in held_per_gpu(r).items():
            self.held[gpu] = self.held.get(gpu, 0.0) + held

    def over(self) -> tuple[int, float] | None:
        """A GPU (and its seconds) held longer than the span allows, or past the node's GPUs; None: fits."""
        span = self.end - self.start
        for gpu, held in sorted(self.held.items()):
            if gpu >= self.count or held > span + together_slack(span):
                return gpu, held
        return None

    def judge(self, forced: bool = False) -> list[Judged]:
        """Count them all, or flag them all; `forced`: too many records for a node to write."""
        records, self.records = self.records, []
        for r in records:
            self.hold(r)  # kept for a record read late
        over = None if forced or len(records) < 2 else self.over()
        self.verdict = not forced and over is None
        if self.verdict:
            return [(r, None) for r in records]
        span = self.end - self.start
        bound = self.count * (span + together_slack(span))
        one = all((r.start, r.seconds) == (self.start, span) for r in records)
        what = "one window" if one else "overlapping windows"
        held = f"GPU {over[0]} {over[1]:,.0f} s in {span:,} s" if over else f"{len(records):,} records or more"
        streams = ", ".join(sorted({r.stream or "?" for r in records}))
        detail = (
            f"{len(records):,} different records of {what} (stream {streams}) hold {held}; "
            f"{'neither' if len(records) == 2 else 'none'} counted: a node can hold at most "
            f"{bound / HOUR:,.2f} GPU-h there"
        )
        return [
            (r, Verdict(FlagKind.CONFLICT, detail, claimed(r), bound if i == 0 else 0.0)) for i, r in enumerate(records)
        ]


class _NodeSlice:
    """One node's records in one time slice of the reader: they come in timestamp order (FilterLogEvents
    returns a slice's events by timestamp), so the group being read is the only one still open."""

    __slots__ = ("judged", "open")

    def __init__(self) -> None:
        self.open: _Group | None = None
        self.judged: list[_Group] = []  # the last GROUPS_KEPT, for a record read out of order

    def close(self) -> list[Judged]:
        group, self.open = self.open, None
        if group is None:
            return []
        if len(self.judged) >= GROUPS_KEPT:
            del self.judged[0]
        self.judged.append(group)
        return group.judge()


class Ledger:
    """Each node's records per group of overlapping windows, to tell a resend, the parts of a window and a
    conflict apart. `admit` hands back the records judged so far; `slice_read` and `flush` the rest.
    Memory: one open group per node and slice being read, and a few judged ones."""

    def __init__(self, slice_size_s: int, slice_origin: int) -> None:
        self._size, self._origin = slice_size_s, slice_origin
        self._nodes: dict[str, dict[int, _NodeSlice]] = {}

    def _slice(self, node: str, start: int, out: list[Judged]) -> _NodeSlice:
        slices = self._nodes.setdefault(node, {})
        index = (start - self._origin) // self._size  # as Period.slice_of: the reader's slice
        found = slices.pop(index, None)  # re-inserted last: the slices read longest ago go first
        if found is None and len(slices) >= SLICES_KEPT:
            out.extend(slices.pop(next(iter(slices))).close())  # no `slice_read` told: judged when dropped
        slices[index] = found = found or _NodeSlice()
        return found

    def admit(self, r: UsageRecord, gpus: NodeGpus | None) -> list[Judged]:
        """`r` (within its own bounds: `check`) joins its group; what could be judged now comes back."""
        count, out = gpus.count if gpus else MAX_NODE_GPUS, list[Judged]()
        part = self._slice(r.node, r.start, out)
        group = part.open
        if group is None or r.start >= group.end:  # the node's records have moved past the open group
            out.extend(part.close())
            group = part.open = _Group(r, count)
        elif not group.overlaps(r):  # before it: out of order (not from FilterLogEvents)
            return out + self._late(part, r, count)
        if r.digest in group.digests:
            return [*out, (r, RESENT)]
        group.digests.add(r.digest)
        if group.verdict is False:  # already a conflict (too many records)
            return [*out, *_alone(r, "a window already flagged for holding too many records")]
        group.add(r, count)
        if len(group.records) >= MAX_GROUP_RECORDS:
            out.extend(group.judge(forced=True))
        return out

    def _late(self, part: _NodeSlice, r: UsageRecord, count: int) -> list[Judged]:
        """A record read after its group was judged: counted if it fits with it, else flagged alone."""
        group = next((g for g in reversed(part.judged) if g.overlaps(r)), None)
        if group is None:
            group = _Group(r, count)
            group.add(r, count)
            group.digests.add(r.digest)
            part.judged.append(group)
            return group.judge()
        if r.digest in group.digests:
            return [(r, RESENT)]
        group.digests.add(r.digest)
        if group.verdict:
            kept = (group.start, group.end, group.count, dict(group.held))
            group.add(r, count)
            group.records.clear()
            group.hold(r)
            if group.over() is None:
                return [(r, None)]
            group.start, group.end, group.count, group.held = kept
        return _alone(r, "read after the other records of its window were judged")

    def slice_read(self, index: int) -> list[Judged]:
        """The reader is done with slice `index`: every group in it is complete."""
        out: list[Judged] = []
        for slices in self._nodes.values():
            part = slices.pop(index, None)
            if part is not None:
                out.extend(part.close())
        return out

    def flush(self) -> list[Judged]:
        """Judge every group still open (the records have all been read)."""
        out = [j for slices in self._nodes.values() for part in slices.values() for j in part.close()]
        self._nodes.clear()
        return out


def _alone(r: UsageRecord, why: str) -> list[Judged]:
    return [(r, Verdict(FlagKind.CONFLICT, f"{why}; not counted", claimed(r), 0.0))]
