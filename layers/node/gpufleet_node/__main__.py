"""`python -m gpufleet_node`: the on-node GPU metric publisher (systemd service gpufleet-publisher).

Exit codes: 0 stopped normally; 2 bad configuration (one line naming the field and the value); 3 no
NVML library or driver (a clear one-line message; systemd restarts with backoff, e.g. while the driver
is still loading at boot); 4 no instance identity (IMDS unreachable).
"""

import argparse
import logging
import signal
import sys
from datetime import timedelta
from typing import Any, Dict, List, Optional, Tuple

from gpufleet_node import config as config_mod
from gpufleet_node.identity import IdentityUnavailable, Imds, TagReader, TagRefresher, discover
from gpufleet_node.nvml import NvmlBackend, NvmlUnavailable
from gpufleet_node.publisher import Publisher
from gpufleet_node.sender import Sender, cloudwatch_client

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
    signal.signal(signal.SIGTERM, lambda *_: publisher.stop())
    signal.signal(signal.SIGINT, lambda *_: publisher.stop())
    publisher.run(sample_interval_s=float(cfg["sample_interval_s"]))
    refresher.stop()
    backend.shutdown()
    return EXIT_OK


def build(cfg: Dict[str, Any], backend: Any) -> Tuple[Publisher, TagRefresher]:
    """The publisher and its tag refresher from a validated config (raises IdentityUnavailable)."""
    imds = Imds(cfg["imds_url"])
    identity = discover(imds, lambda region: _ec2(cfg["region"] or region, cfg["endpoint_url"]), cfg["identity_cache"])
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
    )
    reader = TagReader(imds, lambda: _ec2(cfg["region"] or identity.region, cfg["endpoint_url"]), identity.instance_id)
    refresher = TagRefresher(
        reader, identity, publisher.set_identity, cfg["identity_cache"], every_s=float(cfg["tag_refresh_s"])
    )
    return publisher, refresher


def _ec2(region: str, endpoint_url: Optional[str]):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)


if __name__ == "__main__":
    sys.exit(main())
