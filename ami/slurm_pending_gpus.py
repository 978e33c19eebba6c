#!/usr/bin/env python3
"""Publish a Slurm cluster's GPU backlog for gpufleet: the GPUs that pending jobs request, as one CloudWatch
datum per group, so a policy rule with
`demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}` scales the group. On a
SageMaker HyperPod cluster it also says which nodes are idle (metric IdleNode), the only nodes the
controller may remove.

Run it on the head (controller) node every minute (cron or a systemd timer), with credentials that may
cloudwatch:PutMetricData. Python >= 3.9, the standard library and boto3.

    slurm_pending_gpus.py --asg slurm-gpu [--partition gpu] [--dry-run]
    slurm_pending_gpus.py --hyperpod ml-cluster:gpu-a=train,debug --hyperpod ml-cluster:gpu-b [--dry-run]

What counts: jobs in state PENDING (optionally of some partitions). squeue's `--Format` fields
`tres-per-job`, `tres-per-node` and `tres-per-task` (Slurm's squeue(1); src/squeue/opts.c) hold what the job
asked for: `--gpus=8` is `gres/gpu:8` per job, `--gpus-per-node=4` and `--gres=gpu:a100:4` are
`gres/gpu:4` / `gres/gpu:a100:4` per node (times NumNodes), `--gpus-per-task=1` is `gres/gpu=1` (newer
Slurm: `cpu=4,gres/gpu=1`) per task (times NumTasks). Older Slurm prints `gpu:4` or `gres:gpu:4`. A job that
states more than one of these is counted by the largest (they describe the same GPUs).

`--hyperpod CLUSTER:GROUP[=PART,...]` (repeatable): one datum per instance group, dimensions
{ClusterName, InstanceGroupName}. A pending job counts for the group its partition maps to: the first of
the job's partitions (a job may list several) named by a group; a group named with no partitions takes
the jobs no other group names. A job whose partitions map to no group is not counted (said on stderr):
no instance group is sized for it.

Idle nodes (HyperPod only): `sinfo -N -h -o '%N|%T'` lists each node with its state in the long form
(sinfo(1), "NODE STATE CODES"). A node is idle only when its state is exactly `idle`: a suffix (`*` not
responding, `~` powered off, `#` powering up, `%` powering down, `!` pending power down, `$` maintenance,
`@` pending reboot, `^` reboot issued, `-` planned by backfill) or a flag (`idle+drain`) means it is not
removable now. Each idle node of a mapped group is one datum IdleNode=1 with dimensions {ClusterName,
InstanceGroupName, InstanceId}. Slurm names HyperPod nodes by their hostname `ip-A-B-C-D`; the node's
instance id and instance group come from the HyperPod resource configuration file
(/opt/ml/config/resource_config.json: InstanceGroups[].Name, .Instances[].CustomerIpAddress /
.InstanceName / .InstanceId), which HyperPod writes on every node and its lifecycle scripts read
(aws-samples/awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/
base-config/lifecycle_script.py).
"""

import argparse
import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

# The same literal as gpufleet.domain.defaults.HYPERPOD_IDLE_METRIC (this script must not import the
# controller's layer); tests/unit/test_hyperpod_names.py checks that they agree.
IDLE_METRIC = "IdleNode"
RESOURCE_CONFIG = "/opt/ml/config/resource_config.json"
MAX_DATUMS = 1000  # PutMetricData: at most 1,000 metrics per request

# `FIELD:0|`: width 0 prints the whole value (no 20-character cut) and `|` is the suffix after it.
SQUEUE = [
    "squeue",
    "--states=PENDING",
    "--noheader",
    "--Format=JobID:0|,NumNodes:0|,NumTasks:0|,Partition:0|,tres-per-job:0|,tres-per-node:0|,tres-per-task:0",
]
SINFO = ["sinfo", "-N", "-h", "-o", "%N|%T"]

_GPU = re.compile(r"^(?:gres[/:])?gpu(?:[:=](.*))?$")
_COUNT = re.compile(r"^(\d+)$")
_NOT_IDLE_SUFFIXES = "*~#%!$@^-"
_IP_NAME = re.compile(r"^ip-(\d+)-(\d+)-(\d+)-(\d+)$")


def gpus_in(tres: str) -> int:
    """GPUs in one squeue TRES/GRES field ('N/A', '(null)' or empty: none). Each comma-separated item is
    `gres/gpu:N`, `gres/gpu:TYPE:N`, `gres/gpu=N`, `gres/gpu:TYPE=N`, `gpu:N`, `gres:gpu:N`, or `gpu` alone
    (one); other TRES (cpu=4, gres/shard:2, license/x=1) are not GPUs."""
    total = 0
    for item in tres.split(","):
        match = _GPU.match(item.strip())
        if not match:
            continue
        rest = match.group(1)
        if rest is None or rest == "":
            total += 1
            continue
        last = re.split(r"[:=]", rest)[-1]
        count = _COUNT.match(last)
        total += int(count.group(1)) if count else 1  # `gpu:a100`: a type, no count
    return total


