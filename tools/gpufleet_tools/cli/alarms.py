"""`gpufleet alarms GROUP...`: the scaling alarms a group needs, as CloudFormation or put with --apply."""

from __future__ import annotations

import argparse
import os
import sys

from gpufleet.domain import defaults
from gpufleet_tools.cli.options import add_account_options, real_aws_refused


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("groups", nargs="+", metavar="GROUP", help="asg:NAME or eks:CLUSTER/NODEGROUP")
    prefix = os.environ.get(defaults.ENV_ALARM_PREFIX, defaults.DEFAULT_ALARM_PREFIX)
    p.add_argument("--prefix", default=prefix, help="the stack's AlarmNamePrefix (default: $GPUFLEET_ALARM_PREFIX)")
    p.add_argument("--high", type=float, default=85, help="scale out above this GPU utilization (percent)")
    p.add_argument("--low", type=float, default=20, help="scale in below this GPU utilization (percent)")
    p.add_argument("--memory-high", type=float, help="also scale out above this GPU memory use (percent)")
    p.add_argument("--apply", action="store_true", help="put them (PutMetricAlarm) instead of printing")
    add_account_options(p, changes="put them (with --apply)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """CloudFormation on stdout; with --apply, PutMetricAlarm for each (real AWS only with --aws)."""
    import yaml

    from gpufleet.domain.models import GroupRef
    from gpufleet_tools.alarm_specs import cloudformation, put_metric_alarm_args, scaling_alarms

    try:
        refs = [GroupRef.parse_key(g) for g in args.groups]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    specs = [s for ref in refs for s in scaling_alarms(ref, args.prefix, args.high, args.low, args.memory_high)]
    if not args.apply:
        print(yaml.safe_dump(cloudformation(specs), sort_keys=False), end="")
        return 0
    if real_aws_refused(args):
        return 2
    from gpufleet_tools.session import client, use_endpoint

    use_endpoint(args.endpoint)
    cloudwatch = client("cloudwatch")
    for spec in specs:
        cloudwatch.put_metric_alarm(**put_metric_alarm_args(spec))
        print(f"put {spec.name}: scale {spec.direction} {spec.group}", file=sys.stderr)
    return 0
