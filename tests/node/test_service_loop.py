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

SAFETY_S = 30  # only a failing test waits this long; nothing is asserted about how long anything took


class GatedCloudWatch(FakeCloudWatch):
    """A PutMetricData that hangs until the test opens the gate."""

    def __init__(self):
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def put_metric_data(self, Namespace, MetricData):
        self.entered.set()
        if not self.gate.wait(SAFETY_S):
            raise ConnectionError("the test never opened the gate")
        return super().put_metric_data(Namespace, MetricData)


def test_a_hanging_put_metric_data_costs_no_sample():
    """While the first PutMetricData hangs, the sampling loop goes on: two more windows' worth of samples
    are taken behind a send that has not returned (if the loop waited on it, none would be), and once it
    returns every sample reaches CloudWatch. Counted, not timed: a loaded machine samples later, not less."""
    backend = CountingBackend(gpus=2)
    cw = GatedCloudWatch()
    pub = Publisher(backend, Identity("i-1", "us-east-1", asg_name="g"), Sender(cw), window_s=1)
    pub.start(xid_thread=False)
    interval = 0.05
    runner = threading.Thread(target=pub.run, kwargs={"sample_interval_s": interval})
    runner.start()
    try:
        assert cw.entered.wait(SAFETY_S), "no window was ever sent"
        behind = backend.samples + 2 * 2 * int(1 / interval)  # two windows of rounds, 2 GPUs each
        deadline = time.monotonic() + SAFETY_S  # a bound on waiting, never an assertion on time
        while backend.samples < behind and time.monotonic() < deadline:
            time.sleep(0.02)
        assert backend.samples >= behind, "sampling stopped behind the hanging send"
        assert cw.calls == [] and not cw.gate.is_set()  # that send still had not returned
    finally:
        cw.gate.set()
        pub.stop()
        runner.join(15)
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
