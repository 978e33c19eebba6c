"""Send closed windows to CloudWatch: one gzip-compressed PutMetricData per flush (<= 1,000 datums),
exponential backoff with jitter when it fails, and a bounded buffer of unsent windows that are resent
with their original timestamps once CloudWatch answers again (oldest dropped first, said in the log).

The service sends from its own thread (`start_background`), so a slow or hanging network never holds up
the sampling loop; tests, the rehearsal and the benchmarks drive a simulated clock and flush inline.
A window CloudWatch refuses for its content (400 InvalidParameterValue and the like: sending it again
can never succeed) is dropped and logged on its own, so it does not block the windows behind it. A datum
botocore refuses before sending (ParamValidationError) is dropped alone: the rest of its window still goes.
A buffered window's age is the time it has waited, on the monotonic clock once the service sends from its
thread: a step of the wall clock (NTP, a VM resumed from suspend) is logged, never taken for an outage.
Python >= 3.9.
"""

import logging
import random
import threading
import time
from collections import deque
from datetime import datetime, timedelta
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

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

# A buffered window: its time, its datums, and when it was buffered on the sender's steady clock.
Buffered = Tuple[datetime, List[Dict[str, Any]], float]
WallClock = Callable[[], datetime]
Ticks = Callable[[], float]  # a monotonic clock, in seconds
# A gap between the wall and the monotonic clock this wide is a jump, not a late reading of `now`.
CLOCK_JUMP_S = 60.0


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


def caller_userid(region: str, endpoint_url: Optional[str] = None) -> Optional[str]:
    """This process's aws:userid ("ROLEID:i-..." on an instance profile), from sts:GetCallerIdentity, which
    needs no IAM permission; None (said once, here) when STS cannot be asked: the node then publishes
    without corroboration, and the OOM guard will not replace it for a GPU fault (docs/node-publisher.md)."""
    try:
        userid = _client("sts", region, endpoint_url).get_caller_identity().get("UserId")
    except Exception as exc:  # no network, no credentials yet: publish anyway, without corroboration
        log.warning(
            "sts:GetCallerIdentity failed (%s); publishing without GPU fault corroboration: the OOM guard will "
            "not replace this node for a GPU fault",
            exc,
        )
        return None
    return str(userid) if userid else None


