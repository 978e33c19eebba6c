"""GPU fault corroboration on the node: a minute with a GPU fault is also written into the node's own
namespace (schema.node_namespace of its aws:userid), which only this instance's credentials may write;
a healthy minute writes nothing there (CloudWatch bills a series by the hours it receives data).
Python >= 3.9."""

from datetime import datetime, timedelta, timezone

import pytest

from fakes import FakeCloudWatch
from gpufleet_node import schema
from gpufleet_node import sender as sender_mod
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender

T0 = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)
NODE = "i-0123456789abcdef0"
ME = "AROAEXAMPLE:" + NODE


def publisher(caller, detail=schema.DETAIL_ADAPTIVE):
    cw = FakeCloudWatch(validate=True)
    pub = Publisher(
        SimulatedBackend(gpus=2), Identity(NODE, "us-east-1", asg_name="a"), Sender(cw), detail=detail, caller=caller
    )
    pub.start(xid_thread=False)
    return pub, cw


def own(cw):
    return [c for c in cw.calls if c["Namespace"] != schema.NAMESPACE]


@pytest.mark.parametrize("detail", schema.DETAIL_MODES)
def test_a_fault_goes_to_the_own_namespace_too_and_a_healthy_minute_does_not(detail):
    pub, cw = publisher(ME, detail)
    simulate(pub, T0, 120)  # two healthy minutes
    pub.backend.lost.add(1)
    pub.record_xid(1, 79)
    simulate(pub, T0 + timedelta(minutes=2), 61)
    calls = own(cw)  # the XID landed in minute 1 (still open), the lost GPU is sampled in minute 2
    assert {c["Namespace"] for c in calls} == {"GPUFleet/Node/" + ME}
    datums = [d for c in calls for d in c["MetricData"]]
    assert {d["MetricName"] for d in datums} == {"GPUFaultReported"}  # never summed with the shared series
    got = {tuple((x["Name"], x["Value"]) for x in d["Dimensions"]) for d in datums}
    gpu1 = (("InstanceId", NODE), ("GpuIndex", "1"))
    assert (*gpu1, ("Fault", schema.GPU_LOST.name)) in got and (*gpu1, ("Fault", schema.GPU_XID_ERRORS.name)) in got
    assert {d["Timestamp"] for d in datums} <= {T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)}
    assert all(d["Value"] > 0 for d in datums)
    assert schema.namespace_instance(calls[0]["Namespace"]) == NODE  # what the guard accepts as this node's


@pytest.mark.parametrize("caller", [None, "AIDAUSERKEYS", "AROAEXAMPLE:i-0ffffffffffffffff"])
def test_without_the_instances_own_credentials_nothing_is_written_there(caller, caplog):
    pub, cw = publisher(caller)
    pub.backend.lost.add(0)
    simulate(pub, T0, 121)
    assert own(cw) == [] and cw.datums(schema.GPU_LOST.name)  # the shared namespace still gets it
    assert pub.witness is None
    if caller:
        assert "will not replace this node" in caplog.text


def test_the_userid_comes_from_sts_and_a_failure_is_said_once(monkeypatch, caplog):
    class Sts:
        def __init__(self, answer):
            self.answer = answer

        def get_caller_identity(self):
            if isinstance(self.answer, Exception):
                raise self.answer
            return {"UserId": self.answer, "Account": "123456789012", "Arn": "arn"}

    monkeypatch.setattr(sender_mod, "_client", lambda *a, **k: Sts(ME))
    assert sender_mod.caller_userid("us-east-1") == ME
    monkeypatch.setattr(sender_mod, "_client", lambda *a, **k: Sts(ConnectionError("no route")))
    assert sender_mod.caller_userid("us-east-1") is None
    assert caplog.text.count("without GPU fault corroboration") == 1


@pytest.mark.parametrize(
    ("namespace", "instance"),
    [
        ("GPUFleet/Node/AROAX:i-0abc", "i-0abc"),
        ("GPUFleet", None),
        ("GPUFleet/Node/i-0abc", None),  # no role id
        ("GPUFleet/Node/:i-0abc", None),
        ("GPUFleet/Node/AROAX:i-0abc:x", None),  # one ':' only
        ("GPUFleet/Node/AROAX:sess", None),  # not an instance's session
        ("GPUFleet/Node/AROAX/evil:i-0abc", None),
        ("gpufleet/node/AROAX:i-0abc", None),
    ],
)
def test_which_namespaces_are_an_instances_own(namespace, instance):
    assert schema.namespace_instance(namespace) == instance
