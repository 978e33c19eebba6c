"""`gpufleet doctor --policy FILE`: the policy checked against an account, read-only."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from gpufleet.domain import defaults
from gpufleet_tools.cli.options import add_account_options


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--policy", required=True, help="the fleet policy file")
    add_account_options(p)
    p.add_argument("--slack-secret", help=f"Slack secret ARN (default ${defaults.ENV_SLACK_SECRET})")
    p.add_argument("--topic", help=f"SNS topic ARN (default ${defaults.ENV_NOTIFY_TOPIC_ARN})")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when all checks pass, 1 with warnings, 2 with errors (the policy's own included)."""
    from gpufleet.policy.fleet import PolicyError, parse_policy
    from gpufleet_tools.doctor.core import Level, diagnose, worst
    from gpufleet_tools.doctor.service import build_account_reader
    from gpufleet_tools.session import use_endpoint

    try:
        policy = parse_policy(Path(args.policy).read_text(), args.policy)
    except (OSError, PolicyError) as exc:
        for problem in getattr(exc, "problems", [str(exc)]):
            print(f"error   policy: {problem}")
        return 2
    use_endpoint(args.endpoint)
    slack = args.slack_secret or os.environ.get(defaults.ENV_SLACK_SECRET)
    topic = args.topic or os.environ.get(defaults.ENV_NOTIFY_TOPIC_ARN)
    findings = diagnose(policy, build_account_reader().read(policy, slack, topic))
    order = {Level.ERROR: 0, Level.WARNING: 1, Level.OK: 2}
    for f in sorted(findings, key=lambda f: order[f.level]):
        print(f"{f.level:<7} {f.subject}: {f.text}")
    counts = {level: sum(f.level is level for f in findings) for level in Level}
    verdict = worst(findings)
    print(f"{counts[Level.ERROR]} error(s), {counts[Level.WARNING]} warning(s), {counts[Level.OK]} ok: {verdict}")
    return {Level.OK: 0, Level.WARNING: 1, Level.ERROR: 2}[verdict]
