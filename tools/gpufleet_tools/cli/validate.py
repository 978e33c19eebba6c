"""`gpufleet validate-policy FILE`: schema errors, then the mistakes that parse but bite."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpufleet.policy.checks import policy_problems
from gpufleet.policy.fleet import PolicyError, parse_policy


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("file", help="the fleet policy, YAML or JSON (as put in the SSM parameter)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        policy = parse_policy(Path(args.file).read_text(), args.file)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PolicyError as exc:
        problems = list(exc.problems)
    else:
        problems = policy_problems(policy)  # parses, but would bite: shadowed rules, windows above max...
    if problems:
        print(f"{args.file}: invalid", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    rules = len(policy.groups)
    print(
        f"{args.file}: ok ({rules} group rule(s), {len(policy.alarms)} alarm mapping(s), "
        f"discovery by tag {policy.discovery.tag_key}={policy.discovery.tag_value}"
        f"{', dry-run' if policy.dry_run else ''})"
    )
    return 0
