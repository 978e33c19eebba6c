"""`gpufleet report`: who used the GPUs over a period, from the nodes' usage records in CloudWatch Logs:
GPU-hours allocated, busy and idle, peak memory and cost per team, workload and group, and the money
wasted, ranked (docs/report.md)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet_tools.cli.options import add_account_options, parse_duration

if TYPE_CHECKING:
    from gpufleet_tools.report.fleet import KnownNodes
    from gpufleet_tools.report.prices import PriceBook
    from gpufleet_tools.report.usage import Period, Report, Selection


def _when(text: str) -> datetime:
    """ISO 8601 date or time; without a zone it is UTC."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 time like 2026-11-01T00:00Z (got {text!r})") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    """`gpufleet report`'s options. Long because argparse's options are flat calls, one per option, and
    read best in the order `--help` shows them."""
    from gpufleet_tools.report.reader import DEFAULT_WORKERS, FILTER_LOG_EVENTS_TPS
    from gpufleet_tools.report.render import DEFAULT_TOP, Format

    when = p.add_mutually_exclusive_group()
    when.add_argument("--since", type=parse_duration, help="the last 100m, 12h, 7d, ... (default 7d)")
    when.add_argument("--start", type=_when, help="period start, ISO 8601 (UTC unless a zone is given)")
    p.add_argument("--end", type=_when, help="period end with --start (default: now)")
    p.add_argument(
        "--group",
        action="append",
        default=[],
        help="only this group: asg:NAME, eks:CLUSTER/NODEGROUP or hyperpod:CLUSTER/GROUP (repeatable)",
    )
    p.add_argument("--cluster", action="append", default=[], help="only this EKS cluster's node groups (repeatable)")
    p.add_argument(
        "--by",
        choices=["team", "account", "partition"],
        default="team",
        help="what the team table sums by: team (default), or a Slurm job's account or partition",
    )
    p.add_argument(
        "--verify-nodes",
        action="store_true",
        help="count a record only if EC2, Auto Scaling or HyperPod knows its node and the node ran then "
        "(needs ec2:DescribeInstances, autoscaling:DescribeScalingActivities, sagemaker:ListClusters/ListClusterNodes)",
    )
    p.add_argument("--policy", help="fleet policy file: its spot.prices.on_demand ($/instance-hour) price the GPUs")
    p.add_argument(
        "--share-unallocated",
        action="store_true",
        help="spread the unallocated GPUs' cost over the teams by their allocated GPU-hours",
    )
    p.add_argument(
        "--format",
        choices=[f.value for f in Format],
        default=Format.TABLE.value,
        help=f"output format (default {Format.TABLE.value})",
    )
    p.add_argument("--out", help="write the table/csv/json/markdown here instead of stdout")
    p.add_argument("--png", help="also draw GPU-hours per team per day (per hour under 2 days) into this PNG")
    p.add_argument("--top", type=int, default=DEFAULT_TOP, help=f"workloads and findings shown ({DEFAULT_TOP})")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (none either when stderr is no TTY)")
    add_account_options(p)
    p.add_argument("--log-group", help="the usage log group (default /gpufleet/usage)")
    p.add_argument("--workers", type=int, default=DEFAULT_WORKERS, help="time slices read side by side")
    p.add_argument(
        "--max-tps",
        type=float,
        default=FILTER_LOG_EVENTS_TPS,
        help=f"FilterLogEvents calls per second, all workers together ({FILTER_LOG_EVENTS_TPS:g}: the account quota)",
    )
    p.set_defaults(func=run)


def _period(args: argparse.Namespace, now: datetime) -> Period:
    from gpufleet_tools.report.usage import Period

    if args.end and not args.start:
        raise ValueError("--end needs --start")
    if args.start:
        return Period(args.start.astimezone(UTC), (args.end or now).astimezone(UTC))
    return Period.last(args.since or timedelta(days=7), now)


class _Refused(Exception):
    """An option or a policy that cannot work: one line, exit 2."""


def _inputs(args: argparse.Namespace) -> tuple[Period, Selection, PriceBook]:
    from gpufleet.domain.models import GroupRef
    from gpufleet.policy.fleet import PolicyError, parse_policy
    from gpufleet_tools.report.prices import PriceBook
    from gpufleet_tools.report.usage import Selection

    try:
        period = _period(args, datetime.now(UTC))
        groups = frozenset(GroupRef.parse_key(g).key for g in args.group)
    except ValueError as exc:
        raise _Refused(str(exc)) from None
    if args.top < 1 or args.workers < 1 or args.max_tps <= 0:
        raise _Refused("--top and --workers are at least 1, --max-tps above 0")
    prices = PriceBook()
    if args.policy:
        try:
            policy = parse_policy(Path(args.policy).read_text(), args.policy)
        except OSError as exc:
            raise _Refused(str(exc)) from None
        except PolicyError as exc:
            raise _Refused(f"{args.policy}: {'; '.join(exc.problems)}") from None
        prices = PriceBook.from_policy(policy)
    return period, Selection(groups, frozenset(args.cluster)), prices


