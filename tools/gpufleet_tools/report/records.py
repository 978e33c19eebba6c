"""One usage record (a log event's message) checked and typed. Pure.

A record that is not JSON, carries another version or lacks a field is skipped with its reason, never
raised: one bad node must not hide the fleet's report. Who a workload is (key, team, label) comes from
the node publisher's own model through `identify`, which the caller passes in (report.identity): pure
modules share only gpufleet_node.schema with the node. A record keeps the log stream it was read from
and its event's timestamp: what it says is checked against where it was written (report.bounds).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from gpufleet.domain.values import is_storable
from gpufleet_node.schema import USAGE_RECORD_VERSION, USAGE_ROW_FIELDS


class WorkloadKind(StrEnum):
    """gpufleet_node.workload.KINDS, in its order (checked by report.identity)."""

    POD = "pod"
    SLURM = "slurm"
    UNIT = "unit"
    USER = "user"
    UNKNOWN = "unknown"


# What decides who pays, past the node's key: a pod's key holds its namespace (its team) and a user's its
# user, but a Slurm job's key is `slurm:<job>` and a unit's `unit:<name>`, while the job is billed to its
# user, account or partition (--by) and the unit to its user. A record that changes only these says
# something else than the node's: not a resend, and not the same line of the report.
PAYER_FIELDS = ("user", "account", "partition")


@dataclass(frozen=True, slots=True)
class WorkloadId:
    """A workload as the report shows it: `key` the node's key, `team` who pays, `line` what usage is
    summed and a resend told by: the key and every PAYER_FIELDS value (one job billed to two users in
    the records is two lines, never the first one read)."""

    key: str
    team: str
    label: str  # "team-a/trainer-0 (main)", "Slurm job 4242 (alice)"
    kind: WorkloadKind
    line: str  # key and payer fields (report.identity)

    @property
    def subject(self) -> str:
        """How a finding names it: `pod team-a/trainer-0 (main)`, `Slurm job 4242 (alice)`."""
        if self.kind is WorkloadKind.POD and not self.label.startswith("pod "):
            return f"pod {self.label}"
        return self.label


Identify = Callable[[Mapping[str, Any]], WorkloadId]


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One GPU held by one workload (None: by nobody) in one window; seconds and MiB as written."""

    gpu: int
    workload: WorkloadId | None
    held_s: float
    busy_s: float
    idle_s: float
    peak_mib: float


@dataclass(frozen=True, slots=True)
class UsageRecord:
    start: int  # window start, epoch seconds (UTC)
    seconds: int
    node: str
    instance_type: str
    group: str | None  # "asg:NAME" | "eks:CLUSTER/NODEGROUP"
    gpus: int
    rows: tuple[UsageRow, ...]
    gone: tuple[tuple[str, str], ...]  # (what, why): what the node could not know in this window
    digest: int  # of the content, not the bytes: a resend with a space added is still the same record
    stream: str | None = None  # the log stream it was read from (None: not read from CloudWatch Logs)
    stamp_ms: int | None = None  # its log event's timestamp (the node stamps it with the window's start)


class SkipReason(StrEnum):
    NOT_JSON = "not JSON"
    VERSION = "another record version"
    MALFORMED = "missing or malformed fields"


@dataclass(frozen=True, slots=True)
class Skipped:
    reason: SkipReason
    detail: str


class _Bad(ValueError):
    pass


# The node model's ("kind", *gpufleet_node.workload.RECORDED): a pure module shares only gpufleet_node.schema
# with the node, so report.identity, which imports the model, checks this copy (and WorkloadKind's) on import.
WORKLOAD_FIELDS = ("kind", "namespace", "pod", "container", "pod_uid", "job_id", "unit", "user", "account", "partition")


def _number(value: Any, what: str) -> float:
    """A finite float >= 0; an integer past a float's range (JSON has no bound) is refused here, not by
    an OverflowError later."""
    try:
        number = math.nan if isinstance(value, bool) or not isinstance(value, int | float) else float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number) or number < 0:
        raise _Bad(f"{what} is not a number >= 0 (got {value!r:.40})")
    return number


def _utf8(text: str, what: str) -> str:
    """Text the report keeps and writes out as UTF-8: a lone surrogate (JSON's \\ud800 escape) cannot be."""
    if not is_storable(text):
        raise _Bad(f"{what} holds a lone surrogate (not UTF-8 text)")
    return text


