"""`gpufleet-node`: commands for the programs that run on a GPU node (the publisher is a service of its own,
`python -m gpufleet_node`). Python >= 3.9.

  gpufleet-node busy [--strict] [--state-dir DIR] [--config PATH] -- COMMAND [ARGS...]

`busy` keeps this node from being scaled in while COMMAND runs (gpufleet_node.busy says how and why).
It finds the instance and its Auto Scaling group the way the publisher does (IMDSv2, the instance's
tags; the publisher's identity cache when it has one), with the publisher's configuration file for
`imds_url`, `region`, `endpoint_url` and `identity_cache`. Exit codes: COMMAND's; 2 bad usage or
configuration; 4 no instance identity or no Auto Scaling group; 75 `--strict` and the protection could
not be set; 127 COMMAND could not be run.
"""

import argparse
import sys
from typing import Any, Callable, List, Optional

from gpufleet_node import busy
from gpufleet_node import config as config_mod
from gpufleet_node.identity import IdentityUnavailable, Imds, discover

EXIT_NO_IDENTITY = 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet-node", description="Commands for programs on a GPU node.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    b = sub.add_parser(
        "busy",
        help="protect this instance from scale-in while COMMAND runs",
        description="Protect this instance from scale-in while COMMAND runs (Auto Scaling instance scale-in "
        "protection); cleared when the last such command on the node ends. Exit code: COMMAND's.",
    )
    b.add_argument("--strict", action="store_true", help="do not run COMMAND when the protection cannot be set")
    b.add_argument(
        "--state-dir",
        default=None,
        help="where jobs on this node count themselves (default $%s or %s)"
        % (busy.ENV_STATE_DIR, busy.DEFAULT_STATE_DIR),
    )
    b.add_argument("--config", default=config_mod.DEFAULT_PATH, help="the publisher's configuration file")
    b.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    return parser


def main(argv: Optional[List[str]] = None, autoscaling_factory: Optional[Callable[[str, Any], Any]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command != "busy":
        parser.print_help(sys.stderr)
        return busy.EXIT_USAGE
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        print("gpufleet-node busy: no command given (gpufleet-node busy -- COMMAND [ARGS...])", file=sys.stderr)
        return busy.EXIT_USAGE
    try:
        cfg = config_mod.load(args.config)
    except config_mod.ConfigError as exc:
        print("gpufleet-node busy: %s" % exc, file=sys.stderr)
        return busy.EXIT_USAGE
    factory = autoscaling_factory or _autoscaling
    try:
        identity = discover(
            Imds(cfg["imds_url"]),
            lambda region: _ec2(cfg["region"] or region, cfg["endpoint_url"]),
            cfg["identity_cache"],
        )
    except IdentityUnavailable as exc:
        return _unprotected(command, args.strict, str(exc))
    if not identity.asg_name:
        why = "instance %s is in no Auto Scaling group (no %s tag%s)" % (
            identity.instance_id,
            "aws:autoscaling:groupName",
            "" if identity.tags_known else ": its tags could not be read",
        )
        return _unprotected(command, args.strict, why)
    client = factory(cfg["region"] or identity.region, cfg["endpoint_url"])
    protection = busy.AsgProtection(client, identity.instance_id, identity.asg_name)
    return busy.run_busy(command, protection, busy.Holders(busy.state_dir(args.state_dir)), strict=args.strict)


def _unprotected(command: List[str], strict: bool, why: str) -> int:
    """No identity to protect: as with a failed SetInstanceProtection, run anyway unless --strict."""
    if strict:
        print("gpufleet-node busy: %s; not running the command (--strict)" % why, file=sys.stderr)
        return EXIT_NO_IDENTITY
    print("gpufleet-node busy: %s; running the command without scale-in protection" % why, file=sys.stderr)
    return busy.run_busy(command, None, busy.Holders(""), protect=False)


def _autoscaling(region: str, endpoint_url: Optional[str]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "autoscaling",
        region_name=region,
        endpoint_url=endpoint_url,
        config=Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=10),
    )


def _ec2(region: str, endpoint_url: Optional[str]) -> Any:
    import boto3

    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)


if __name__ == "__main__":
    sys.exit(main())