def _error(exc: BaseException) -> Tuple[Optional[int], str]:
    """(HTTP status, error code) of an AWS error botocore raised; (None, "") for anything else."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None, ""
    return response.get("ResponseMetadata", {}).get("HTTPStatusCode"), str(response.get("Error", {}).get("Code", ""))


def client_side(exc: BaseException) -> bool:
    """True when botocore refused the request before sending it (ParamValidationError and its kin): the
    same request fails the same way every time, so it is never worth a retry."""
    try:
        from botocore.exceptions import ParamValidationError, ValidationError
    except ImportError:  # no botocore: nothing can raise them
        return False
    return isinstance(exc, (ParamValidationError, ValidationError))


def rejected(exc: BaseException) -> bool:
    """True when botocore or CloudWatch refused what the request says (resending cannot succeed)."""
    if client_side(exc):
        return True
    status, code = _error(exc)
    return status in (400, 413) and code not in RETRYABLE_CLIENT_ERRORS


def invalid_reports(client: Any, operation: str, requests: List[Dict[str, Any]]) -> Optional[List[str]]:
    """botocore's own validation report for each request ("" when it passes), from the client's model.
    None when the client has no model (a fake): then a bad datum cannot be told from its neighbours."""
    model = getattr(getattr(client, "meta", None), "service_model", None)
    if model is None:
        return None
    from botocore.validate import ParamValidator

    shape = model.operation_model(operation).input_shape
    validator = ParamValidator()
    reports = []
    for request in requests:
        errors = validator.validate(request, shape)
        reports.append(errors.generate_report() if errors.has_errors() else "")
    return reports


def split_invalid(
    client: Any,
    operation: str,
    request: Callable[[List[Dict[str, Any]]], Dict[str, Any]],
    batch: List[Buffered],
    exc: BaseException,
) -> Tuple[List[Buffered], int]:
    """A batch botocore refused, less the datums it refuses on their own (said once per window), and how
    many those are: 0 when none can be told apart (a client without botocore's model, or a request
    refused only as a whole), so the caller falls back to dropping whole windows."""
    kept: List[Buffered] = []
    dropped = 0
    for when, datums, buffered in batch:
        reports = invalid_reports(client, operation, [request([d]) for d in datums])
        if reports is None:
            return batch, 0
        bad = [r for r in reports if r]
        if bad:
            dropped += len(bad)
            log.error(
                "botocore refused %d of the %d datums of %s before sending (%s: %s); dropped, sending them again "
                "cannot succeed",
                len(bad),
                len(datums),
                when.isoformat(),
                type(exc).__name__,
                bad[0],
            )
        good = [d for i, d in enumerate(datums) if not reports[i]]
        if good:
            kept.append((when, good, buffered))
    return kept, dropped


def expire(buffer: Deque[Buffered], steady_now: float, limit: timedelta, why: str) -> int:
    """Drop the windows at the buffer's head that waited longer than `limit` on the steady clock (each
    said in the log, with `why`); returns how many. Ages count from buffering, never from a timestamp."""
    dropped = 0
    while buffer and steady_now - buffer[0][2] > limit.total_seconds():
        when, datums, buffered = buffer.popleft()
        dropped += 1
        log.warning(
            "dropping the unsent metrics of %s (%d datums): waited %s, longer than %s; %s",
            when.isoformat(),
            len(datums),
            timedelta(seconds=round(steady_now - buffered)),
            limit,
            why,
        )
    return dropped


class SteadyClock:
    """What buffer ages and backoff count on. With a monotonic clock (the service) it also watches the wall
    clock against it and logs a step once, so a jump is neither taken for an outage nor for time passing.
    Without one (tests, the rehearsal and the benchmarks drive `now` themselves) the wall time is trusted."""

    def __init__(self, monotonic: Optional[Ticks] = None) -> None:
        self.monotonic = monotonic
        self.jumps = 0
        self._last: Optional[Tuple[datetime, float]] = None
        self._lock = threading.Lock()  # the sampling thread and the sending thread both read it

    def read(self, now: datetime) -> float:
        return self.monotonic() if self.monotonic is not None else now.timestamp()

    def jump(self, now: datetime, steady: float) -> float:
        """Seconds the wall clock moved apart from the monotonic one since the last reading; 0.0 below
        CLOCK_JUMP_S (a `now` read a little early) and always without a monotonic clock."""
        if self.monotonic is None:
            return 0.0
        with self._lock:
            last, self._last = self._last, (now, steady)
        if last is None:
            return 0.0
        skew = (now - last[0]).total_seconds() - (steady - last[1])
        if abs(skew) < CLOCK_JUMP_S:
            return 0.0
        self.jumps += 1
        log.warning(
            "the wall clock jumped %s by %s (an NTP step or a VM resumed from suspend): buffered windows keep "
            "their timestamps and their age counts on the monotonic clock",
            "forward" if skew > 0 else "back",
            timedelta(seconds=round(abs(skew))),
        )
        return skew


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
        monotonic: Optional[Ticks] = None,
        namespace: str = schema.NAMESPACE,
    ) -> None:
        self.cloudwatch = cloudwatch
        self.namespace = namespace  # schema.NAMESPACE, or the node's own (schema.node_namespace)
        self.max_buffer_age = max_buffer_age
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.rng = rng or random.Random()
        self.steady = SteadyClock(monotonic)
        self.buffer: Deque[Buffered] = deque()
        self.failures = 0
        self.last_error: Optional[str] = None
        self.next_attempt: Optional[datetime] = None
        self.calls = 0
        self.dropped_windows = 0
        self.rejected_windows = 0
        self.rejected_datums = 0  # datums botocore refused on their own (their windows still went)
        self._buffer_lock = threading.Lock()  # the sampling thread appends, the sending thread pops
        self._flush_lock = threading.Lock()  # one flush at a time (the thread, or the last one at exit)
        self._loop: Optional[_SendLoop] = None

    def enqueue(self, window_time: datetime, datums: List[Dict[str, Any]], now: Optional[datetime] = None) -> None:
        """Buffer a window; its age counts from now (from its own time when no `now` is given)."""
        if datums:
            with self._buffer_lock:
                self.buffer.append((window_time, datums, self.steady.read(now or window_time)))

    def submit(self, window_time: datetime, datums: List[Dict[str, Any]], now: datetime) -> None:
        """A closed window: handed to the sending thread when there is one (never blocks), else sent now."""
        self.enqueue(window_time, datums, now)
        if self._loop is not None:
            self._loop.wake()
        else:
            self.flush(now)

    def start_background(self, clock: WallClock, poll_s: float = 5.0, monotonic: Ticks = time.monotonic) -> None:
        """Send from a thread of its own from now on; it also retries after backoff without new windows.
        The thread runs in real time, so ages and backoff count on `monotonic` from here (unless the sender
        was given one): a step of the wall clock then neither expires nor stalls anything."""
        if self._loop is not None:
            return
        if self.steady.monotonic is None:
            self.steady.monotonic = monotonic
            with self._buffer_lock:  # what was buffered before starts its wait now
                self.buffer = deque((when, datums, monotonic()) for when, datums, _ in self.buffer)
        now = clock()
        self.steady.jump(now, self.steady.read(now))  # the reading a first jump is measured from
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

    def _drop_expired(self, steady_now: float) -> None:
        """Windows that waited longer than the buffer keeps them: they stay only while sends fail."""
        why = "CloudWatch unreachable (last error %s)" % self.last_error if self.last_error else "never sent"
        with self._buffer_lock:
            self.dropped_windows += expire(self.buffer, steady_now, self.max_buffer_age, why)

    def _next_batch(self) -> List[Buffered]:
        """The oldest windows that fit one call (a window alone when it is bigger than that)."""
        batch: List[Buffered] = []
        size = 0
        with self._buffer_lock:
            for window in self.buffer:
                if batch and size + len(window[1]) > self.max_per_call:
                    break
                batch.append(window)
                size += len(window[1])
        return batch

    def _pop(self, n: int, put_back: Sequence[Buffered] = ()) -> None:
        """Take the first `n` windows off the buffer, and put `put_back` in their place."""
        with self._buffer_lock:  # the head is the flush's own: the sampling thread only appends
            for _ in range(n):
                self.buffer.popleft()
            self.buffer.extendleft(reversed(put_back))

    def _request(self, datums: List[Dict[str, Any]]) -> Dict[str, Any]:
        return {"Namespace": self.namespace, "MetricData": datums}

    def _put(self, datums: List[Dict[str, Any]]) -> None:
        for i in range(0, len(datums), self.max_per_call):  # one oversized window: split
            self.cloudwatch.put_metric_data(**self._request(datums[i : i + self.max_per_call]))
            self.calls += 1

    def flush(self, now: datetime) -> int:
        """Send what is buffered, oldest first, as few calls as the 1,000-datum limit allows.
        Returns the datums sent; stops at the first retryable failure and backs off."""
        steady_now = self.steady.read(now)  # before the lock: read together with `now`
        with self._flush_lock:
            skew = self.steady.jump(now, steady_now)
            if skew and self.next_attempt is not None:  # the backoff is a wall time: it moves with the clock
                self.next_attempt += timedelta(seconds=skew)
            self._drop_expired(steady_now)
            if self.next_attempt is not None and now < self.next_attempt:
                return 0
            sent = 0
            while True:
                batch = self._next_batch()
                if not batch:
                    return sent
                try:
                    self._put([d for _, datums, _ in batch for d in datums])
                except Exception as exc:  # network, throttling after boto3's retries, credentials, content
                    if not rejected(exc):
                        self._back_off(now, exc)
                        return sent
                    if client_side(exc) and self._drop_invalid(batch, exc):
                        continue  # the valid rest goes in the next round
                    done, ok = self._one_by_one(batch, now, exc)
                    sent += done
                    if not ok:
                        return sent
                    continue
                self._pop(len(batch))
                sent += sum(len(datums) for _, datums, _ in batch)
                self._recovered(sent)

    def _drop_invalid(self, batch: List[Buffered], exc: BaseException) -> bool:
        """botocore refused the batch before sending it: its datums refused on their own are dropped and
        the rest stays buffered in their place. False when none can be told apart."""
        kept, dropped = split_invalid(self.cloudwatch, self.what, self._request, batch, exc)
        if dropped:
            self.rejected_datums += dropped
            self._pop(len(batch), kept)
        return dropped > 0

    def _one_by_one(self, batch: List[Buffered], now: datetime, exc: BaseException) -> Tuple[int, bool]:
        """A refused batch: send its windows one at a time and drop only those refused on their own.
        Returns (datums sent, False if a retryable failure stopped it)."""
        sent = 0
        for when, datums, _ in batch:
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
        self.last_error = "%s: %s" % (type(exc).__name__, exc)
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
        self.last_error = None
        self.next_attempt = None


class LogSender(Sender):
    """Usage records to CloudWatch Logs (PutLogEvents), with the same buffer, backoff and thread as the
    metrics. Items are log events {"timestamp": ms, "message": text}. The log stream (the instance id) is
    created on first use; a missing log group is retried with backoff and said in the log, since records
    sent later still count."""

    what = "PutLogEvents"
    max_per_call = 500  # and at most MAX_LOG_BATCH_BYTES per call (a record is up to 200 KB, usually < 2 KB)

    def __init__(self, logs: Any, group: str, stream: str, flush_every_s: int = 0, **kwargs: Any) -> None:
        super().__init__(logs, **kwargs)
        self.group = group
        self.stream = stream
        # > 0: records wait and go together, once per `flush_every_s` (schema.USAGE_FLUSH_S: three 5-minute
        # records a call); 0: each as it comes. `final` (set on shutdown) sends whatever waits.
        self.flush_every_s = flush_every_s
        self.final = False

    def flush(self, now: datetime) -> int:
        if self.flush_every_s and not self.final and not self._due(now):
            return 0
        return super().flush(now)

    def _due(self, now: datetime) -> bool:
        """Due when the newest record closes a `flush_every_s` period (on the epoch's grid, like the
        windows), or the oldest has waited that long (a retry after a failure, a skipped boundary)."""
        with self._buffer_lock:
            if not self.buffer:
                return False
            oldest, newest = self.buffer[0][0], self.buffer[-1][0]
        return int(newest.timestamp()) % self.flush_every_s == 0 or (now - oldest).total_seconds() >= self.flush_every_s

    def stop_background(self, now: datetime, timeout_s: float = 10.0) -> None:
        self.final = True
        super().stop_background(now, timeout_s)

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

    def _request(self, datums: List[Dict[str, Any]]) -> Dict[str, Any]:
        return {"logGroupName": self.group, "logStreamName": self.stream, "logEvents": datums}

    def _put_events(self, chunk: List[Dict[str, Any]]) -> Any:
        return self.cloudwatch.put_log_events(**self._request(chunk))

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
