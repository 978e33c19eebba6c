"""`gpufleet silence` (mute notifications until an expiry) and `gpufleet silences` (list them)."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from gpufleet.domain.notification import NotificationKind, Severity
from gpufleet_tools.cli.options import add_account_options, parse_duration, real_aws_refused, state_table

DEFAULT_FOR = timedelta(hours=2)
DEFAULT_REASON = "silenced from the CLI"
UNKNOWN_BY = "unknown (set --by or $USER)"


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    if name == "silences":
        add_account_options(p, table=True)
        p.set_defaults(func=list_silences)
        return
    p.add_argument("--group", action="append", help="group key glob, e.g. 'asg:train-*' (repeatable)")
    p.add_argument(
        "--kind", action="append", choices=[str(k) for k in NotificationKind], help="notification kind (repeatable)"
    )
    p.add_argument(
        "--severity", action="append", choices=[str(s) for s in Severity], help="notification severity (repeatable)"
    )
    p.add_argument(
        "--for",
        dest="duration",
        type=parse_duration,
        help=f"how long, e.g. 30m, 2h, 1d (default {_span(DEFAULT_FOR)})",
    )
    p.add_argument("--reason", default=DEFAULT_REASON, help=f"why, shown with it (default '{DEFAULT_REASON}')")
    p.add_argument("--by", help="who silenced it (default $USER, else your login name)")
    p.add_argument("--expire", metavar="ID", help="end the silence with this id now")
    add_account_options(p, table=True, changes="write the silence")
    p.set_defaults(func=silence)


def _store(args: argparse.Namespace) -> Any:
    from gpufleet.aws.incidents import IncidentStore
    from gpufleet_tools.session import client

    return IncidentStore(client("dynamodb", args.endpoint), state_table(args))


def silence(args: argparse.Namespace) -> int:
    from gpufleet.domain.incidents import Silence

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
        created_by=args.by or who(),
        starts_at=now,
        expires_at=now + (args.duration or DEFAULT_FOR),
    )
    store.put_silence(s)
    span = f"{_span(args.duration)}" if args.duration else f"{_span(DEFAULT_FOR)} (default; --for to change)"
    print(f"silence {s.silence_id} by {s.created_by}: {describe(s)}")
    print(f"silenced for {span}, until {s.expires_at:%Y-%m-%d %H:%M}Z (--expire {s.silence_id} ends it sooner)")
    return 0


def who() -> str:
    """Who is silencing, for whoever reads `silences` later: $USER, else the OS login, else a note that
    says how to name them."""
    import getpass

    try:
        return os.environ.get("USER") or getpass.getuser() or UNKNOWN_BY
    except (OSError, KeyError, ImportError):  # no login name anywhere (a bare container)
        return UNKNOWN_BY


def _span(duration: timedelta) -> str:
    """2h, 90m, 1d: in the largest whole unit, as --for takes it."""
    seconds = int(duration.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


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
        print(f"{s.silence_id}  until {s.expires_at:%Y-%m-%d %H:%M}Z  by {s.created_by or 'unknown'}  {describe(s)}")
    return 0