def _write(args: argparse.Namespace, report: Report) -> None:
    from gpufleet_tools.report.render import Format, chart_series, render

    text = render(report, Format(args.format), args.top)
    if args.out:
        Path(args.out).write_text(text)
        print(f"report: {args.out} ({args.format}, {report.records:,} records)")
    else:
        sys.stdout.write(text)
    if args.png:
        from gpufleet_tools.report.chart import write_png

        write_png(chart_series(report), Path(args.png))
        print(f"chart: {args.png}", file=sys.stderr if not args.out else sys.stdout)


# --verify-nodes: what vouches for the records' node ids (report.fleet says what the answers mean). The
# operator needs these besides logs:FilterLogEvents (docs/report.md).
PERMISSIONS = {
    "DescribeInstances": "ec2:DescribeInstances",
    "DescribeScalingActivities": "autoscaling:DescribeScalingActivities",
    "ListClusters": "sagemaker:ListClusters",
    "ListClusterNodes": "sagemaker:ListClusterNodes",
}


def _pages(client: Any, operation: str, key: str, **kwargs: Any) -> Iterator[Any]:
    for page in client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(key, ())


def _cluster_nodes(sagemaker: Any) -> Iterator[Any]:
    for cluster in _pages(sagemaker, "list_clusters", "ClusterSummaries"):
        yield from _pages(sagemaker, "list_cluster_nodes", "ClusterNodeSummaries", ClusterName=cluster["ClusterName"])


def _read_known_nodes(ec2: Any, autoscaling: Any, sagemaker: Any, asked: datetime) -> KnownNodes:
    """Every instance the three know of; raises ReportUnavailable (one line, exit 2) when one cannot be
    asked: a check with a source missing would flag that source's nodes as invented."""
    from gpufleet.aws.clients import AWS_FAILURES, error_code
    from gpufleet_tools.report.fleet import KnownNodes
    from gpufleet_tools.report.reader import ReportUnavailable

    known = KnownNodes(asked)
    step = "DescribeInstances"
    try:
        known.add_instances(_pages(ec2, "describe_instances", "Reservations"))
        step = "DescribeScalingActivities"
        known.add_activities(
            _pages(autoscaling, "describe_scaling_activities", "Activities", IncludeDeletedGroups=True)
        )
        step = "ListClusters or ListClusterNodes"
        known.add_cluster_nodes(_cluster_nodes(sagemaker))
    except AWS_FAILURES as exc:
        code = error_code(exc)
        if code in ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation"):
            need = ", ".join(PERMISSIONS.values())
            line = f"--verify-nodes: not allowed to call {step} (the caller needs {need})"
        else:
            line = f"--verify-nodes: {step} failed: {code}: {str(exc)[:200]}"
        raise ReportUnavailable(line, 2) from None
    return known


def _known_nodes(args: argparse.Namespace) -> KnownNodes:
    """The instances that vouch for the records' node ids, asked now."""
    from gpufleet_tools.session import client

    ec2, autoscaling, sagemaker = (client(name, args.endpoint) for name in ("ec2", "autoscaling", "sagemaker"))
    return _read_known_nodes(ec2, autoscaling, sagemaker, datetime.now(UTC))


def run(args: argparse.Namespace) -> int:
    from gpufleet_node.schema import USAGE_LOG_GROUP
    from gpufleet_tools.report.identity import identify_by
    from gpufleet_tools.report.reader import ReportUnavailable, read_usage
    from gpufleet_tools.report.records import RecordParser
    from gpufleet_tools.report.usage import UsageSums
    from gpufleet_tools.session import client

    try:
        period, selection, prices = _inputs(args)
    except _Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    parser = RecordParser(identify_by(getattr(args, "by", "team")))
    try:
        known = _known_nodes(args) if getattr(args, "verify_nodes", False) else None
        sums = UsageSums(period, selection, prices, known)
        read_usage(
            client("logs", args.endpoint),
            period,
            selection,
            lambda stream, stamp, message: sums.add(parser.parse(message, stream, stamp)),
            log_group=args.log_group or USAGE_LOG_GROUP,
            workers=args.workers,
            max_tps=args.max_tps,
            progress=not args.no_progress,
            on_slice=sums.slice_read,
        )
    except ReportUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    _write(args, sums.report(prices, share_unallocated=args.share_unallocated))
    return 0