def gpus_per_node(gres: str) -> int:
    """GPUs one node of the job asks for, from squeue's per-node GRES field (kept for `%b` callers)."""
    return gpus_in(gres)


def _int(text: str, default: int = 1) -> int:
    try:
        return max(1, int(text))
    except ValueError:
        return default


class Job:
    """One pending job: the partitions it may run in and the GPUs it asks for."""

    __slots__ = ("gpus", "job_id", "partitions")

    def __init__(self, job_id: str, partitions: List[str], gpus: int) -> None:
        self.job_id = job_id
        self.partitions = partitions
        self.gpus = gpus


def parse_job(line: str) -> Optional[Job]:
    """A squeue line: `JobID|NumNodes|NumTasks|Partition|tres-per-job|tres-per-node|tres-per-task` (this
    script's format), or the older `%i|%D|%b|%P`. None when malformed."""
    fields = [f.strip() for f in line.strip().split("|")]
    if len(fields) == 4:
        job_id, nodes, per_node, partition = fields
        gpus = gpus_in(per_node) * _int(nodes)
    elif len(fields) == 7:
        job_id, nodes, tasks, partition, per_job, per_node, per_task = fields
        gpus = max(gpus_in(per_job), gpus_in(per_node) * _int(nodes), gpus_in(per_task) * _int(tasks))
    else:
        return None
    return Job(job_id, [p for p in partition.split(",") if p], gpus)


def pending_gpus(lines: Iterable[str], partitions: Optional[Sequence[str]] = None) -> int:
    """GPUs requested by the pending jobs squeue listed; malformed lines are skipped."""
    wanted = set(partitions or ())
    total = 0
    for line in lines:
        job = parse_job(line)
        if job is None or (wanted and not set(job.partitions) & wanted):
            continue
        total += job.gpus
    return total


class GroupSpec:
    """One `--hyperpod CLUSTER:GROUP[=PART,...]`."""

    __slots__ = ("cluster", "group", "partitions")

    def __init__(self, cluster: str, group: str, partitions: Tuple[str, ...]) -> None:
        self.cluster = cluster
        self.group = group
        self.partitions = partitions

    @classmethod
    def parse(cls, text: str) -> "GroupSpec":
        target, _, parts = text.partition("=")
        cluster, sep, group = target.partition(":")
        if not sep or not cluster.strip() or not group.strip():
            raise ValueError("--hyperpod takes CLUSTER:GROUP[=PARTITION,...], got %r" % text)
        return cls(cluster.strip(), group.strip(), tuple(p.strip() for p in parts.split(",") if p.strip()))


def group_of(job: Job, specs: Sequence[GroupSpec]) -> Optional[GroupSpec]:
    """The group a job counts for: the first of its partitions a group names, else the catch-all group
    (one named with no partitions), else none."""
    for partition in job.partitions:
        for spec in specs:
            if partition in spec.partitions:
                return spec
    catch_all = [s for s in specs if not s.partitions]
    return catch_all[0] if catch_all else None


def pending_by_group(
    lines: Iterable[str], specs: Sequence[GroupSpec], partitions: Optional[Sequence[str]] = None
) -> Tuple[Dict[Tuple[str, str], int], List[str]]:
    """GPUs pending per (cluster, group), every group present (0 too), and the ids of GPU jobs no group
    takes."""
    wanted = set(partitions or ())
    totals = {(s.cluster, s.group): 0 for s in specs}
    unmapped: List[str] = []
    for line in lines:
        job = parse_job(line)
        if job is None or job.gpus <= 0 or (wanted and not set(job.partitions) & wanted):
            continue
        spec = group_of(job, specs)
        if spec is None:
            unmapped.append(job.job_id)
            continue
        totals[(spec.cluster, spec.group)] += job.gpus
    return totals, unmapped


def is_idle(state: str) -> bool:
    """True only for a node Slurm reports plainly IDLE: no job, no flag, no power or health suffix."""
    s = state.strip().lower()
    if not s or s[-1] in _NOT_IDLE_SUFFIXES:
        return False
    return s == "idle"


class NodeMap:
    """Slurm node name -> (instance group, instance id), from HyperPod's resource configuration file."""

    def __init__(self, doc: Dict[str, Any]) -> None:
        self.cluster = str((doc.get("ClusterConfig") or {}).get("ClusterName") or doc.get("ClusterName") or "")
        self.by_ip: Dict[str, Tuple[str, str]] = {}
        self.by_name: Dict[str, Tuple[str, str]] = {}
        for group in doc.get("InstanceGroups") or []:
            name = str(group.get("Name") or group.get("InstanceGroupName") or "")
            for inst in group.get("Instances") or []:
                instance_id = str(inst.get("InstanceId") or "")
                if not name or not instance_id:
                    continue
                if inst.get("CustomerIpAddress"):
                    self.by_ip[str(inst["CustomerIpAddress"])] = (name, instance_id)
                if inst.get("InstanceName"):
                    self.by_name[str(inst["InstanceName"])] = (name, instance_id)

    @classmethod
    def load(cls, path: str) -> "NodeMap":
        with open(path) as f:
            return cls(json.load(f))

    def lookup(self, node: str) -> Optional[Tuple[str, str]]:
        ip = _IP_NAME.match(node)
        if ip:
            found = self.by_ip.get(".".join(ip.groups()))
            if found:
                return found
        return self.by_name.get(node)


