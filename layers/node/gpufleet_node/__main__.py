"""`python -m gpufleet_node`: the on-node GPU metric publisher (systemd service gpufleet-publisher).

Exit codes: 0 stopped normally; 2 bad configuration; 3 no NVML library or driver (a clear one-line
message; systemd restarts with backoff, e.g. while the driver is still loading at boot); 4 no
instance identity (IMDS unreachable).
"""

import argparse
import logging
import signal
import sys
from datetime import timedelta
from typing import List, Optional

from gpufleet_node import config as config_mod
from gpufleet_node.identity import IdentityUnavailable, Imds, discover
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
    logging.getLogger().setLevel(str(cfg["log_level"]).upper())
    try:
        backend = NvmlBackend()
        backend.init()  # fail fast, before talking to IMDS or AWS
    except NvmlUnavailable as exc:
        print("gpufleet-publisher: no NVIDIA driver/NVML on this machine: %s" % exc, file=sys.stderr)
        return EXIT_NO_NVML
    try:
        identity = discover(
            Imds(cfg["imds_url"]),
            lambda region: _ec2(cfg["region"] or region, cfg["endpoint_url"]),
            cfg["identity_cache"],
        )
    except IdentityUnavailable as exc:
        print("gpufleet-publisher: %s" % exc, file=sys.stderr)
        return EXIT_NO_IDENTITY
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
    )
    publisher.start()
    signal.signal(signal.SIGTERM, lambda *_: publisher.stop())
    signal.signal(signal.SIGINT, lambda *_: publisher.stop())
    publisher.run(sample_interval_s=float(cfg["sample_interval_s"]))
    backend.shutdown()
    return EXIT_OK


def _ec2(region: str, endpoint_url: Optional[str]):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)


if __name__ == "__main__":
    sys.exit(main())
