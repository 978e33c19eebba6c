"""`gpufleet invoke FUNCTION --event FILE`: one handler call in-process (no Docker)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpufleet_tools.cli.options import add_invoke_options, read_event, real_aws_refused


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("function", help="name under functions/, e.g. scaler")
    p.add_argument("--event", required=True, help="event JSON file (see events/)")
    add_invoke_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return run_function(args.function, read_event(args.event), args)


def run_function(function: str, event: Any, args: argparse.Namespace) -> int:
    """The handler's result alone on stdout (JSON); a failure is one line on stderr and exit 1."""
    from gpufleet_tools.invoke import invoke

    if real_aws_refused(args):
        return 2
    try:
        result = invoke(
            function,
            event,
            endpoint=args.endpoint,
            policy=args.policy,
            table=args.table,
            dry_run=args.dry_run,
            functions_dir=args.functions_dir,
        )
    except Exception as exc:
        print(f"error: {function} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str))
    return 0
