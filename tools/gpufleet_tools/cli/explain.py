"""`gpufleet explain GROUP`: a group's recent decisions and their reasons, from the audit log."""

from __future__ import annotations

import argparse

from gpufleet_tools.cli.options import add_account_options, positive_int, state_table


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("group", help="asg:NAME, eks:CLUSTER/NODEGROUP, a bare ASG name, or 'unresolved'")
    add_account_options(p, table=True)
    p.add_argument(
        "--limit", type=positive_int, default=20, help="how many recent decisions, newest first (default 20)"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.aws.audit import AuditLog
    from gpufleet.domain.models import GroupRef
    from gpufleet_tools.session import client

    key = args.group if args.group == "unresolved" else GroupRef.parse_key(args.group).key
    decisions = AuditLog(client("dynamodb", args.endpoint), state_table(args)).recent(key, args.limit)
    if not decisions:
        print(f"no recorded decisions for {key}")
        return 0
    for d in decisions:
        change = f"{d.current} -> {d.desired}" if d.desired != d.current or d.victims else f"{d.current}"
        print(f"{d.at:%Y-%m-%d %H:%M:%S}Z  {d.action:<11} {d.outcome:<13} {change:<8} {d.trigger!s}")
        print(f"    {d.reason}")
        if d.detail:
            print(f"    -> {d.detail}")
    return 0
