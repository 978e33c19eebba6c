"""`gpufleet replay`: a workload trace or a group's CloudWatch history through the decision core."""

from __future__ import annotations

import argparse
import sys


def add_arguments(p: argparse.ArgumentParser, name: str) -> None:
    from gpufleet_tools.replay.model import DEFAULT_NODE_PRICE

    p.add_argument(
        "--trace",
        help="Alibaba GPU trace CSV (v2025 DLRM instances or v2023 pods), synthetic:bursty or synthetic:training",
    )
    p.add_argument("--from-cloudwatch", metavar="GROUP", help="asg:NAME or eks:CLUSTER/NODEGROUP")
    p.add_argument("--days", type=int, default=7, help="history days (CloudWatch) or synthetic trace days")
    p.add_argument("--policy", help="fleet policy file (default: the recommended one for the workload, docs/replay.md)")
    p.add_argument("--workload", choices=["serving", "batch"], help="which recommended policy (default: by trace)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs on each node (default 8)")
    p.add_argument("--boot-minutes", type=int, default=5, help="launch to schedulable")
    p.add_argument("--node-price", type=float, default=DEFAULT_NODE_PRICE, help="$/node-hour (g5.48xlarge)")
    p.add_argument(
        "--placement",
        choices=["spread", "pack"],
        default="spread",
        help="how pods land on nodes: kube-scheduler's LeastAllocated (spread, default) or MostAllocated (pack)",
    )
    p.add_argument("--min-nodes", type=int, default=1, help="the group's min (default 1)")
    p.add_argument("--max-nodes", type=int, help="the group's max (default 1.5x the peak)")
    p.add_argument("--tt-target", type=float, default=70.0, help="asg-target-tracking's target GPU %%")
    p.add_argument(
        "--capacity-shortage",
        type=float,
        metavar="SHARE",
        help="inject partial launches: this share of 60-min slots starts at most 1 node (docs/replay.md)",
    )
    p.add_argument("--seed", type=int, default=13, help="seed of the synthetic traces and tie-breaks (default 13)")
    p.add_argument("--experiments", action="store_true", help="also run the labelled gpufleet experiments")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--endpoint", help="AWS endpoint URL (moto server) for --from-cloudwatch")
    p.add_argument("--out", default="replay-out", help="where the report files go (default replay-out)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gpufleet.domain.errors import describe_validation_error
    from gpufleet_tools.replay.model import CapacityShortage, Placement, ReplayOptions, ReplayRequest
    from gpufleet_tools.replay.service import main

    try:
        request = ReplayRequest(
            trace=args.trace,
            from_cloudwatch=args.from_cloudwatch,
            days=args.days,
            policy=args.policy,
            workload=args.workload,
            experiments=args.experiments,
            progress=not args.no_progress,
            endpoint=args.endpoint,
            out=args.out,
            options=ReplayOptions(
                gpus_per_node=args.gpus_per_node,
                boot_minutes=args.boot_minutes,
                node_price=args.node_price,
                placement=Placement(args.placement),
                min_nodes=args.min_nodes,
                max_nodes=args.max_nodes,
                tt_target=args.tt_target,
                seed=args.seed,
                shortage=None if args.capacity_shortage is None else CapacityShortage(share=args.capacity_shortage),
            ),
        )
    except ValidationError as exc:
        print(f"error: {'; '.join(describe_validation_error(exc))}", file=sys.stderr)
        return 2
    return main(request)
