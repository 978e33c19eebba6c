"""Send closed windows to CloudWatch: one gzip-compressed PutMetricData per flush (<= 1,000 datums),
exponential backoff with jitter when it fails, and a bounded buffer of unsent windows that are resent
with their original timestamps once CloudWatch answers again (oldest dropped first, said in the log).

The service sends from its own thread (`start_background`), so a slow or hanging network never holds up
the sampling loop; tests, the rehearsal and the benchmarks drive a simulated clock and flush inline.
A window CloudWatch refuses for its content (400 InvalidParameterValue and the like: sending it again
can never succeed) is dropped and logged on its own, so it does not block the windows behind it.
Python >= 3.9.
"""

import logging
import random
import threading
from collections import deque
from datetime import datetime, timedelta
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from gpufleet_node import schema

log = logging.getLogger("gpufleet.publisher")

MAX_DATUMS_PER_CALL = 1000
# 400s that say nothing about the metrics themselves: credentials, signing, clock, throttling. They are
# retried with backoff like a network failure; any other 400 (or 413) rejects the request's content.
RETRYABLE_CLIENT_ERRORS = frozenset(
    (
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
        "RequestTimeTooSkewed",
        "InvalidSignatureException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "AccessDenied",
        "AccessDeniedException",
    )
)

Window = Tuple[datetime, List[Dict[str, Any]]]


def _client(service: str, region: str, endpoint_url: Optional[str], **config: Any) -> Any:
    """boto3 with standard retries and short timeouts (the sender's own backoff does the rest)."""
    import boto3
    from botocore.config import Config

    settings = Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5, read_timeout=10, **config)
    return boto3.client(service, region_name=region, endpoint_url=endpoint_url, config=settings)


def cloudwatch_client(region: str, endpoint_url: Optional[str] = None) -> Any:
    """Request compression for every PutMetricData body (botocore gzips PutMetricData when the body
    reaches `request_min_compression_size_bytes`)."""
    return _client(
        "cloudwatch", region, endpoint_url, request_min_compression_size_bytes=1, disable_request_compression=False
    )


def logs_client(region: str, endpoint_url: Optional[str] = None) -> Any:
    """CloudWatch Logs for the usage records."""
    return _client("logs", region, endpoint_url)


