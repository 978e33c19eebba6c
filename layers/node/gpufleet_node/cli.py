"""`gpufleet-node`: commands for the programs that run on a GPU node (the publisher is a service of its own,
`python -m gpufleet_node`). Python >= 3.9.

  gpufleet-node busy [--strict] [--state-dir DIR] [--config PATH] -- COMMAND [ARGS...]

`busy` keeps this node from being scaled in while COMMAND runs (gpufleet_node.busy says how and why).
It finds the instance and its Auto Scaling group the way the publisher does (IMDSv2, the instance's
tags; the publisher's identity cache when it has one), with the publisher's configuration file for
`imds_url`, `region`, `endpoint_url` and `identity_cache`, and its own aws:userid from
sts:GetCallerIdentity (no permission needed): the busy mark's key. Exit codes: COMMAND's; 2 bad usage or
configuration; 4 no instance identity, no Auto Scaling group, or credentials that are not this
instance's profile; 75 `--strict` and the mark could not be written; 127 COMMAND could not be run.
"""

import argparse
import sys
from typing import Any, Callable, List, Optional

from gpufleet_node import busy, schema
from gpufleet_node import config as config_mod
from gpufleet_node.identity import IdentityUnavailable, Imds, discover

EXIT_NO_IDENTITY = 4


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet-node", description="Commands for programs on a GPU node.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    b = sub.add_parser(
        "busy",
        help="keep this instance from scale-in while COMMAND runs",
        description="Keep this instance from scale-in while COMMAND runs (a busy mark the gpufleet scaler turns "
        "into Auto Scaling scale-in protection); dropped when the last such command on the node ends. "
        "Exit code: COMMAND's.",
    )
    b.add_argument("--strict", action="store_true", help="do not run COMMAND when the busy mark cannot be written")
    b.add_argument(
        "--state-dir",
        default=None,
        help="where jobs on this node count themselves (default $%s or %s)"
        % (busy.ENV_STATE_DIR, busy.DEFAULT_STATE_DIR),
    )
    b.add_argument("--config", default=config_mod.DEFAULT_PATH, help="the publisher's configuration file")
    b.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")
    return parser


def main(argv: Optional[List[str]] = None, client_factory: Optional[Callable[[str, str, Any], Any]] = None) -> int:
    """`client_factory(service, region, endpoint_url)`: the AWS clients (tests give fakes)."""
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
    factory = client_factory or _client
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
    region = cfg["region"] or identity.region
    try:
        userid = str(factory("sts", region, cfg["endpoint_url"]).get_caller_identity()["UserId"])
    except Exception as exc:  # no network, no credentials: as a failed mark
        return _unprotected(command, args.strict, "sts:GetCallerIdentity failed (%s)" % exc)
    if schema.userid_instance(userid) != identity.instance_id:
        why = "credentials %s are not instance %s's profile: the scaler would not take their mark" % (
            userid,
            identity.instance_id,
        )
        return _unprotected(command, args.strict, why)
    client = factory("dynamodb", region, cfg["endpoint_url"])
    protection = busy.BusyMark(client, userid, identity.instance_id, identity.asg_name)
    return busy.run_busy(command, protection, busy.Holders(busy.state_dir(args.state_dir)), strict=args.strict)


def _unprotected(command: List[str], strict: bool, why: str) -> int:
    """No identity to mark: as with a failed mark, run anyway unless --strict."""
    if strict:
        print("gpufleet-node busy: %s; not running the command (--strict)" % why, file=sys.stderr)
        return EXIT_NO_IDENTITY
    print("gpufleet-node busy: %s; running the command without a busy mark" % why, file=sys.stderr)
    return busy.run_busy(command, None, busy.Holders(""), protect=False)


def _client(service: str, region: str, endpoint_url: Optional[str]) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        service,
        region_name=region,
        endpoint_url=endpoint_url,
        config=Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=10),
    )


def _ec2(region: str, endpoint_url: Optional[str]) -> Any:
    import boto3

    return boto3.client("ec2", region_name=region, endpoint_url=endpoint_url)


if __name__ == "__main__":
    sys.exit(main())
