"""EFA counters from a fake sysfs tree in a temporary directory: per device and port on the Prometheus
endpoint (counters, `_total`, only what the driver exposes), a node-level sum in CloudWatch only under
`detail: full`; host gauges on the endpoint; usage records sent three to a PutLogEvents call.
Python >= 3.9."""

import os
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest
from prometheus_client.parser import text_string_to_metric_families

from fakes import FakeCloudWatch, FakeLogs
from gpufleet_node import efa, schema
from gpufleet_node.host import DiskUse, HostFeed, HostSample
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.prometheus import GpuCollector, NodeCollector, serve
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.scrape_server import Limits
from gpufleet_node.sender import LogSender, Sender

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=timezone.utc)


def device(root, name, counters, driver="efa", port="1"):
    hw = root / name / "ports" / port / "hw_counters"
    hw.mkdir(parents=True)
    for counter, value in counters.items():
        (hw / counter).write_text("%d\n" % value)
    drivers = root / "_drivers" / driver
    drivers.mkdir(parents=True, exist_ok=True)
    (root / name / "device").mkdir()
    os.symlink(str(drivers), str(root / name / "device" / "driver"))


@pytest.fixture
def sysfs(tmp_path):
    root = tmp_path / "infiniband"
    root.mkdir()
    device(root, "rdmap0s31", {"rx_bytes": 100, "tx_bytes": 200, "retrans_timeout_events": 1, "rdma_read_bytes": 7})
    device(root, "rdmap16s27", {"rx_bytes": 1000, "tx_bytes": 2000})  # an older driver: no SRD counters
    device(root, "mlx5_0", {"rx_bytes": 999999}, driver="mlx5_core")  # not EFA: never counted
    return root


def test_reads_each_efa_device_and_only_its_exposed_counters(sysfs):
    ports = efa.read_counters(str(sysfs))
    assert [(p.device, p.port) for p in ports] == [("rdmap0s31", "1"), ("rdmap16s27", "1")]
    assert "retrans_timeout_events" not in ports[1].values  # absent, not invented as 0
    assert efa.totals(ports) == {"rx_bytes": 1100, "tx_bytes": 2200, "retrans_timeout_events": 1, "rdma_read_bytes": 7}
    assert efa.read_counters(str(sysfs / "missing")) == []


def test_deltas_start_at_a_baseline_and_restart_after_a_reset(sysfs):
    deltas = efa.EfaDeltas(str(sysfs))
    assert deltas.delta() == {}
    (sysfs / "rdmap0s31" / "ports" / "1" / "hw_counters" / "rx_bytes").write_text("600\n")
    assert deltas.delta()["rx_bytes"] == 500
    (sysfs / "rdmap0s31" / "ports" / "1" / "hw_counters" / "rx_bytes").write_text("5\n")  # driver reloaded
    assert deltas.delta()["rx_bytes"] == 5  # counted since the reset, from 0
    assert deltas.delta()["rx_bytes"] == 0


def test_one_device_reset_while_another_counts_is_not_hidden_by_the_node_total(sysfs):
    """Device A (at 100) re-probed, back to 0 then 50 bytes, while device B (at 1000) moved 5000: the
    window moved 5050. Node-wide totals (1100 -> 6050) read it as 4950: the reset hid A's bytes."""
    deltas = efa.EfaDeltas(str(sysfs))
    deltas.delta()
    (sysfs / "rdmap0s31" / "ports" / "1" / "hw_counters" / "rx_bytes").write_text("50\n")
    (sysfs / "rdmap16s27" / "ports" / "1" / "hw_counters" / "rx_bytes").write_text("6000\n")
    assert deltas.delta()["rx_bytes"] == 50 + 5000


def _scrape(node):
    endpoint = serve(GpuCollector("node-1", list, "i-0abc"), 0, "127.0.0.1", Limits(render_every_s=0), node=node)
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % endpoint.port, timeout=5) as resp:
            text = resp.read().decode()
    finally:
        endpoint.stop()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_prometheus_endpoint_has_efa_counters_and_host_gauges(sysfs):
    host = HostSample(72.5, None, 81.0, (DiskUse("/", 40.0), DiskUse("/opt/dlami/nvme", 81.0)))
    got = _scrape(NodeCollector("node-1", lambda: host, "i-0abc", efa_root=str(sysfs)))
    rx = {s[0]["device"]: s[1] for s in got["gpufleet_efa_rx_bytes_total"]}
    assert rx == {"rdmap0s31": 100.0, "rdmap16s27": 1000.0}
    assert got["gpufleet_efa_retrans_timeout_events_total"] == [
        ({"hostname": "node-1", "instance_id": "i-0abc", "device": "rdmap0s31", "port": "1"}, 1.0)
    ]
    assert got["gpufleet_host_memory_used_percent"][0][1] == 72.5
    assert "gpufleet_host_swap_used_percent" not in got  # no swap on the node: no series
    disks = {s[0]["mountpoint"]: s[1] for s in got["gpufleet_host_filesystem_used_percent"]}
    assert disks == {"/": 40.0, "/opt/dlami/nvme": 81.0}


def test_a_node_without_efa_or_host_reading_adds_nothing(tmp_path):
    got = _scrape(NodeCollector("node-1", lambda: None, efa_root=str(tmp_path / "none")))
    assert not [name for name in got if name.startswith(("gpufleet_efa", "gpufleet_host"))]


@pytest.mark.parametrize(("detail", "sent"), [("full", True), ("essential", False), ("adaptive", False)])
def test_cloudwatch_gets_the_node_sum_only_in_full(sysfs, detail, sent):
    cw = FakeCloudWatch()
    identity = Identity("i-0abc", "us-east-1", asg_name="train")
    pub = Publisher(
        SimulatedBackend(gpus=1), identity, Sender(cw), detail=detail, host=HostFeed(efa=efa.EfaDeltas(str(sysfs)))
    )
    pub.start(xid_thread=False)
    for minute in range(3):
        counter = sysfs / "rdmap0s31" / "ports" / "1" / "hw_counters" / "tx_bytes"
        counter.write_text("%d\n" % (200 + 1000 * minute))
        simulate(pub, T0 + timedelta(minutes=minute), 60, every_s=30)
    datums = [d for c in cw.calls for d in c["MetricData"] if d["MetricName"] == schema.HOST_EFA_TX_BYTES.name]
    assert bool(datums) is sent
    if sent:
        assert [d["Value"] for d in datums] == [1000.0]  # minute 1's window: baseline at minute 0's close
        assert [x["Name"] for x in datums[0]["Dimensions"]] == ["InstanceId"]


def test_usage_records_go_three_to_a_call():
    logs = FakeLogs("/gpufleet/usage")
    sender = LogSender(logs, "/gpufleet/usage", "i-0abc", flush_every_s=schema.USAGE_FLUSH_S)
    for n in range(1, 7):  # six 5-minute records, ending 08:05 ... 08:30
        end = T0 + timedelta(minutes=5 * n)
        sender.submit(end, [{"timestamp": int(end.timestamp() * 1000), "message": "r%d" % n}], end)
    assert [len(e) for e in logs.streams.values()] == [6]
    assert logs.calls == 1 + 2  # the first call finds no stream (created, then sent again), then one more
    sender.submit(T0 + timedelta(minutes=35), [{"timestamp": 0, "message": "last"}], T0 + timedelta(minutes=35))
    assert sum(map(len, logs.streams.values())) == 6  # 08:35 waits for its period (or the shutdown)
    sender.final = True
    sender.flush(T0 + timedelta(minutes=36))
    assert sum(map(len, logs.streams.values())) == 7
