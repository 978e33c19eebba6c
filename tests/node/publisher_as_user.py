"""A child process of tests/node/test_install_attribution.py: the installed publisher's attribution
pipeline as another uid, reading the kubelet's PodResources socket itself, for one 300 s window of two
simulated GPUs (GPU 0 busy with pid 101 of the pod, GPU 1 idle). Prints the usage record as JSON.

  python publisher_as_user.py UID SOCKET      (started as root)

It loads its modules as root, then drops to UID (its real and effective uid and gid, no supplementary
groups) before anything touches the socket: the interpreter may live where only root can read (pyenv
under /root), and what is tested is the socket's permission, which the kernel checks at connect(2).
"""

import json
import os
import sys
from datetime import datetime, timezone

from fakes import FakeCloudWatch, FakeLogs
from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import ProcessUse, SimulatedBackend
from gpufleet_node.podresources import PodResourcesReader, load_wire
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import LogSender, Sender
from gpufleet_node.tracker import UsageTracker
from gpufleet_node.workload import POD, UNKNOWN_WORKLOAD, Workload

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)
TRAINER = Workload(POD, namespace="team-a", pod="trainer-0", container="main")


class OneProcess:
    """The /proc side of attribution (tested elsewhere): pid 101 is the trainer's."""

    def workload_of(self, pid):
        return TRAINER if pid == 101 else UNKNOWN_WORKLOAD

    def unknown(self):
        return {}


def record(socket_path: str) -> dict:
    backend = SimulatedBackend(gpus=2)
    identity = Identity("i-0node", "us-east-1", "g5.12xlarge", cluster_name="prod", nodegroup_name="gpu-a")
    pods = PodResourcesReader(socket_path, timeout_s=5.0)
    pods.refresh()  # what its thread does every 30 s
    logs, metrics = FakeLogs(schema.USAGE_LOG_GROUP), Sender(FakeCloudWatch())
    usage = UsageTracker(
        OneProcess(),
        pods,
        [backend.describe(i).uuid for i in range(2)],
        LogSender(logs, schema.USAGE_LOG_GROUP, identity.instance_id),
        metrics,
        window_s=300,
        sample_s=10.0,
    )
    publisher = Publisher(backend, identity, metrics, detail="adaptive", usage=usage)
    publisher.start(xid_thread=False)
    backend.set(0, 90, 50)
    backend.set(1, 0, 0)
    backend.set_processes(0, [ProcessUse(101, 11000.0, 90.0)])
    backend.set_processes(1, [])
    simulate(publisher, T0, 300, every_s=10.0)
    publisher.finish(datetime(2026, 11, 23, 10, 5, tzinfo=timezone.utc))
    [only] = logs.records()
    return only


def become(uid: int) -> None:
    wire, missing = load_wire()  # grpc and the message classes, loaded while the interpreter's files are readable
    assert wire is not None, missing
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    assert (os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()) == (uid, uid, uid, uid, [])


if __name__ == "__main__":
    become(int(sys.argv[1]))
    print(json.dumps(record(sys.argv[2])))
