"""`gpufleet alarms GROUP...`: the scaling alarms a group needs, as CloudFormation or put with --apply."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpufleet.domain import defaults
from gpufleet_tools.cli.options import add_account_options, real_aws_refused


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    from gpufleet_tools.alarm_specs import DEFAULT_HIGH, DEFAULT_LOW

    p.add_argument("groups", nargs="+", metavar="GROUP", help="asg:NAME or eks:CLUSTER/NODEGROUP")
    prefix = os.environ.get(defaults.ENV_ALARM_PREFIX, defaults.DEFAULT_ALARM_PREFIX)
    p.add_argument("--prefix", default=prefix, help="the stack's AlarmNamePrefix (default: $GPUFLEET_ALARM_PREFIX)")
    p.add_argument(
        "--high",
        type=float,
        default=DEFAULT_HIGH,
        help=f"scale out above this GPU utilization (percent, default {DEFAULT_HIGH:g}; above --low)",
    )
    p.add_argument(
        "--low",
        type=float,
        default=DEFAULT_LOW,
        help=f"scale in below this GPU utilization (percent, default {DEFAULT_LOW:g})",
    )
    p.add_argument("--memory-high", type=float, help="also scale out above this GPU memory use (percent)")
    p.add_argument(
        "--apply", action="store_true", help="put them (PutMetricAlarm) instead of printing; the groups must exist"
    )
    add_account_options(p, changes="put them (with --apply)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """CloudFormation on stdout; with --apply, PutMetricAlarm for each (real AWS only with --aws), and only
    when every group exists: an alarm on a group that does not is never acted on."""
    import yaml

    from gpufleet.domain.models import GroupRef
    from gpufleet_tools.alarm_specs import band_problem, cloudformation, put_metric_alarm_args, scaling_alarms

    try:
        refs = [GroupRef.parse_key(g) for g in args.groups]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if problem := band_problem(args.high, args.low, args.memory_high):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    specs = [s for ref in refs for s in scaling_alarms(ref, args.prefix, args.high, args.low, args.memory_high)]
    if not args.apply:
        print(yaml.safe_dump(cloudformation(specs), sort_keys=False), end="")
        return 0
    if real_aws_refused(args):
        return 2
    from gpufleet_tools.session import client, use_endpoint

    use_endpoint(args.endpoint)
    if refusals := _missing_groups(refs, client("autoscaling"), client("eks")):
        print("\n".join(refusals), file=sys.stderr)
        return 2
    cloudwatch = client("cloudwatch")
    for spec in specs:
        cloudwatch.put_metric_alarm(**put_metric_alarm_args(spec))
        print(f"put {spec.name}: scale {spec.direction} {spec.group}", file=sys.stderr)
    return 0


def _missing_groups(refs: list[Any], autoscaling: Any, eks: Any) -> list[str]:
    """One refusal line per group the account does not have, with the closest managed (else any) group
    names; none when every group exists, or when the groups cannot be listed (said, then the alarms go on)."""
    from gpufleet.aws.clients import AWS_FAILURES, error_code
    from gpufleet.aws.fleet import FleetReader
    from gpufleet_tools.doctor.core import did_you_mean, is_backing_asg

    try:
        groups = FleetReader.of(autoscaling, eks).every_group()
    except AWS_FAILURES as exc:
        print(
            f"warning: could not list the groups to check the names ({error_code(exc)}); putting them", file=sys.stderr
        )
        return []
    own = [g for g in groups if not is_backing_asg(g)]
    managed = sorted(g.ref.key for g in own if g.tags.get(defaults.TAG_MANAGED) == defaults.TAG_MANAGED_VALUE)
    tag = f"{defaults.TAG_MANAGED}={defaults.TAG_MANAGED_VALUE}"
    listed = f"the managed groups here: {', '.join(managed[:5])}{', ...' if len(managed) > 5 else ''}"
    out = []
    for ref in refs:
        if any(g.ref == ref for g in groups):
            continue
        hint = did_you_mean(ref.key, managed) or did_you_mean(ref.key, [g.ref.key for g in own])
        hint = hint or (listed if managed else f"no group here is tagged {tag}")
        out.append(f"error: {ref.key} does not exist in this account and region: no alarm was put; {hint}")
    return out
