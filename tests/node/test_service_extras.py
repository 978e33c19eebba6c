"""The service's optional parts as __main__ wires them: attribution's tracker from the config, and the
Prometheus endpoint serving the publisher's latest samples with the holders' pod labels. Python >= 3.9."""

import urllib.request
from datetime import datetime, timezone

from proc_trees import ProcTree, systemd_pod, v2
from prometheus_client.parser import text_string_to_metric_families

from fakes import FakeCloudWatch
from gpufleet_node import __main__ as service
from gpufleet_node import config
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import ProcessUse, SimulatedBackend
from gpufleet_node.publisher import Publisher
from gpufleet_node.sender import Sender

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)


def test_the_tracker_and_the_endpoint_from_the_config(tmp_path):
    tree = ProcTree(tmp_path)
    uid, cid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "c" * 64
    tree.process(4242, v2(systemd_pod(uid, cid)))
    tree.pod_logs("team-a", "trainer-0", uid, {"main": cid})
    cfg_file = tmp_path / "publisher.json"
    cfg_file.write_text(
        '{"prometheus": true, "prometheus_port": 1, "prometheus_address": "127.0.0.1", "proc_root": "%s", '
        '"pod_resources_socket": "%s", "kubelet_log_root": "%s", "region": "us-east-1"}'
        % (tree.proc_root, tmp_path / "no-kubelet.sock", tree.log_root)
    )
    cfg = config.load(str(cfg_file))
    cfg["prometheus_port"] = 0  # any free port
    backend = SimulatedBackend(gpus=2)
    identity = Identity("i-0node", "us-east-1", "g5.12xlarge", asg_name="train")
    sender = Sender(FakeCloudWatch())
    usage = service.usage_tracker(cfg, backend, identity, sender)
    assert usage.pod_resources is None  # no kubelet socket and not an EKS node: not asked
    assert backend.process_utilization
    publisher = Publisher(backend, identity, sender, detail="adaptive", usage=usage)
    publisher.start(xid_thread=False)
    backend.set(0, 90, 50)
    backend.set_processes(0, [ProcessUse(4242, 11000.0, 90.0)])
    publisher.step(T0)
    stops = service.start_extras(cfg, publisher)
    try:
        port = stops[-1].__self__.port  # the endpoint's stop() is bound to it
        body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
    finally:
        for stop in stops:
            stop()
    util = {
        s.labels.get("gpu"): s
        for f in text_string_to_metric_families(body)
        if f.name == "DCGM_FI_DEV_GPU_UTIL"
        for s in f.samples
    }
    assert util["0"].value == 90
    assert {k: util["0"].labels[k] for k in ("namespace", "pod", "container")} == {
        "namespace": "team-a",
        "pod": "trainer-0",
        "container": "main",
    }
    assert "pod" not in util["1"].labels  # nobody holds GPU 1: no pod labels at all
