"""`gpufleet silence` (mute notifications until an expiry) and `gpufleet silences` (list them)."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.notify.model import NotificationKind, Severity
from gpufleet_tools.cli.options import add_account_options, parse_duration, real_aws_refused, state_table


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "silences":
        add_account_options(p, table=True)
        p.set_defaults(func=list_silences)
        return
    p.add_argument("--group", action="append", help="group key glob, e.g. 'asg:train-*' (repeatable)")
    p.add_argument(
        "--kind", action="append", choices=[str(k) for k in NotificationKind], help="notification kind (repeatable)"
    )
    p.add_argument("--severity", action="append", choices=[str(s) for s in Severity])
    p.add_argument("--for", dest="duration", type=parse_duration, default=timedelta(hours=2), help="e.g. 30m, 2h")
    p.add_argument("--reason", default="silenced from the CLI")
    p.add_argument("--by", help="who (default $USER)")
    p.add_argument("--expire", metavar="ID", help="end the silence with this id now")
    add_account_options(p, table=True, changes="write the silence")
    p.set_defaults(func=silence)


def _store(args: argparse.Namespace) -> Any:
    from gpufleet.aws.incidents import IncidentStore
    from gpufleet_tools.session import client

    return IncidentStore(client("dynamodb", args.endpoint), state_table(args))


def silence(args: argparse.Namespace) -> int:
    from gpufleet.notify.incidents import Silence

    if real_aws_refused(args):
        return 2
    store = _store(args)
    now = datetime.now(UTC)
    if args.expire:
        expired = store.expire_silence(args.expire, now)
        print(f"silence {args.expire} expired" if expired else f"no silence {args.expire}")
        return 0 if expired else 1
    if not (args.group or args.kind or args.severity):
        print("error: a silence needs at least one of --group, --kind, --severity", file=sys.stderr)
        return 2
    s = Silence(
        silence_id=uuid.uuid4().hex[:12],
        groups=tuple(args.group or ()),
        kinds=tuple(args.kind or ()),
        severities=tuple(Severity(s) for s in args.severity or ()),
        reason=args.reason,
        created_by=args.by or os.environ.get("USER", ""),
        starts_at=now,
        expires_at=now + args.duration,
    )
    store.put_silence(s)
    print(f"silence {s.silence_id} until {s.expires_at:%Y-%m-%d %H:%M}Z: {describe(s)}")
    return 0


def describe(s: Any) -> str:
    parts = [
        f"groups {', '.join(s.groups)}" if s.groups else "",
        f"kinds {', '.join(s.kinds)}" if s.kinds else "",
        f"severities {', '.join(s.severities)}" if s.severities else "",
    ]
    return "; ".join(p for p in parts if p) + f" ({s.reason})"


def list_silences(args: argparse.Namespace) -> int:
    silences = _store(args).silences(datetime.now(UTC))
    if not silences:
        print("no active silences")
    for s in sorted(silences, key=lambda s: s.expires_at):
        print(f"{s.silence_id}  until {s.expires_at:%Y-%m-%d %H:%M}Z  by {s.created_by or '?'}  {describe(s)}")
    return 0
