"""`gpufleet` command line: one module per command behind a command table (`COMMANDS`).

A command's module is imported only when that command runs (or its help is asked for), so `gpufleet
validate-policy` does not pay for boto3, moto or matplotlib.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    module: str  # under gpufleet_tools.cli: defines add_arguments(parser) and run(args) -> exit code
    summary: str


COMMANDS: dict[str, Command] = {
    "validate-policy": Command("validate", "check a fleet policy file"),
    "invoke": Command("invoke", "run a function's handler in-process (no Docker)"),
    "local": Command("local", "the stack on your machine: `local up`, `local send EVENT`, `local down`"),
    "alarms": Command("alarms", "the scaling alarms for groups: CloudFormation, or --apply them"),
    "explain": Command("explain", "print a group's recent decisions and their reasons"),
    "doctor": Command("doctor", "check a policy against an account (read-only): groups, tags, bounds, alarms, routes"),
    "silence": Command("silence", "mute notifications by group / kind / severity until an expiry"),
    "silences": Command("silence", "list active silences"),
    "replay": Command("replay", "replay a workload trace or a group's CloudWatch history through the decision core"),
    "report": Command("report", "who used the GPUs: GPU-hours, idle, cost per team and workload"),
}
DESCRIPTION = "gpufleet's operator tooling: " + ", ".join(COMMANDS) + "."


def _chosen(argv: Sequence[str]) -> str | None:
    """The command named on the line (the first word that is not an option), if it is one we have."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """Every command is listed; only the one named in `argv` is imported and given its arguments (all of
    them when `argv` names none, e.g. for tests that check every command's help)."""
    parser = argparse.ArgumentParser(prog="gpufleet", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.summary, description=command.summary)
        if (chosen is None and argv) or chosen not in (None, name):
            continue
        module = importlib.import_module(f"gpufleet_tools.cli.{command.module}")
        module.add_arguments(p, name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(words).parse_args(words)
    code: int = args.func(args)
    return code
