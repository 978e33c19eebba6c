"""Send closed windows to CloudWatch: one gzip-compressed PutMetricData per flush (<= 1,000 datums),
exponential backoff with jitter when it fails, and a bounded buffer of unsent windows that are resent
with their original timestamps once CloudWatch answers again (oldest dropped first, said in the log).
Python >= 3.9.
"""

import logging
import random
from collections import deque
from datetime import datetime, timedelta
from typing import Any, Deque, Dict, List, Optional, Tuple

from gpufleet_node import schema

log = logging.getLogger("gpufleet.publisher")

MAX_DATUMS_PER_CALL = 1000


def cloudwatch_client(region: str, endpoint_url: Optional[str] = None) -> Any:
    """boto3 with standard retries and request compression for every PutMetricData body (botocore
    gzips PutMetricData when the body reaches `request_min_compression_size_bytes`)."""
    import boto3
    from botocore.config import Config

    config = Config(
        retries={"mode": "standard", "max_attempts": 3},
        connect_timeout=5,
        read_timeout=10,
        request_min_compression_size_bytes=1,
        disable_request_compression=False,
    )
    return boto3.client("cloudwatch", region_name=region, endpoint_url=endpoint_url, config=config)


class Sender:
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
        self.buffer: Deque[Tuple[datetime, List[Dict[str, Any]]]] = deque()
        self.failures = 0
        self.next_attempt: Optional[datetime] = None
        self.calls = 0
        self.dropped_windows = 0

    def enqueue(self, window_time: datetime, datums: List[Dict[str, Any]]) -> None:
        if datums:
            self.buffer.append((window_time, datums))

    def _drop_expired(self, now: datetime) -> None:
        while self.buffer and now - self.buffer[0][0] > self.max_buffer_age:
            when, datums = self.buffer.popleft()
            self.dropped_windows += 1
            log.warning(
                "dropping the unsent metrics of %s (%d datums): older than %s, CloudWatch unreachable",
                when.isoformat(),
                len(datums),
                self.max_buffer_age,
            )

    def flush(self, now: datetime) -> int:
        """Send what is buffered, oldest first, as few calls as the 1,000-datum limit allows.
        Returns the datums sent; stops at the first failure and backs off."""
        self._drop_expired(now)
        if self.next_attempt is not None and now < self.next_attempt:
            return 0
        sent = 0
        while self.buffer:
            batch: List[Dict[str, Any]] = []
            taken = 0
            for _, datums in self.buffer:
                if len(batch) + len(datums) > MAX_DATUMS_PER_CALL and batch:
                    break
                batch.extend(datums)
                taken += 1
            try:
                for i in range(0, len(batch), MAX_DATUMS_PER_CALL):  # one oversized window: split
                    self.cloudwatch.put_metric_data(
                        Namespace=schema.NAMESPACE, MetricData=batch[i : i + MAX_DATUMS_PER_CALL]
                    )
                    self.calls += 1
            except Exception as exc:  # network, throttling after boto3's retries, credentials...
                self.failures += 1
                delay = min(self.max_backoff_s, self.base_backoff_s * 2 ** (self.failures - 1))
                delay = self.rng.uniform(delay / 2, delay)  # jitter, so a fleet does not retry in step
                self.next_attempt = now + timedelta(seconds=delay)
                log.warning(
                    "PutMetricData failed (%s: %s); %d window(s) buffered, next try in %.0f s",
                    type(exc).__name__,
                    exc,
                    len(self.buffer),
                    delay,
                )
                return sent
            for _ in range(taken):
                self.buffer.popleft()
            sent += len(batch)
            if self.failures:
                log.info("CloudWatch reachable again; sent %d buffered datums", len(batch))
            self.failures = 0
            self.next_attempt = None
        return sent
