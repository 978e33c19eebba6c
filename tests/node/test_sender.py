"""Buffering, backoff with jitter, original timestamps, the 1,000-datum limit. Python >= 3.9."""

import logging
import random
import threading
from datetime import datetime, timedelta, timezone

import fakes
from fakes import FakeCloudWatch
from gpufleet_node.sender import MAX_DATUMS_PER_CALL, Sender

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)


def window(minute, n=3):
    return fakes.window(T0 + timedelta(minutes=minute), n)


def test_outage_buffers_windows_and_resends_them_with_original_timestamps():
    cw = FakeCloudWatch(fail_next=3)
    sender = Sender(cw, rng=random.Random(1))
    for minute in range(10):
        sender.enqueue(*window(minute))
        sender.flush(T0 + timedelta(minutes=minute, seconds=1))
    assert cw.datums(), "sent once CloudWatch answered"
    assert not sender.buffer
    stamps = sorted({d["Timestamp"] for d in cw.datums()})
    assert stamps == [T0 + timedelta(minutes=m) for m in range(10)]  # every window, its own time
    assert len(cw.calls) < 10  # the backlog went out together


def test_backoff_grows_exponentially_with_jitter_and_is_capped():
    cw = FakeCloudWatch(fail_next=100)
    sender = Sender(cw, base_backoff_s=5, max_backoff_s=300, rng=random.Random(7))
    delays = []
    now = T0
    for _ in range(9):
        sender.enqueue(*window(0))
        sender.flush(now)
        delays.append((sender.next_attempt - now).total_seconds())
        now = sender.next_attempt
    for k, d in enumerate(delays):
        nominal = min(300, 5 * 2**k)
        assert nominal / 2 <= d <= nominal
    assert cw.attempts == 9  # no call before the backoff expired


def test_windows_older_than_the_buffer_limit_are_dropped_oldest_first_and_logged(caplog):
    cw = FakeCloudWatch(fail_next=10**6)
    sender = Sender(cw, max_buffer_age=timedelta(hours=2), rng=random.Random(2))
    with caplog.at_level(logging.WARNING, logger="gpufleet.publisher"):
        for minute in range(0, 200):
            sender.enqueue(*window(minute))
            sender.flush(T0 + timedelta(minutes=minute))
    oldest = sender.buffer[0][0]
    assert oldest >= T0 + timedelta(minutes=199) - timedelta(hours=2)
    assert sender.dropped_windows > 0
    assert "dropping the unsent metrics of 2026-11-23T08:00:00+00:00" in caplog.text


def test_never_more_than_1000_datums_per_call():
    cw = FakeCloudWatch(fail_next=1)
    sender = Sender(cw, rng=random.Random(3))
    for minute in range(5):
        sender.enqueue(*window(minute, n=400))
    sender.flush(T0)
    sender.flush(T0 + timedelta(hours=1))
    assert all(len(c["MetricData"]) <= MAX_DATUMS_PER_CALL for c in cw.calls)
    assert len(cw.datums()) == 2000


def test_a_refused_window_is_dropped_alone_and_the_windows_behind_it_still_go(caplog):
    bad = T0 + timedelta(minutes=1)
    cw = FakeCloudWatch(
        fail_next=2,  # a short outage first, so the refused window sits in a batch with good ones
        refuse=lambda data: "InvalidParameterValue" if any(d["Timestamp"] == bad for d in data) else None,
    )
    sender = Sender(cw, rng=random.Random(4))
    with caplog.at_level(logging.WARNING, logger="gpufleet.publisher"):
        for minute in range(10):
            sender.enqueue(*window(minute))
            sender.flush(T0 + timedelta(minutes=minute, seconds=1))
    stamps = sorted({d["Timestamp"] for d in cw.datums()})
    assert stamps == [T0 + timedelta(minutes=m) for m in range(10) if m != 1]
    assert sender.rejected_windows == 1 and not sender.buffer and sender.next_attempt is None
    assert cw.attempts < 20  # no retrying of what can never succeed
    assert "refused the metrics of 2026-11-23T08:01:00+00:00 (3 datums)" in caplog.text
    assert "InvalidParameterValue" in caplog.text


def test_access_denied_and_throttling_are_retried_not_dropped():
    answers = ["AccessDenied", "Throttling"]
    cw = FakeCloudWatch(refuse=lambda data: answers.pop(0) if answers else None)
    sender = Sender(cw, rng=random.Random(5))
    for minute in range(10):
        sender.enqueue(*window(minute))
        sender.flush(T0 + timedelta(minutes=minute, seconds=1))
    assert sender.rejected_windows == 0 and not sender.buffer
    assert len({d["Timestamp"] for d in cw.datums()}) == 10


class GatedCloudWatch(FakeCloudWatch):
    """A PutMetricData that hangs until the test opens the gate: a network as slow as the test wants,
    without measuring how long anything took."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()  # a send is in flight
        self.gate = threading.Event()

    def put_metric_data(self, Namespace, MetricData):
        self.entered.set()
        if not self.gate.wait(SAFETY_S):
            raise ConnectionError("the test never opened the gate")
        return super().put_metric_data(Namespace, MetricData)


SAFETY_S = 30  # only a failing test waits this long; nothing is asserted about how long anything took


def test_the_sending_thread_sends_what_is_submitted_without_the_caller_waiting():
    """submit() returns while the sending thread's PutMetricData still hangs: the caller never waits on
    the network. (If submit sent inline, it would still be inside the hanging call: the helper thread
    below would not have finished.)"""
    cw = GatedCloudWatch()
    sender = Sender(cw)
    sender.start_background(lambda: T0 + timedelta(minutes=1), poll_s=0.05)
    caller = threading.Thread(target=sender.submit, args=window(0), kwargs={"now": T0 + timedelta(minutes=1)})
    caller.start()
    assert cw.entered.wait(SAFETY_S), "the sending thread never sent"
    caller.join(SAFETY_S)
    assert not caller.is_alive() and not cw.gate.is_set() and cw.calls == []  # returned; the send still hangs
    sender.submit(*window(1), now=T0 + timedelta(minutes=2))  # queued behind the hanging send, not waiting
    cw.gate.set()
    sender.stop_background(T0 + timedelta(minutes=2))
    assert len({d["Timestamp"] for d in cw.datums()}) == 2 and not sender.buffer
