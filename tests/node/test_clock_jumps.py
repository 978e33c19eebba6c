"""Wall-clock jumps (an NTP step, a VM resumed from suspend) against the send buffer: a buffered window's
age is the time it has waited, on the monotonic clock, never the distance between its timestamp and a
wall clock that just jumped. Clocks are injected. Python >= 3.9."""

import logging
import random
import threading
import time
from datetime import datetime, timedelta, timezone

from fakes import CountingBackend, FakeClocks, FakeCloudWatch, window
from gpufleet_node.identity import Identity
from gpufleet_node.publisher import Publisher
from gpufleet_node.sender import Sender

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)
JUMP_S = 3 * 3600  # more than the 2 h the buffer keeps a window


def test_a_forward_jump_past_the_buffer_age_keeps_the_window_that_just_closed(caplog):
    clocks = FakeClocks(T0)
    cw = FakeCloudWatch()
    sender = Sender(cw, max_buffer_age=timedelta(hours=2), monotonic=clocks.monotonic)
    with caplog.at_level(logging.INFO, logger="gpufleet.publisher"):
        for minute in range(3):
            clocks.advance(60)
            sender.submit(*window(T0 + timedelta(minutes=minute)), now=clocks.wall())
        clocks.advance(30)
        clocks.jump(JUMP_S)  # the window of minute 3 closes on the jumped clock
        clocks.advance(30)
        sender.submit(*window(T0 + timedelta(minutes=3)), now=clocks.wall())
    assert sorted({d["Timestamp"] for d in cw.datums()}) == [T0 + timedelta(minutes=m) for m in range(4)]
    assert sender.dropped_windows == 0 and not sender.buffer
    assert sender.steady.jumps == 1
    assert "unreachable" not in caplog.text
    assert caplog.text.count("wall clock jumped forward by 3:00:00") == 1


def test_during_an_outage_a_jump_drops_nothing_and_the_age_limit_still_holds(caplog):
    clocks = FakeClocks(T0)
    cw = FakeCloudWatch(fail_next=10**6)
    sender = Sender(cw, max_buffer_age=timedelta(hours=2), rng=random.Random(1), monotonic=clocks.monotonic)
    with caplog.at_level(logging.WARNING, logger="gpufleet.publisher"):
        for minute in range(10):
            clocks.advance(60)
            sender.submit(*window(T0 + timedelta(minutes=minute)), now=clocks.wall())
        clocks.jump(JUMP_S)
        sender.flush(clocks.wall())
        assert len(sender.buffer) == 10 and sender.dropped_windows == 0  # 10 minutes waited, not 3 hours
        assert "unreachable" not in caplog.text
        for _ in range(121):  # two more hours of a real outage
            clocks.advance(60)
            sender.flush(clocks.wall())
    assert sender.dropped_windows == 10 and not sender.buffer
    assert "dropping the unsent metrics of 2026-11-23T08:00:00+00:00 (3 datums): waited" in caplog.text
    assert "CloudWatch unreachable (last error ConnectionError: Could not connect" in caplog.text


def test_a_backward_jump_does_not_stretch_the_backoff(caplog):
    clocks = FakeClocks(T0)
    cw = FakeCloudWatch(fail_next=1)
    sender = Sender(cw, base_backoff_s=5, rng=random.Random(2), monotonic=clocks.monotonic)
    sender.submit(*window(T0), now=clocks.wall())
    assert sender.failures == 1 and len(sender.buffer) == 1
    clocks.jump(-JUMP_S)  # NTP steps a clock that ran 3 h ahead back
    clocks.advance(10)  # the backoff (at most 5 s) is over
    with caplog.at_level(logging.WARNING, logger="gpufleet.publisher"):
        sender.flush(clocks.wall())
    assert [d["Timestamp"] for d in cw.datums()] == [T0] * 3 and not sender.buffer
    assert "wall clock jumped back by 3:00:00" in caplog.text


def test_the_service_loop_sends_the_window_closed_by_a_forward_jump(caplog):
    """Publisher.run on an injected wall clock that jumps 3 h ahead mid-window, the real monotonic clock
    and the sending thread, as on a node: every sample still reaches CloudWatch."""
    backend = CountingBackend(gpus=2)
    cw = FakeCloudWatch()
    pub = Publisher(backend, Identity("i-1", "us-east-1", asg_name="g"), Sender(cw), window_s=60)
    pub.start(xid_thread=False)
    started = time.monotonic()

    def wall():
        elapsed = time.monotonic() - started
        return T0 + timedelta(seconds=elapsed + (JUMP_S if elapsed > 0.5 else 0))

    runner = threading.Thread(target=pub.run, kwargs={"sample_interval_s": 0.05, "clock": wall})
    with caplog.at_level(logging.INFO, logger="gpufleet.publisher"):
        runner.start()
        time.sleep(1.0)
        pub.stop()
        runner.join(15)
    per_instance = [d for d in cw.datums("GPUUtilization") if [x["Name"] for x in d["Dimensions"]] == ["InstanceId"]]
    windows = {d["Timestamp"]: sum(d["Counts"]) for d in per_instance}
    assert min(windows) == T0 and len(windows) == 2  # the window before the jump and the one after
    assert sum(windows.values()) == backend.samples
    assert pub.sender.dropped_windows == 0
    assert "unreachable" not in caplog.text
    assert "wall clock jumped forward" in caplog.text
