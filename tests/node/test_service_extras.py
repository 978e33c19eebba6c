"""The service's optional parts as __main__ wires them: attribution's tracker from the config, and the
Prometheus endpoint serving the publisher's latest samples with the holders' pod labels. Python >= 3.9."""

import urllib.request
from datetime import datetime, timezone

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
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    uid, cid = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "c" * 64
    (proc / "cgroup").write_text(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod%s.slice/cri-containerd-%s.scope\n"
        % (uid.replace("-", "_"), cid)
    )
    (proc / "stat").write_text("4242 (python3) S 1 4242 4242 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 777 1 1\n")
    (proc / "status").write_text("Name:\tpython3\nUid:\t0\t0\t0\t0\n")
    logs = tmp_path / "log"
    (logs / "pods" / ("team-a_trainer-0_%s" % uid) / "main").mkdir(parents=True)
    (logs / "containers").mkdir()
    (logs / "containers" / ("trainer-0_team-a_main-%s.log" % cid)).symlink_to(logs / "pods")
    cfg_file = tmp_path / "publisher.json"
    cfg_file.write_text(
        '{"prometheus": true, "prometheus_port": 1, "prometheus_address": "127.0.0.1", "proc_root": "%s", '
        '"pod_resources_socket": "%s", "kubelet_log_root": "%s", "region": "us-east-1"}'
        % (tmp_path / "proc", tmp_path / "no-kubelet.sock", logs)
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