def _error(exc: BaseException) -> Tuple[Optional[int], str]:
    """(HTTP status, error code) of an AWS error botocore raised; (None, "") for anything else."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, ""
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode"), str(response.get("Error", {}).get("Code", ""))


def rejected(exc: BaseException) -> bool:
    """True when CloudWatch read the request and refused what it says (resending cannot succeed)."""
    status, code = _error(exc)
    return status in (400, 413) and code not in RETRYABLE_CLIENT_ERRORS


class Sender:
    what = "PutMetricData"  # the call, as logs name it
    max_per_call = MAX_DATUMS_PER_CALL

    def __init__(
        self,
        cloudwatch: Any,
        max_buffer_age: timedelta = timedelta(hours=2),
        base_backoff_s: float = 5.0,
        max_backoff_s: float = 300.0,
        rng: Optional[random.Random] = None,
    ) -> None:
        self.cloudwatch = cloudwatch
        self.max_buffer_age = max_buffer_age
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.rng = rng or random.Random()
        self.buffer: Deque[Window] = deque()
        self.failures = 0
        self.next_attempt: Optional[datetime] = None
        self.calls = 0
        self.dropped_windows = 0
        self.rejected_windows = 0
        self._buffer_lock = threading.Lock()  # the sampling thread appends, the sending thread pops
        self._flush_lock = threading.Lock()  # one flush at a time (the thread, or the last one at exit)
        self._loop: Optional[_SendLoop] = None

    def enqueue(self, window_time: datetime, datums: List[Dict[str, Any]]) -> None:
        if datums:
            with self._buffer_lock:
                self.buffer.append((window_time, datums))

    def submit(self, window_time: datetime, datums: List[Dict[str, Any]], now: datetime) -> None:
        """A closed window: handed to the sending thread when there is one (never blocks), else sent now."""
        self.enqueue(window_time, datums)
        if self._loop is not None:
            self._loop.wake()
        else:
            self.flush(now)

    def start_background(self, clock: Callable[[], datetime], poll_s: float = 5.0) -> None:
        """Send from a thread of its own from now on; it also retries after backoff without new windows."""
        if self._loop is None:
            self._loop = _SendLoop(self, clock, poll_s)
            self._loop.start()

    def stop_background(self, now: datetime, timeout_s: float = 10.0) -> None:
        """Stop the thread (waiting at most `timeout_s` for a send in flight), then one last attempt."""
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop(timeout_s)
        if self._flush_lock.acquire(timeout=timeout_s):  # a hung send still holds it: give up, exit
            self._flush_lock.release()
            self.flush(now)

    def _drop_expired(self, now: datetime) -> None:
        with self._buffer_lock:
            while self.buffer and now - self.buffer[0][0] > self.max_buffer_age:
                when, datums = self.buffer.popleft()
                self.dropped_windows += 1
                log.warning(
                    "dropping the unsent metrics of %s (%d datums): older than %s, CloudWatch unreachable",
                    when.isoformat(),
                    len(datums),
                    self.max_buffer_age,
                )

    def _next_batch(self) -> List[Window]:
        """The oldest windows that fit one call (a window alone when it is bigger than that)."""
        batch: List[Window] = []
        size = 0
        with self._buffer_lock:
            for window in self.buffer:
                if batch and size + len(window[1]) > self.max_per_call:
                    break
                batch.append(window)
                size += len(window[1])
        return batch

    def _pop(self, n: int) -> None:
        with self._buffer_lock:
            for _ in range(n):
                self.buffer.popleft()

    def _put(self, datums: List[Dict[str, Any]]) -> None:
        for i in range(0, len(datums), self.max_per_call):  # one oversized window: split
            self.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=datums[i : i + self.max_per_call])
            self.calls += 1

    def flush(self, now: datetime) -> int:
        """Send what is buffered, oldest first, as few calls as the 1,000-datum limit allows.
        Returns the datums sent; stops at the first retryable failure and backs off."""
        with self._flush_lock:
            self._drop_expired(now)
            if self.next_attempt is not None and now < self.next_attempt:
                return 0
            sent = 0
            while True:
                batch = self._next_batch()
                if not batch:
                    return sent
                try:
                    self._put([d for _, datums in batch for d in datums])
                except Exception as exc:  # network, throttling after boto3's retries, credentials, content
                    if not rejected(exc):
                        self._back_off(now, exc)
                        return sent
                    done, ok = self._one_by_one(batch, now, exc)
                    sent += done
                    if not ok:
                        return sent
                    continue
                self._pop(len(batch))
                sent += sum(len(datums) for _, datums in batch)
                self._recovered(sent)

    def _one_by_one(self, batch: List[Window], now: datetime, exc: BaseException) -> Tuple[int, bool]:
        """A refused batch: send its windows one at a time and drop only those refused on their own.
        Returns (datums sent, False if a retryable failure stopped it)."""
        sent = 0
        for when, datums in batch:
            if len(batch) > 1:
                try:
                    self._put(datums)
                    self._pop(1)
                    sent += len(datums)
                    continue
                except Exception as again:
                    if not rejected(again):
                        self._back_off(now, again)
                        return sent, False
                    exc = again
            self._pop(1)
            self.rejected_windows += 1
            log.error(
                "CloudWatch refused the metrics of %s (%d datums): %s; dropped, sending them again cannot succeed",
                when.isoformat(),
                len(datums),
                exc,
            )
        self._recovered(sent)
        return sent, True

    def _back_off(self, now: datetime, exc: BaseException) -> None:
        self.failures += 1
        delay = min(self.max_backoff_s, self.base_backoff_s * 2 ** (self.failures - 1))
        delay = self.rng.uniform(delay / 2, delay)  # jitter, so a fleet does not retry in step
        self.next_attempt = now + timedelta(seconds=delay)
        log.warning(
            "%s failed (%s: %s); %d window(s) buffered, next try in %.0f s",
            self.what,
            type(exc).__name__,
            exc,
            len(self.buffer),
            delay,
        )

    def _recovered(self, sent: int) -> None:
        if self.failures:
            log.info("CloudWatch reachable again; sent %d buffered datums", sent)
        self.failures = 0
        self.next_attempt = None


class LogSender(Sender):
    """Usage records to CloudWatch Logs (PutLogEvents), with the same buffer, backoff and thread as the
    metrics. Items are log events {"timestamp": ms, "message": text}. The log stream (the instance id) is
    created on first use; a missing log group is retried with backoff and said in the log, since records
    sent later still count."""

    what = "PutLogEvents"
    max_per_call = 500  # and at most MAX_LOG_BATCH_BYTES per call (a record is up to 200 KB, usually < 2 KB)

    def __init__(self, logs: Any, group: str, stream: str, **kwargs: Any) -> None:
        super().__init__(logs, **kwargs)
        self.group = group
        self.stream = stream

    def _put(self, datums: List[Dict[str, Any]]) -> None:
        events = sorted(datums, key=lambda e: e["timestamp"])  # PutLogEvents wants them in order
        for chunk in _by_size(events, self.max_per_call):
            try:
                answer = self._put_events(chunk)
            except Exception as exc:
                if _error(exc)[1] != "ResourceNotFoundException":
                    raise
                self._create_stream()  # the first record of this instance: its stream is made once
                answer = self._put_events(chunk)
            self.calls += 1
            rejected_info = (answer or {}).get("rejectedLogEventsInfo")
            if rejected_info:  # too old (> 14 days, or past retention) or > 2 h ahead: a skewed clock
                self.rejected_windows += 1
                log.error("CloudWatch Logs refused some usage records as out of its time window: %s", rejected_info)

    def _put_events(self, chunk: List[Dict[str, Any]]) -> Any:
        return self.cloudwatch.put_log_events(logGroupName=self.group, logStreamName=self.stream, logEvents=chunk)

    def _create_stream(self) -> None:
        try:
            self.cloudwatch.create_log_stream(logGroupName=self.group, logStreamName=self.stream)
        except Exception as exc:
            code = _error(exc)[1]
            if code == "ResourceAlreadyExistsException":
                return
            if code == "ResourceNotFoundException":  # retryable: the stack may be deployed later
                raise RuntimeError(
                    "log group %s does not exist: deploy the gpufleet stack (it creates it) or set usage_log_group"
                    % self.group
                ) from None
            raise


MAX_LOG_BATCH_BYTES = 1_000_000  # PutLogEvents: 1,048,576 bytes, counting 26 per event


def _by_size(events: List[Dict[str, Any]], most: int) -> List[List[Dict[str, Any]]]:
    """Consecutive batches within PutLogEvents' limits (event count and bytes)."""
    batches: List[List[Dict[str, Any]]] = [[]]
    size = 0
    for event in events:
        length = len(event["message"].encode()) + 26
        if batches[-1] and (len(batches[-1]) >= most or size + length > MAX_LOG_BATCH_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(event)
        size += length
    return [b for b in batches if b]


class _SendLoop:
    """The sending thread: flushes when a window arrives and every `poll_s` (so backoff expires without
    new windows). Errors are logged, never raised: the thread must outlive any one bad flush."""

    def __init__(self, sender: Sender, clock: Callable[[], datetime], poll_s: float) -> None:
        self.sender = sender
        self.clock = clock
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cloudwatch-sender", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.poll_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.sender.flush(self.clock())
            except Exception:  # a bug here must not end sending for good
                log.exception("sending metrics failed")
