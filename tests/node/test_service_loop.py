"""The service loop on the wall clock: a PutMetricData that hangs must not cost a single sample, and the
buffer must keep windows long enough to send them. Python >= 3.9."""

import threading
import time
from datetime import timedelta

import pytest

from fakes import CountingBackend, FakeCloudWatch
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher
from gpufleet_node.sender import Sender


def test_a_hanging_put_metric_data_costs_no_sample():
    backend = CountingBackend(gpus=2)
    cw = FakeCloudWatch()
    cw.delay_s = 1.0  # every call hangs a second; a window closes every second
    pub = Publisher(backend, Identity("i-1", "us-east-1", asg_name="g"), Sender(cw), window_s=1)
    pub.start(xid_thread=False)
    interval = 0.05
    runner = threading.Thread(target=pub.run, kwargs={"sample_interval_s": interval})
    started = time.monotonic()
    runner.start()
    time.sleep(3.0)
    pub.stop()
    elapsed = time.monotonic() - started
    runner.join(15)
    rounds = backend.samples / 2
    assert rounds >= 0.7 * elapsed / interval, "%d rounds in %.1f s" % (rounds, elapsed)
    sent = sum(
        sum(d["Counts"]) for d in cw.datums("GPUUtilization") if [x["Name"] for x in d["Dimensions"]] == ["InstanceId"]
    )
    assert sent == backend.samples  # and every sample reached CloudWatch in the end


def test_a_buffer_shorter_than_a_window_is_refused():
    with pytest.raises(ValueError, match="longer than one window"):
        Publisher(
            SimulatedBackend(gpus=1),
            Identity("i-1", "us-east-1"),
            Sender(FakeCloudWatch(), max_buffer_age=timedelta(seconds=60)),
            window_s=60,
        )