def idle_nodes(lines: Iterable[str], nodes: NodeMap, specs: Sequence[GroupSpec]) -> List[Tuple[str, str, str]]:
    """(cluster, group, instance id) of each idle node of a mapped group; `sinfo -N` repeats a node once per
    partition, so a node is idle only when every line of it says so."""
    states: Dict[str, bool] = {}
    for line in lines:
        name, sep, state = line.strip().partition("|")
        if sep and name:
            states[name] = states.get(name, True) and is_idle(state)
    mapped = {s.group: s.cluster for s in specs}
    out = []
    for name, idle in sorted(states.items()):
        found = nodes.lookup(name) if idle else None
        if found and found[0] in mapped:
            out.append((mapped[found[0]], found[0], found[1]))
    return out


def run(command: Sequence[str]) -> List[str]:
    out = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=True).stdout
    return out.splitlines()


def run_squeue(command: Sequence[str] = SQUEUE) -> List[str]:
    return run(command)


def run_sinfo(command: Sequence[str] = SINFO) -> List[str]:
    return run(command)


def datum(dims: Dict[str, str], metric: str, value: float, now: datetime) -> Dict[str, Any]:
    return {
        "MetricName": metric,
        "Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()],
        "Value": float(value),
        "Unit": "Count",
        "Timestamp": now,
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--asg", help="the GPU Auto Scaling group the backlog is for")
    target.add_argument(
        "--hyperpod", action="append", metavar="CLUSTER:GROUP[=PART,...]", help="a HyperPod instance group"
    )
    parser.add_argument("--partition", action="append", help="count only these partitions (repeatable)")
    parser.add_argument("--namespace", default="Slurm")
    parser.add_argument("--metric", default="PendingGPUs")
    parser.add_argument("--resource-config", default=RESOURCE_CONFIG, help="HyperPod's resource configuration")
    parser.add_argument("--region", help="AWS region (default: the environment's)")
    parser.add_argument("--dry-run", action="store_true", help="print the data, send nothing")
    return parser


def hyperpod_data(
    args: argparse.Namespace, lines: List[str], sinfo: Callable[[], List[str]], now: datetime
) -> List[Dict[str, Any]]:
    """The backlog per group, then the idle nodes (none when sinfo or the resource file fails: saying a
    node is idle when it is not could remove it, so an unknown is never idle)."""
    specs = [GroupSpec.parse(text) for text in args.hyperpod]
    totals, unmapped = pending_by_group(lines, specs, args.partition)
    if unmapped:
        print("note: GPU jobs in no mapped partition, not counted: %s" % " ".join(unmapped[:20]), file=sys.stderr)
    data = [
        datum({"ClusterName": c, "InstanceGroupName": g}, args.metric, gpus, now) for (c, g), gpus in totals.items()
    ]
    try:
        nodes = NodeMap.load(args.resource_config)
        idle = idle_nodes(sinfo(), nodes, specs)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        print("warning: idle nodes unknown, none published: %s" % exc, file=sys.stderr)
        idle = []
    for cluster, group, instance_id in idle:
        dims = {"ClusterName": cluster, "InstanceGroupName": group, "InstanceId": instance_id}
        data.append(datum(dims, IDLE_METRIC, 1, now))
    return data


def main(
    argv: Optional[Sequence[str]] = None,
    squeue: Callable[[], List[str]] = run_squeue,
    cloudwatch: Any = None,
    sinfo: Callable[[], List[str]] = run_sinfo,
) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for text in args.hyperpod or ():
        try:
            GroupSpec.parse(text)
        except ValueError as exc:
            parser.error(str(exc))  # one line, exit 2, nothing sent
    try:
        lines = squeue()
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"error: squeue failed: {exc}", file=sys.stderr)
        return 1
    now = datetime.now(timezone.utc)
    if args.hyperpod:
        data = hyperpod_data(args, lines, sinfo, now)
    else:
        data = [datum({"AutoScalingGroupName": args.asg}, args.metric, pending_gpus(lines, args.partition), now)]
    if args.dry_run:
        for d in data:
            dims = " ".join("%s=%s" % (x["Name"], x["Value"]) for x in d["Dimensions"])
            print(f"{args.namespace}/{d['MetricName']} {dims}: {int(d['Value'])}")
        return 0
    if cloudwatch is None:
        import boto3

        cloudwatch = boto3.client("cloudwatch", region_name=args.region)
    for i in range(0, len(data), MAX_DATUMS):
        cloudwatch.put_metric_data(Namespace=args.namespace, MetricData=data[i : i + MAX_DATUMS])
    return 0


if __name__ == "__main__":
    sys.exit(main())
