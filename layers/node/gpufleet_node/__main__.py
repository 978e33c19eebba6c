"""`python -m gpufleet_node`: the on-node GPU metric publisher (systemd service gpufleet-publisher).

Exit codes: 0 stopped normally; 2 bad configuration (one line naming the field and the value); 3 no
NVML library or driver (a clear one-line message; systemd restarts with backoff, e.g. while the driver
is still loading at boot); 4 no instance identity (IMDS unreachable).
"""

import argparse
import logging
import os
import shutil
import signal
import socket as socket_module
import sys
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpufleet_node import config as config_mod
from gpufleet_node import schema
from gpufleet_node.efa import EfaDeltas
from gpufleet_node.host import HostFeed, HostReader
from gpufleet_node.identity import IdentityUnavailable, Imds, TagReader, TagRefresher, discover
from gpufleet_node.nvml import NvmlBackend, NvmlUnavailable
from gpufleet_node.publisher import Publisher
from gpufleet_node.sender import LogSender, Sender, caller_userid, cloudwatch_client, logs_client
from gpufleet_node.tracker import UsageTracker

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_NO_NVML = 3
EXIT_NO_IDENTITY = 4

log = logging.getLogger("gpufleet.publisher")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-publisher", description=__doc__)
    parser.add_argument("--config", default=config_mod.DEFAULT_PATH)
    args = parser.parse_args(argv)
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s", level=logging.INFO)
    try:
        cfg = config_mod.load(args.config)
    except config_mod.ConfigError as exc:
        print("gpufleet-publisher: %s" % exc, file=sys.stderr)
        return EXIT_CONFIG
    logging.getLogger().setLevel(cfg["log_level"])
    try:
        backend = NvmlBackend()
        backend.init()  # fail fast, before talking to IMDS or AWS
    except NvmlUnavailable as exc:
        print("gpufleet-publisher: no NVIDIA driver/NVML on this machine: %s" % exc, file=sys.stderr)
        return EXIT_NO_NVML
    try:
        publisher, refresher = build(cfg, backend)
    except IdentityUnavailable as exc:
        print("gpufleet-publisher: %s" % exc, file=sys.stderr)
        return EXIT_NO_IDENTITY
    publisher.start()
    refresher.start()
    extras = start_extras(cfg, publisher)
    signal.signal(signal.SIGTERM, lambda *_: publisher.stop())
    signal.signal(signal.SIGINT, lambda *_: publisher.stop())
    publisher.run(sample_interval_s=float(cfg["sample_interval_s"]))
    for stop in extras:
        stop()
    refresher.stop()
    backend.shutdown()
    return EXIT_OK


def build(cfg: Dict[str, Any], backend: Any) -> Tuple[Publisher, TagRefresher]:
    """The publisher and its tag refresher from a validated config (raises IdentityUnavailable)."""
    imds = Imds(cfg["imds_url"])
    identity = discover(
        imds,
        lambda region: _ec2(cfg["region"] or region, cfg["endpoint_url"]),
        cfg["identity_cache"],
        resource_config=cfg["hyperpod_resource_config"],
    )
    sender = Sender(
        cloudwatch_client(cfg["region"] or identity.region, cfg["endpoint_url"]),
        max_buffer_age=timedelta(seconds=cfg["buffer_max_age_s"]),
    )
    publisher = Publisher(
        backend,
        identity,
        sender,
        window_s=cfg["window_s"],
        high_resolution=cfg["high_resolution"],
        detail=cfg["detail"],
        detail_gpus=cfg["detail_gpus"],
        memory_on_percent=float(cfg["detail_memory_on_percent"]),
        memory_off_percent=float(cfg["detail_memory_off_percent"]),
        usage=usage_tracker(cfg, backend, identity, sender) if cfg["attribution"] else None,
        caller=caller_userid(cfg["region"] or identity.region, cfg["endpoint_url"]),  # GPU fault corroboration
        host=HostFeed(HostReader(cfg["host_filesystems"]), EfaDeltas()) if cfg["host_metrics"] else None,
    )
    backend.clocks = bool(cfg["prometheus"])
    reader = TagReader(imds, lambda: _ec2(cfg["region"] or identity.region, cfg["endpoint_url"]), identity.instance_id)
    refresher = TagRefresher(
        reader, identity, publisher.set_identity, cfg["identity_cache"], every_s=float(cfg["tag_refresh_s"])
    )
    return publisher, refresher


def usage_tracker(cfg: Dict[str, Any], backend: Any, identity: Any, sender: Sender) -> UsageTracker:
    """Attribution: owners from /proc, allocations from the kubelet when this is a Kubernetes node."""
    from gpufleet_node.attribution import Attributor
    from gpufleet_node.podresources import PodResourcesReader
    from gpufleet_node.slurm_jobs import SlurmJobs

    backend.process_utilization = True
    socket = cfg["pod_resources_socket"]
    pods = None
    if socket and (os.path.exists(socket) or identity.cluster_name):
        pods = PodResourcesReader(socket)
    logs = LogSender(
        logs_client(cfg["region"] or identity.region, cfg["endpoint_url"]),
        cfg["usage_log_group"],
        identity.instance_id,
        max_buffer_age=timedelta(seconds=cfg["buffer_max_age_s"]),
        flush_every_s=max(schema.USAGE_FLUSH_S, int(cfg["usage_window_s"])),  # 3 records a call (schema.py)
    )
    return UsageTracker(
        Attributor(
            proc_root=cfg["proc_root"] or "/proc",
            log_root=cfg["kubelet_log_root"] or "/var/log",
            window_s=float(cfg["usage_window_s"]),
        ),
        pods,
        [backend.describe(i).uuid for i in range(backend.gpu_count)],
        logs,
        sender,
        window_s=int(cfg["usage_window_s"]),
        sample_s=float(cfg["sample_interval_s"]),
        jobs=SlurmJobs() if shutil.which("squeue") else None,  # a Slurm node: jobs' account and partition
    )


def start_extras(cfg: Dict[str, Any], publisher: Publisher) -> List[Callable[[], None]]:
    """The kubelet reader's thread and the Prometheus endpoint, when on; returns how to stop them."""
    stops: List[Callable[[], None]] = []
    kubelet = publisher.usage.pod_resources if publisher.usage is not None else None
    if kubelet is not None:
        kubelet.refresh()  # the first window knows its allocations (at most timeout_s)
        kubelet.start()
        stops.append(kubelet.stop)
    if cfg["prometheus"]:
        try:
            from gpufleet_node.prometheus import GpuCollector, NodeCollector, serve
            from gpufleet_node.views import gpu_views

            infos = [publisher.backend.describe(i) for i in range(publisher.gpus)]
            endpoint = serve(
                GpuCollector(
                    socket_module.gethostname(), lambda: gpu_views(publisher, infos), publisher.identity.instance_id
                ),
                int(cfg["prometheus_port"]),
                cfg["prometheus_address"],
                node=NodeCollector(
                    socket_module.gethostname(), lambda: publisher.host.latest, publisher.identity.instance_id
                ),
            )
        except (OSError, ImportError) as exc:  # port taken, no prometheus_client: metrics go on regardless
            log.error("Prometheus endpoint not started: %s", exc)
        else:
            log.info("Prometheus endpoint on %s:%d/metrics", cfg["prometheus_address"], endpoint.port)
            stops.append(endpoint.stop)
    return stops


def _ec2(region: str, endpoint_url: Optional[str]):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)


if __name__ == "__main__":
    sys.exit(main())
