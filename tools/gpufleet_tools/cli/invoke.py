"""`gpufleet invoke FUNCTION --event FILE`: one handler call in-process (no Docker)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from gpufleet_tools.cli.options import add_invoke_options, read_event, real_aws_refused

if TYPE_CHECKING:
    from gpufleet_tools.invoke import Invocation


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("function", help="name under functions/, e.g. scaler")
    p.add_argument("--event", required=True, help="event JSON file (see events/)")
    add_invoke_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The handler's result alone on stdout (JSON); a failure is one line on stderr and exit 1."""
    from gpufleet_tools.invoke import NotReady

    if real_aws_refused(args):
        return 2
    event = read_event(args.event)
    try:
        done = call_function(args.function, event, args)
    except NotReady as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        print(f"error: {args.function} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(done.result, indent=2, default=str))
    return 0


def call_function(function: str, event: Any, args: argparse.Namespace) -> Invocation:
    """One handler call with the command's options; a result the idempotency store gave back instead of
    running is said so on stderr (it would otherwise read as a fresh decision)."""
    from gpufleet_tools.invoke import find_function, invoke

    app = find_function(function, args.functions_dir)
    _prepare_once(args)
    done = invoke(app, event)
    for stored in done.already_handled:
        print(stored.notice(), file=sys.stderr)
    return done


def _prepare_once(args: argparse.Namespace) -> None:
    """prepare() with the command's options, on its first call only: `local send` calls once per matched
    rule and the notifier, and the environment, the table and the account do not change between calls
    (a refused account lookup is not asked again). NotReady when the table is not there."""
    from gpufleet_tools.invoke import prepare

    if getattr(args, "_prepared", False):
        return
    prepare(args.endpoint, args.policy, args.table, args.dry_run)
    args._prepared = True