def _text(doc: Mapping[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value:
        raise _Bad(f"{key} is missing or not a string")
    return _utf8(value, key)


def _start(text: str) -> int:
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise _Bad(f"start is not an ISO 8601 time (got {text!r:.40})") from None
    return int((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp())


def _content(row: UsageRow) -> tuple[Any, ...]:
    """What a row says (a workload by its key and payer, not its reference in the record): a resend with
    other bytes or other references is the same record; one with another payer is not."""
    return (row.gpu, row.workload.line if row.workload else None, row.held_s, row.busy_s, row.idle_s, row.peak_mib)


class RecordParser:
    """Parses messages into records; remembers each workload identity it has seen (a fleet's records
    name the same few thousand workloads millions of times)."""

    def __init__(self, identify: Identify) -> None:
        self._identify = identify
        self._known: dict[tuple[Any, ...], WorkloadId] = {}

    def parse(self, message: str, stream: str | None = None, stamp_ms: int | None = None) -> UsageRecord | Skipped:
        """`stream` and `stamp_ms`: where and when the log event says it was written (report.reader)."""
        try:
            doc = json.loads(message)
        except (ValueError, TypeError):
            return Skipped(SkipReason.NOT_JSON, message[:60])
        except RecursionError:
            return Skipped(SkipReason.NOT_JSON, "JSON nested deeper than the parser goes")
        if not isinstance(doc, dict):
            return Skipped(SkipReason.NOT_JSON, f"a JSON {type(doc).__name__}, not an object")
        if doc.get("v") != USAGE_RECORD_VERSION:
            return Skipped(SkipReason.VERSION, f"v={doc.get('v')!r:.20}")
        try:
            return self._record(doc, stream, stamp_ms)
        except _Bad as exc:
            return Skipped(SkipReason.MALFORMED, str(exc))

    def _record(self, doc: dict[str, Any], stream: str | None, stamp_ms: int | None) -> UsageRecord:
        seconds, gpus, group = doc.get("s"), doc.get("gpus"), doc.get("group")
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds <= 0:
            raise _Bad("s (window seconds) is not a positive integer")
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
            raise _Bad("gpus is not an integer >= 0")
        if group is not None and not isinstance(group, str):
            raise _Bad("group is not a string or null")
        refs, rows, gone = doc.get("w", {}), doc.get("u"), doc.get("gone", {})
        if not isinstance(refs, dict) or not isinstance(rows, list) or not isinstance(gone, dict):
            raise _Bad("w, u or gone has the wrong type")
        workloads = {str(ref): self._workload(w) for ref, w in refs.items()}
        start, node, itype = _start(_text(doc, "start")), _text(doc, "node"), _text(doc, "type")
        typed = tuple(self._row(raw, workloads) for raw in rows)
        said = tuple(sorted((_utf8(str(k), "gone"), _utf8(str(v), "gone")) for k, v in gone.items()))
        group = _utf8(group, "group") if group else None
        return UsageRecord(
            start=start,
            seconds=seconds,
            node=node,
            instance_type=itype,
            group=group,
            gpus=gpus,
            rows=typed,
            gone=said,
            digest=hash((start, seconds, node, itype, group, gpus, said, *map(_content, typed))),
            stream=stream,
            stamp_ms=stamp_ms,
        )

    def _workload(self, doc: Any) -> WorkloadId:
        if not isinstance(doc, dict):
            raise _Bad("a workload in w is not an object")
        fields = tuple(doc.get(f) for f in WORKLOAD_FIELDS)
        if any(v is not None and not isinstance(v, str) for v in fields):
            raise _Bad("a workload field in w is not a string")
        found = self._known.get(fields)
        if found is None:
            for name, value in zip(WORKLOAD_FIELDS, fields, strict=True):
                if value is not None:
                    _utf8(value, f"workload field {name}")
            found = self._known[fields] = self._identify(doc)
        return found

    @staticmethod
    def _row(raw: Any, workloads: dict[str, WorkloadId]) -> UsageRow:
        if not isinstance(raw, list) or len(raw) != len(USAGE_ROW_FIELDS):
            raise _Bad(f"a usage row is not [{', '.join(USAGE_ROW_FIELDS)}]")
        gpu, ref, held, busy, idle, peak = raw
        if isinstance(gpu, bool) or not isinstance(gpu, int) or gpu < 0:
            raise _Bad(f"gpu index is not an integer >= 0 (got {gpu!r:.20})")
        workload = None
        if ref is not None:
            workload = workloads.get(str(ref))
            if workload is None:
                raise _Bad(f"usage row names workload {ref!r:.20}, not in w")
        held_s = _number(held, "held seconds")
        # Busy and idle count within the time the workload held the GPU: on a time-sliced GPU a workload
        # busier than its even share of the time is busy all of its share, never more.
        return UsageRow(
            gpu=gpu,
            workload=workload,
            held_s=held_s,
            busy_s=min(_number(busy, "busy seconds"), held_s),
            idle_s=min(_number(idle, "idle seconds"), held_s),
            peak_mib=_number(peak or 0, "peak MiB"),
        )
