"""What a usage record may claim, alone and with the node's other records of its window. Pure.

A node's role may write any stream of the usage log group: IAM cannot scope PutLogEvents to a stream
named after the caller (docs/report.md, "What a record is trusted with"). So a record is a claim, and
the report sums only what the node it names could have done; the rest is flagged with its stream, never
summed:
- written to its own node's stream (the publisher writes to a stream named after its instance id);
- stamped with its window's start (the publisher stamps it so: a window's records then all lie in one
  time slice of the reader, next to each other, since FilterLogEvents returns events by timestamp);
- a window a node writes: at most MAX_WINDOW_S long, on its own grid (gpufleet_node.config's windows
  all divide an hour);
- no more GPUs than a node of its type has: the price table's count, else the policy's for its group
  (report.prices), else MAX_NODE_GPUS; never the record's own `gpus`;
- no GPU held longer than the window, give or take one sample (`slack`).
Then the node's records of one window (and of one hour) together: an identical record again (same
content, whatever its bytes) is a resend, counted once; a different one is counted while the window
still has room (a record split in parts, a node restarted mid-window) and is a conflict once it has none.
Which of two conflicting records is true cannot be told from them: the first read is counted, the other
flagged, and the finding names the stream to look at.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from gpufleet_tools.report.model import HOUR, FlagKind
from gpufleet_tools.report.prices import NodeGpus
from gpufleet_tools.report.records import UsageRecord

MAX_WINDOW_S = 3600  # the longest usage_window_s a node writes (gpufleet_node.config)
SAMPLE_SLACK_S = 60.0  # a window's first sample stands for the time since the last one: up to one interval
SLACK_SHARE = 0.01  # and rounding (0.1 s a row) and clock jitter
MAX_NODE_GPUS = 16  # a type neither the table nor the policy knows (EC2's GPU instances have 8 at most)
WINDOWS_KEPT = 32  # per node and time slice: a window's records come next to each other (by timestamp)
HOURS_KEPT = 4  # per node and time slice
SLICES_KEPT = 16  # per node: the slices being read side by side (--workers), and a few more


def slack(seconds: float) -> float:
    """How far past `seconds` an honest node's GPU time in a window can go."""
    return SAMPLE_SLACK_S + SLACK_SHARE * seconds


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


def claimed(r: UsageRecord) -> float:
    """The GPU-seconds a record claims (held, allocated or not)."""
    return sum(row.held_s for row in r.rows)


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
    if r.seconds > MAX_WINDOW_S or r.start % r.seconds:
        detail = (
            f"a {r.seconds:,} s window at {r.start} (nodes write windows of at most {MAX_WINDOW_S} s, on their grid)"
        )
        return Verdict(FlagKind.WINDOW, detail, claim, bound)
    per_gpu: dict[int, float] = {}
    for row in r.rows:
        per_gpu[row.gpu] = per_gpu.get(row.gpu, 0.0) + row.held_s
    top = max(per_gpu, default=-1)
    if r.gpus > count or top >= count:
        said = f"{r.gpus:,} GPUs" if r.gpus > count else f"GPU index {top:,}"
        return Verdict(FlagKind.GPUS, f"claims {said}; {_gpus_text(r, gpus)}", claim, bound)
    held, gpu = max((held, gpu) for gpu, held in per_gpu.items()) if per_gpu else (0.0, 0)
    if held > r.seconds + slack(r.seconds):
        return Verdict(FlagKind.HELD, f"GPU {gpu} held {held:,.0f} s in a {r.seconds} s window", claim, bound)
    return None


class _Window:
    __slots__ = ("digests", "room")

    def __init__(self, room: float, digest: int) -> None:
        self.room = room  # GPU-seconds of the window the node's counted records have not claimed yet
        self.digests = {digest}


class _Slice:
    """One node's recent windows and hours in one time slice of the reader."""

    __slots__ = ("hours", "windows")

    def __init__(self) -> None:
        self.windows: dict[int, _Window] = {}
        self.hours: dict[int, float] = {}  # hour start -> GPU-seconds of it not claimed yet


K = TypeVar("K")
V = TypeVar("V")


def _remember(kept: dict[K, V], key: K, value: V, most: int) -> V:
    if len(kept) >= most:
        del kept[next(iter(kept))]  # the oldest read: records come by timestamp within a slice
    kept[key] = value
    return value


class Ledger:
    """What each node's counted records already claim, per window and per hour, to tell a resend, a
    second part of a window and a conflict apart. Memory: a few windows per node and slice being read."""

    def __init__(self, slice_size_s: int, period_start: int) -> None:
        self._size, self._origin = slice_size_s, period_start
        self._nodes: dict[str, dict[int, _Slice]] = {}

    def _slice(self, node: str, start: int) -> _Slice:
        slices = self._nodes.setdefault(node, {})
        index = (start - self._origin) // self._size
        found = slices.pop(index, None)  # re-inserted last: the slices read longest ago go first
        return _remember(slices, index, found or _Slice(), SLICES_KEPT)

    def admit(self, r: UsageRecord, gpus: NodeGpus | None, claim: float) -> Verdict | Resent | None:
        """None: count it (and it is counted from now on); RESENT: seen; a Verdict: a conflict."""
        count = gpus.count if gpus else MAX_NODE_GPUS
        part = self._slice(r.node, r.start)
        window = part.windows.get(r.start)
        if window is not None and r.digest in window.digests:
            return RESENT
        hour = r.start // HOUR * HOUR
        hour_room = part.hours.get(hour)
        if hour_room is None:
            hour_room = _remember(part.hours, hour, float(count * HOUR), HOURS_KEPT)
        room = window.room if window is not None else float(count * r.seconds)
        if claim > room + count * slack(r.seconds) or claim > hour_room + count * slack(HOUR):
            if claim > room + count * slack(r.seconds):
                detail = "a second record of a window the node's records already fill, with other content"
            else:
                detail = "windows that overlap others of the same node: its hour is already full"
            bound = max(0.0, min(room, hour_room))
            return Verdict(FlagKind.CONFLICT, detail + "; the first read is counted", claim, bound)
        if window is None:
            window = _remember(part.windows, r.start, _Window(room, r.digest), WINDOWS_KEPT)
        window.room -= claim
        window.digests.add(r.digest)
        part.hours[hour] = hour_room - claim
        return None
