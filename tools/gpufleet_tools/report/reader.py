"""Reads the usage records of a period from CloudWatch Logs (FilterLogEvents), page by page.

A node stamps each record's log event with its window's start, so the period's records are exactly the
events with a timestamp in [start, end). The period is cut into time slices (a day, or an hour for a
period under two days) that `workers` threads page through side by side: one chain of nextTokens waits
on each call's latency, several fill FilterLogEvents' quota (5 calls per second per account and Region,
not adjustable) instead. A shared rate limiter keeps all threads under `max_tps`, and botocore's standard
retries absorb the odd throttle. Pages are parsed and summed on the calling thread as they arrive, so
memory holds the sums, never the records. Each record goes on with its log stream and its event's
timestamp: a record is a claim, and where it was written is what the report checks it against
(report.bounds).

With --group/--cluster a JSON filter pattern asks CloudWatch for those groups' records only (it still
scans the whole log group; fewer bytes come back). The records are checked again here either way.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpufleet_node.schema import USAGE_LOG_GROUP
from gpufleet_tools.report.model import Period, Selection

DEFAULT_WORKERS = 4
FILTER_LOG_EVENTS_TPS = 5.0  # the account's FilterLogEvents quota per Region (AWS knowledge center)


class ReportUnavailable(Exception):
    """Why the records cannot be read, in one line; `code` is the exit code."""

    def __init__(self, line: str, code: int) -> None:
        super().__init__(line)
        self.code = code


@dataclass
class ReadStats:
    calls: int = 0  # FilterLogEvents requests
    events: int = 0
    bytes: int = 0  # of the messages (UTF-8)
    slices: int = 0
    seconds: float = 0.0


def json_filter(selection: Selection) -> str | None:
    """`{ ($.group = "asg:train") || ($.group = "eks:ml/*") }`, or None: every group, or a name that
    cannot go into a pattern unescaped."""
    values = sorted(selection.groups) + [f"eks:{c}/*" for c in sorted(selection.clusters)]
    if not values or any(ch in v for v in values for ch in '"\\') or any("*" in g for g in selection.groups):
        return None
    return "{ " + " || ".join(f'($.group = "{v}")' for v in values) + " }"


# (log stream, event timestamp in epoch ms, message) of one usage record
OnRecord = Callable[[str, int, str], None]
# [start, end) in epoch ms of a slice read to its end: no record of it comes after
OnSlice = Callable[[int, int], None]


def slices(period: Period) -> list[tuple[int, int]]:
    """[start, end) in epoch milliseconds, one per day (per hour under two days), cut on whole hours
    from `period.slice_origin`: the records of one window, and of windows that overlap it, are then all
    in one slice, next to each other (report.bounds judges them together)."""
    size, origin = period.slice_s * 1000, period.slice_origin * 1000
    start, end = int(period.start.timestamp() * 1000), int(period.end.timestamp() * 1000)
    cuts = range(origin + size, end, size)
    return list(zip([start, *cuts], [*cuts, end], strict=True))


class _RateLimit:
    """At most `per_second` calls a second across threads."""

    def __init__(self, per_second: float) -> None:
        self.interval = 1.0 / per_second
        self.next = 0.0
        self.lock = threading.Lock()

    def wait(self) -> None:
        with self.lock:
            now = time.monotonic()
            at = max(now, self.next)
            self.next = at + self.interval
        if at > now:
            time.sleep(at - now)


@dataclass(frozen=True)
class _Done:
    span: tuple[int, int]


def _put(pages: queue.Queue[Any], item: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            pages.put(item, timeout=0.2)
            return
        except queue.Full:
            continue


def _read_slice(
    client: Any,
    log_group: str,
    span: tuple[int, int],
    pattern: str | None,
    limit: _RateLimit,
    pages: queue.Queue[Any],
    stop: threading.Event,
) -> None:
    """Every page of one slice into `pages`, then _Done (or the exception that stopped it)."""
    try:
        args: dict[str, Any] = {"logGroupName": log_group, "startTime": span[0], "endTime": span[1] - 1}
        if pattern:
            args["filterPattern"] = pattern
        while not stop.is_set():
            limit.wait()
            page = client.filter_log_events(**args)
            events = [
                (e.get("logStreamName", ""), e.get("timestamp", 0), e.get("message", ""))
                for e in page.get("events", ())
            ]
            _put(pages, events, stop)
            token = page.get("nextToken")
            if not token:
                break
            args["nextToken"] = token
        _put(pages, _Done(span), stop)
    except Exception as exc:  # handed to the reading thread, which says it in one line
        _put(pages, exc, stop)


def _unavailable(exc: Exception, log_group: str) -> ReportUnavailable:
    from gpufleet.aws.clients import error_code

    code = error_code(exc)
    if code == "ResourceNotFoundException":
        return ReportUnavailable(
            f"no log group {log_group}: usage attribution is off on the nodes (`attribution` in the publisher "
            "config) or no node has written a usage record yet",
            1,
        )
    if code in ("NoCredentialsError", "PartialCredentialsError"):
        return ReportUnavailable("no AWS credentials: set a profile or keys (or --endpoint for moto server)", 2)
    if code in ("AccessDeniedException", "AccessDenied"):
        return ReportUnavailable(f"not allowed to read {log_group}: the caller needs logs:FilterLogEvents on it", 2)
    return ReportUnavailable(f"cannot read {log_group}: {code}: {str(exc)[:200]}", 2)


def _consume(
    pages: queue.Queue[Any], slices_left: int, stats: ReadStats, on: tuple[OnRecord, OnSlice | None], bar: Any
) -> Exception | None:
    """Pages into `on_record` until every slice is done; the first failure stops it and is returned."""
    on_record, on_slice = on
    while slices_left:
        item = pages.get()
        if isinstance(item, _Done):
            slices_left -= 1
            bar.update(1)
            if on_slice is not None:
                on_slice(*item.span)
        elif isinstance(item, Exception):
            return item
        else:
            stats.calls += 1
            stats.events += len(item)
            for stream, stamp, message in item:
                stats.bytes += len(message.encode())
                on_record(stream, stamp, message)
            bar.set_postfix(records=stats.events, pages=stats.calls, refresh=False)
    return None


def read_usage(
    client: Any,
    period: Period,
    selection: Selection,
    on_record: OnRecord,
    *,
    log_group: str = USAGE_LOG_GROUP,
    workers: int = DEFAULT_WORKERS,
    max_tps: float = FILTER_LOG_EVENTS_TPS,
    progress: bool = False,
    on_slice: OnSlice | None = None,
) -> ReadStats:
    """Every record of the period to `on_record(stream, timestamp_ms, message)`, on this thread, and
    `on_slice(start_ms, end_ms)` when a slice has been read to its end (UsageSums.slice_read: its windows
    are judged then and let go); raises ReportUnavailable."""
    from tqdm import tqdm

    from gpufleet.aws.clients import AWS_FAILURES  # botocore's exceptions, imported when reading

    spans = slices(period)
    stats = ReadStats(slices=len(spans))
    pages: queue.Queue[Any] = queue.Queue(maxsize=max(2, workers * 4))
    stop, limit, pattern = threading.Event(), _RateLimit(max_tps), json_filter(selection)
    started = time.perf_counter()
    bar = tqdm(
        total=len(spans),
        unit="slice",
        desc="reading usage records",
        file=sys.stderr,
        leave=False,
        delay=0.5,  # only when the reading takes a while
        disable=not (progress and sys.stderr.isatty()),
    )
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(spans)))) as pool:
        for span in spans:
            pool.submit(_read_slice, client, log_group, span, pattern, limit, pages, stop)
        try:
            failure = _consume(pages, len(spans), stats, (on_record, on_slice), bar)
        finally:
            stop.set()  # the other slices stop at their next page
            bar.close()
    stats.seconds = time.perf_counter() - started
    if failure is not None:
        if isinstance(failure, AWS_FAILURES):
            raise _unavailable(failure, log_group) from None
        raise failure
    return stats
