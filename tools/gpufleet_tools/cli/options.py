"""What several commands share: where they talk to (--endpoint, --table, --aws), the invoke options, and
reading an event file."""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from gpufleet.aws.clients import is_loopback
from gpufleet.domain import defaults
from gpufleet_tools.invoke import DEFAULT_TABLE

TEMPLATE_HELP = "the SAM template (default: template.yaml here or above)"


def add_account_options(p: argparse.ArgumentParser, *, table: bool = False, changes: str | None = None) -> None:
    """Where a command talks to: --endpoint (moto), the state --table, and for commands that change AWS
    the --aws that says real AWS is meant (`changes` says what would change)."""
    p.add_argument("--endpoint", help="AWS endpoint URL, e.g. http://127.0.0.1:5000 for moto server")
    if table:
        p.add_argument("--table", help=f"state table name (default ${defaults.ENV_STATE_TABLE} or {DEFAULT_TABLE})")
    if changes:
        p.add_argument("--aws", action="store_true", help=f"without --endpoint: yes, {changes} in real AWS")


def add_invoke_options(p: argparse.ArgumentParser) -> None:
    add_account_options(p, table=True, changes="run the function")
    p.add_argument("--policy", help="fleet policy file (instead of the SSM parameter)")
    p.add_argument("--dry-run", action="store_true", help="decide and record, change nothing")
    p.add_argument("--functions-dir", help="where functions/<name>/app.py live")


def real_aws_refused(args: argparse.Namespace) -> bool:
    """Commands that can change AWS run against real AWS only when asked to: --endpoint, or --aws."""
    endpoint = args.endpoint or os.environ.get(defaults.ENV_ENDPOINT_URL)  # `local up` exports one
    if args.aws or (endpoint and (args.endpoint or is_loopback(endpoint))):
        return False
    command = " ".join(filter(None, (args.command, getattr(args, "local_command", None))))
    print(
        f"error: {command} would use your AWS credentials against real AWS; pass --aws to mean it, "
        "or --endpoint http://127.0.0.1:PORT for moto server",
        file=sys.stderr,
    )
    return True


def state_table(args: argparse.Namespace) -> str:
    return str(args.table or os.environ.get(defaults.ENV_STATE_TABLE, DEFAULT_TABLE))


def read_event(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"error: cannot read event {path}: {exc}") from None


def find_template(given: str | None) -> Path:
    here = Path.cwd()
    candidates = [Path(given)] if given else [p / "template.yaml" for p in (here, *here.parents)]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise SystemExit("error: no template.yaml found (try --template)")
    return found


def positive_int(text: str) -> int:
    """An argument that counts something: a whole number from 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 (got {text!r})")
    return int(text)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """'90m', '2h', '1d' -> timedelta."""
    value, unit = text[:-1], text[-1:]
    if unit not in _DURATION_UNITS or not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration like 30m, 2h or 1d (got {text!r})")
    return timedelta(seconds=int(value) * _DURATION_UNITS[unit])
