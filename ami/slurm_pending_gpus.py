#!/usr/bin/env python3
"""Publish a Slurm cluster's GPU backlog for gpufleet: the GPUs that pending jobs request, as one CloudWatch
datum on the GPU Auto Scaling group's dimension, so a policy rule with
`demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}` scales the group.

Run it on the head node every minute (cron or a systemd timer), with credentials that may
cloudwatch:PutMetricData. Python >= 3.9, the standard library and boto3.

What counts: jobs in state PENDING (optionally of some partitions), each asking `gpu[:type]:N` GRES per node
(`%b` in squeue: gpu:4, gpu:a100:2, gres/gpu:2, gres:gpu:a100:8, several comma-separated) times its node
count. A job that asks for GPUs per job or per task (--gpus, --gpus-per-task) shows no per-node GRES
there and is not counted: give such jobs --gpus-per-node, or publish from `--Format=tres-per-job` yourself.

    slurm_pending_gpus.py --asg slurm-gpu [--partition gpu] [--dry-run]
"""

import argparse
import re
import subprocess
import sys
from datetime import datetime, timezone
from typing import Callable, Iterable, List, Optional, Sequence

SQUEUE = ["squeue", "--states=PENDING", "--noheader", "--format=%i|%D|%b|%P"]
_GPU = re.compile(r"^(?:gres[/:])?gpu(?::[^:,()]+)?:(\d+)")


def gpus_per_node(gres: str) -> int:
    """GPUs one node of the job asks for, from squeue's GRES field ('N/A' or '(null)': none)."""
    total = 0
    for part in gres.split(","):
        match = _GPU.match(part.strip())
        if match:
            total += int(match.group(1))
    return total


def pending_gpus(lines: Iterable[str], partitions: Optional[Sequence[str]] = None) -> int:
    """GPUs requested by the pending jobs squeue listed (`%i|%D|%b|%P` lines); malformed lines are skipped."""
    wanted = set(partitions or ())
    total = 0
    for line in lines:
        fields = line.strip().split("|")
        if len(fields) != 4:
            continue
        _, nodes, gres, partition = fields
        if wanted and not (set(partition.split(",")) & wanted):
            continue
        try:
            count = max(1, int(nodes))
        except ValueError:
            count = 1
        total += gpus_per_node(gres) * count
    return total


def run_squeue(command: Sequence[str] = SQUEUE) -> List[str]:
    out = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=True).stdout
    return out.splitlines()


def datum(asg: str, metric: str, gpus: int, now: datetime) -> dict:
    return {
        "MetricName": metric,
        "Dimensions": [{"Name": "AutoScalingGroupName", "Value": asg}],
        "Value": float(gpus),
        "Unit": "Count",
        "Timestamp": now,
    }


def main(argv: Optional[Sequence[str]] = None, squeue: Callable[[], List[str]] = run_squeue, cloudwatch=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--asg", required=True, help="the GPU Auto Scaling group the backlog is for")
    parser.add_argument("--partition", action="append", help="count only these partitions (repeatable)")
    parser.add_argument("--namespace", default="Slurm")
    parser.add_argument("--metric", default="PendingGPUs")
    parser.add_argument("--region", help="AWS region (default: the environment's)")
    parser.add_argument("--dry-run", action="store_true", help="print the datum, send nothing")
    args = parser.parse_args(argv)
    try:
        lines = squeue()
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"error: squeue failed: {exc}", file=sys.stderr)
        return 1
    gpus = pending_gpus(lines, args.partition)
    item = datum(args.asg, args.metric, gpus, datetime.now(timezone.utc))
    if args.dry_run:
        print(f"{args.namespace}/{args.metric} AutoScalingGroupName={args.asg}: {gpus}")
        return 0
    if cloudwatch is None:
        import boto3

        cloudwatch = boto3.client("cloudwatch", region_name=args.region)
    cloudwatch.put_metric_data(Namespace=args.namespace, MetricData=[item])
    return 0


if __name__ == "__main__":
    sys.exit(main())
