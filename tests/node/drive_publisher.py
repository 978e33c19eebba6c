"""Run the real NVML backend (nvidia-ml-py -> the fake libnvidia-ml.so.1 on LD_LIBRARY_PATH) through the
publisher on a simulated clock; print the datums it would send as JSON. Used by test_nvml_binding."""

import json
import logging
import sys
import time
from datetime import datetime, timedelta, timezone

from fakes import FakeCloudWatch
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import NvmlBackend
from gpufleet_node.publisher import Publisher
from gpufleet_node.sender import Sender


def main() -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
    rounds, expect_xids = int(sys.argv[1]), int(sys.argv[2])
    t0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)
    cw = FakeCloudWatch()
    publisher = Publisher(NvmlBackend(), Identity("i-fake", "us-east-1", asg_name="train"), Sender(cw))
    publisher.start()
    for r in range(rounds):
        publisher.step(t0 + timedelta(seconds=r))
        time.sleep(0.01)  # let the XID thread (5 ms polls in the fake) keep up with the simulated clock
    deadline = time.monotonic() + 3
    while publisher.xid_count < expect_xids and time.monotonic() < deadline:
        time.sleep(0.01)
    publisher.finish(t0 + timedelta(seconds=rounds))
    print(json.dumps({"calls": len(cw.calls), "datums": cw.datums()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
