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
    purpose: str  # the line of the top-level help that lists it with its kin


CHECK, ALARMS, WATCH, TRY, USAGE = (
    "check a policy",
    "make scaling alarms",
    "see and mute what it does",
    "try it without deploying",
    "who used the GPUs",
)
COMMANDS: dict[str, Command] = {
    "validate-policy": Command("validate", "check a fleet policy file", CHECK),
    "doctor": Command(
        "doctor", "check a policy against an account (read-only): groups, tags, bounds, alarms, routes", CHECK
    ),
    "alarms": Command("alarms", "the scaling alarms for groups: CloudFormation, or --apply them", ALARMS),
    "explain": Command("explain", "print a group's recent decisions and their reasons", WATCH),
    "silence": Command("silence", "mute notifications by group / kind / severity until an expiry", WATCH),
    "silences": Command("silence", "list active silences", WATCH),
    "local": Command("local", "the stack on your machine: `local up`, `local send EVENT`, `local down`", TRY),
    "invoke": Command("invoke", "run a function's handler in-process (no Docker)", TRY),
    "replay": Command(
        "replay", "replay a workload trace or a group's CloudWatch history through the decision core", TRY
    ),
    "report": Command("report", "who used the GPUs: GPU-hours, idle, cost per team and workload", USAGE),
}
DESCRIPTION = "gpufleet's operator tooling, command by command:\n" + "\n".join(
    f"  {purpose + ':':<28}{', '.join(n for n, c in COMMANDS.items() if c.purpose == purpose)}"
    for purpose in dict.fromkeys(c.purpose for c in COMMANDS.values())
)
EPILOG = "`gpufleet COMMAND -h` for a command's options; docs/cli.md for the whole tour."
DISTRIBUTION = "gpufleet"  # pyproject.toml's [project] name: the distribution that ships gpufleet_tools


def version() -> str:
    """The installed distribution's version; run from a checkout without installing, it says so."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e '.[tools]' from the checkout)"


class _Version(argparse.Action):
    """--version, read only when asked (package metadata is not free on every run)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print gpufleet's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(f"gpufleet {version()}")  # stdout, as argparse's own version action
        parser.exit()


def _chosen(argv: Sequence[str]) -> str | None:
    """The command named on the line (the first word that is not an option), if it is one we have."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """Every command is listed; only the one named in `argv` is imported and given its arguments (all of
    them when `argv` names none, e.g. for tests that check every command's help)."""
    parser = argparse.ArgumentParser(
        prog="gpufleet", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action=_Version)
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
