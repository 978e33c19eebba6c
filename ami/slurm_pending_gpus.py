#!/usr/bin/env python3
"""Publish a Slurm cluster's GPU backlog for gpufleet: the GPUs that pending jobs request, as one CloudWatch
datum per group, so a policy rule with
`demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}` scales the group. On a
SageMaker HyperPod cluster it also says which nodes are idle (metric IdleNode), the only nodes the
controller may remove.

Run it on the head (controller) node every minute (cron or a systemd timer), with credentials that may
cloudwatch:PutMetricData. Python >= 3.9, the standard library and boto3. With --hyperpod the whole report
goes into this node's own namespace `Slurm/<its aws:userid>` (`Slurm/ROLEID:SageMaker` on HyperPod, whose
node credentials all carry the session name SageMaker: sts GetCallerIdentity),
the only one gpufleet reads a HyperPod cluster's report from, and the only Slurm namespace
ami/hyperpod/execution-role-controller.json lets it write (docs/hyperpod.md).

    slurm_pending_gpus.py --asg slurm-gpu [--partition gpu] [--dry-run]
    slurm_pending_gpus.py --hyperpod ml-cluster:gpu-a=train,debug --hyperpod ml-cluster:gpu-b [--dry-run]

What counts: jobs in state PENDING (optionally of some partitions) whose Reason says they wait for nodes
(DEMAND_REASONS: not held, not waiting on a dependency, a begin time or a limit), a pending job array's
line once per element up to the room its throttle leaves: `%N` minus its tasks already running (read_jobs).
squeue's `--Format` fields
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
removable now. Each idle node of a mapped group is one datum IdleNode = 1 with dimensions {ClusterName,
InstanceGroupName, InstanceId}, and the others get nothing: CloudWatch bills a series by the hours it
receives data, so only idle node-hours are paid, and the controller reads a job start as the newest minute
without a 1 (it removes a node only when that minute holds one). Slurm names HyperPod nodes by their
hostname `ip-A-B-C-D`; the node's instance id and instance group come from the HyperPod resource
configuration file (/opt/ml/config/resource_config.json: InstanceGroups[].Name,
.Instances[].CustomerIpAddress / .InstanceName / .InstanceId), which HyperPod writes on every node and
its lifecycle scripts read (aws-samples/awsome-distributed-training,
1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/lifecycle_script.py, which reads only
Name, InstanceName and CustomerIpAddress); a node the file does not name with an id is named through the
SageMaker API (NodeIds: ListClusterNodes, DescribeClusterNode), with the controller node's role.

Drains (HyperPod, `--marks-table TABLE`): gpufleet records the nodes it wants closed to new work in its
state table (item `slurm-marks#CLUSTER` / `MARKS`, one `node#<instance id>` attribute each); this script,
root on the controller already, reads it (GetItem) and reconciles Slurm (reconcile): a requested node Slurm
shows open gets `scontrol update NodeName=N State=DRAIN Reason="gpufleet: ..."` (scontrol(1): existing jobs
run to completion, no new job starts; the node reads `draining`, then `drained`); a node drained with a
reason starting `gpufleet:` (sinfo's `%E`, the reason in full) that is no longer requested gets
`State=RESUME`. A node drained, down or failed by anyone else is never drained again nor resumed. A node
gpufleet drained that Slurm shows `drained` (no job left) is idle and closed: IdleNode = 1 for it too, and,
while gpufleet still asks for its drain, DrainedNode = 1 (same dimensions): the controller removes a node it
asked to drain only on that word (never because time passed: a drain scontrol failed to apply leaves the node
open). A node resumed in this run gets no DrainedNode (the sinfo read before the resume is stale for it).
Before draining a node whose instance id came from the resource file, the id is checked against the SageMaker
API's node list (ListClusterNodes, the node cache; once per run, only when a drain is to be applied, not with
--no-api): the file may not be rewritten since a scale-out, and a new node on an address a deleted one freed
would carry the deleted node's id. A node whose file id the API contradicts is not drained (said).
Without --marks-table, or when the item cannot be read, nothing is drained or resumed.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

# The same literal as gpufleet.domain.defaults.HYPERPOD_IDLE_METRIC (this script must not import the
# controller's layer); tests/unit/test_hyperpod_names.py checks that they agree.
IDLE_METRIC = "IdleNode"
# ... and as HYPERPOD_DRAINED_METRIC (tests/unit/test_slurm_marks_names.py): 1 for a node gpufleet still asks to
# drain that Slurm shows drained with gpufleet's reason and no job, the only word that makes it removable.
DRAINED_METRIC = "DrainedNode"
# The same literals as gpufleet.domain.defaults.SLURM_DRAIN_REASON_PREFIX / SLURM_MARKS_KEY_PREFIX and
# gpufleet.aws.slurm_marks' MARKS_SK / NODE_ATTR_PREFIX (tests/unit/ and tests/adapters/test_slurm_marks_names.py).
DRAIN_PREFIX = "gpufleet:"
MARKS_KEY_PREFIX = "slurm-marks#"
MARKS_SK = "MARKS"
MARKS_NODE_PREFIX = "node#"
# The same literals as gpufleet_node.schema.SLURM_NAMESPACE / SLURM_NAMESPACE_PREFIX (tests/node/
# test_slurm_report_namespace.py): --hyperpod writes its whole report into SLURM_PREFIX + its own aws:userid
# ("Slurm/ROLEID:SageMaker" on HyperPod), the only Slurm namespace the scaler reads and IAM lets it write (issue 41).
SLURM_NAMESPACE = "Slurm"
SLURM_PREFIX = SLURM_NAMESPACE + "/"
RESOURCE_CONFIG = "/opt/ml/config/resource_config.json"
MAX_DATUMS = 1000  # PutMetricData: at most 1,000 metrics per request

# `FIELD:0|`: width 0 prints the whole value (no 20-character cut) and `|` is the suffix after it. No
# -r/--array: a pending job array stays one line, `123_[1-100%4]`, so its throttle (%4) is seen; its
# element count is read from the index expression (array_tasks), which SLURM_BITSTR_LEN=0 prints whole
# (squeue cuts it at 64 characters otherwise: src/squeue/opts.c, the `-r` case sets the same variable).
# RUNNING and SUSPENDED jobs are listed too, only to count an array's started tasks (`123_1`, `123_2`:
# squeue(1) %i prints an element as <array job id>_<index>), which hold places of its throttle (issue 42).
SQUEUE = [
    "squeue",
    "--states=PENDING,RUNNING,SUSPENDED",
    "--noheader",
    "--Format=JobID:0|,NumNodes:0|,NumTasks:0|,Partition:0|,tres-per-job:0|,tres-per-node:0|,tres-per-task:0|,"
    "State:0|,Reason:0",
]
SQUEUE_ENV = {"SLURM_BITSTR_LEN": "0"}
# Why a pending job waits (Slurm's job_reason_codes.html): only these mean "no free node now", the wait
# more nodes end. Everything else waits on the job or on a rule - JobHeldUser/JobHeldAdmin (held),
# Dependency/DependencyNeverSatisfied, BeginTime, JobArrayTaskLimit (the array's throttle reached),
# AssocGrp*/AssocMax*/QOS*/Max*Per* and AccountingPolicy (limits), PartitionDown/Inactive/TimeLimit,
# InvalidAccount/InvalidQOS, BadConstraints, Licenses, Reservation - and is not demand. `None`: not yet
# looked at by the scheduler (just submitted). A prefix match (`ReqNodeNotAvail, UnavailableNodes:...`).
DEMAND_REASONS = (
    "None",
    "Resources",
    "Priority",
    "ReqNodeNotAvail",
    "Nodes_required_for_job_are_DOWN",
)
# squeue's State (long form) of a job that has started and not ended: its array throttle place is taken
# (Slurm's job_array.html: "%" caps the tasks running at once). CONFIGURING is a RUNNING job whose nodes
# boot (squeue --states=RUNNING lists it). A COMPLETING task has ended: Slurm frees its place then.
PENDING_STATE = "PENDING"
STARTED_STATES = ("RUNNING", "CONFIGURING", "SUSPENDED")
# %E: the reason a node is down, drained or draining, whole (no width: not cut); "none" when it has none.
SINFO = ["sinfo", "-N", "-h", "-o", "%N|%T|%E"]
# Node states in which no one has closed the node (sinfo(1) NODE STATE CODES, suffix stripped): the only
# ones gpufleet drains. drained/draining/down/fail/failing/maint/reboot/future/...: someone's, left alone.
OPEN_STATES = ("idle", "mixed", "allocated", "completing")

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


_ARRAY = re.compile(r"^(\d+)_\[([^\]]*)\]$")
_ELEMENT = re.compile(r"^(\d+)_(\d+)$")
_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def array_throttle(job_id: str) -> Optional[int]:
    """The `%N` of a pending array's combined line (`123_[1-100%4]`: 4); None without one, or for `%0`
    (Slurm: no limit). Raises ValueError for a throttle that is not a number (a cut or unknown form)."""
    match = _ARRAY.match(job_id.strip())
    if not match or "%" not in match.group(2):
        return None
    throttle = match.group(2).partition("%")[2].strip()
    if not throttle.isdigit():
        raise ValueError("array throttle %r of %s is not a number" % (throttle, job_id.strip()))
    return int(throttle) or None


def array_job_id(job_id: str) -> Optional[str]:
    """The array job id of an element (`123_7`) or of a pending array's line (`123_[1-100%4]`): `123`."""
    text = job_id.strip()
    match = _ARRAY.match(text) or _ELEMENT.match(text)
    return match.group(1) if match else None


def array_tasks(job_id: str, started: int = 0) -> int:
    """Pending elements of one squeue line that may start now: 1 for a job or one element (`123`,
    `123_7`); for a pending array's combined line `123_[1-100%4]` the indexes (`a`, `a-b`, `a-b:step`,
    comma-separated), at most the room the throttle after `%` leaves: throttle minus the array's `started`
    tasks (sbatch --array: at most that many run at once; none when full). An index part that does not
    parse (a cut string) counts what parsed, at least 1; a throttle that does not parse is not applied."""
    match = _ARRAY.match(job_id.strip())
    if not match:
        return 1
    body = match.group(2).partition("%")[0]
    count = 0
    for item in body.split(","):
        r = _RANGE.match(item.strip())
        if r:
            first, last, step = int(r.group(1)), int(r.group(2) or r.group(1)), int(r.group(3) or 1)
            count += (last - first) // max(step, 1) + 1 if last >= first else 0
    count = max(count, 1)
    try:
        throttle = array_throttle(job_id)
    except ValueError:
        return count  # counted as before the throttle was read; read_jobs says so
    return count if throttle is None else min(count, max(0, throttle - started))


def waits_for_nodes(reason: str) -> bool:
    """True when the job's Reason says more nodes would let it start (DEMAND_REASONS); an empty Reason
    (a line without the column: the older formats) counts, as before the column."""
    reason = reason.strip()
    return not reason or reason.startswith(DEMAND_REASONS)


class Job:
    """One squeue line: the partitions it may run in, the GPUs it asks for (an array's line: all its
    pending elements' that its throttle lets start; `per_element`: one element's), its state (an older
    format without the column: pending) and why it waits."""

    __slots__ = ("gpus", "job_id", "partitions", "per_element", "reason", "state")

    def __init__(
        self,
        job_id: str,
        partitions: List[str],
        gpus: int,
        reason: str = "",
        state: str = PENDING_STATE,
        per_element: Optional[int] = None,
    ) -> None:
        self.job_id = job_id
        self.partitions = partitions
        self.gpus = gpus
        self.reason = reason
        self.state = state
        self.per_element = gpus if per_element is None else per_element

    @property
    def pending(self) -> bool:
        return self.state == PENDING_STATE

    @property
    def started(self) -> bool:
        return self.state in STARTED_STATES

    @property
    def demand(self) -> bool:
        return self.pending and self.gpus > 0 and waits_for_nodes(self.reason)


def parse_job(line: str) -> Optional[Job]:
    """A squeue line: `JobID|NumNodes|NumTasks|Partition|tres-per-job|tres-per-node|tres-per-task|State|Reason`
    (this script's format; without State, or State and Reason: the previous ones, all pending), or the older
    `%i|%D|%b|%P`. None when malformed. An array's line counts its elements up to its throttle, as if none
    had started (read_jobs subtracts those)."""
    fields = [f.strip() for f in line.strip().split("|")]
    reason = ""
    state = PENDING_STATE
    if len(fields) == 9:
        reason = fields.pop()
        state = fields.pop().upper() or PENDING_STATE
    elif len(fields) == 8:
        reason = fields.pop()
    if len(fields) == 4:
        job_id, nodes, per_node, partition = fields
        gpus = gpus_in(per_node) * _int(nodes)
    elif len(fields) == 7:
        job_id, nodes, tasks, partition, per_job, per_node, per_task = fields
        gpus = max(gpus_in(per_job), gpus_in(per_node) * _int(nodes), gpus_in(per_task) * _int(tasks))
    else:
        return None
    partitions = [p for p in partition.split(",") if p]
    return Job(job_id, partitions, gpus * array_tasks(job_id), reason, state, per_element=gpus)


def read_jobs(lines: Iterable[str]) -> List[Job]:
    """The jobs squeue listed (malformed lines skipped), each pending array's line counting only the
    elements its throttle lets start: throttle minus the array's started tasks (`123_1`, `123_2` RUNNING
    beside `123_[3-100%4]`: 2 of 4 places taken, 2 more may start). A throttle that does not parse is not
    applied, said once per run on stderr with the GPUs so counted."""
    jobs = [job for job in (parse_job(line) for line in lines) if job is not None]
    started: Dict[str, int] = {}
    for job in jobs:
        base = array_job_id(job.job_id) if job.started else None
        if base is not None:
            started[base] = started.get(base, 0) + 1
    unread: List[str] = []
    for job in jobs:
        base = array_job_id(job.job_id)
        if not job.pending or base is None:
            continue
        try:
            array_throttle(job.job_id)
        except ValueError:
            unread.append("%s (%d GPUs)" % (job.job_id, job.gpus))
            continue
        job.gpus = job.per_element * array_tasks(job.job_id, started.get(base, 0))
    if unread:
        said = " ".join(unread[:20])
        print("note: array throttle unreadable, all pending elements counted: %s" % said, file=sys.stderr)
    return jobs


def pending_gpus(lines: Iterable[str], partitions: Optional[Sequence[str]] = None) -> int:
    """GPUs requested by the pending jobs squeue listed; malformed lines are skipped."""
    wanted = set(partitions or ())
    total = 0
    for job in read_jobs(lines):
        if not job.demand or (wanted and not set(job.partitions) & wanted):
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
    for job in read_jobs(lines):
        if not job.demand or (wanted and not set(job.partitions) & wanted):
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


def slurm_name(ip: str) -> str:
    """The Slurm node name HyperPod gives a node: its hostname, `ip-A-B-C-D`."""
    return "ip-" + ip.strip().replace(".", "-")


class NodeMap:
    """Slurm node name -> (instance group, instance id), from HyperPod's resource configuration file. An
    entry without InstanceId still names its group; its id is "" (then NodeIds asks the API)."""

    def __init__(self, doc: Dict[str, Any]) -> None:
        self.cluster = str((doc.get("ClusterConfig") or {}).get("ClusterName") or doc.get("ClusterName") or "")
        self.by_ip: Dict[str, Tuple[str, str]] = {}
        self.by_name: Dict[str, Tuple[str, str]] = {}
        for group in doc.get("InstanceGroups") or []:
            name = str(group.get("Name") or group.get("InstanceGroupName") or "")
            for inst in group.get("Instances") or []:
                if not name:
                    continue
                instance_id = str(inst.get("InstanceId") or "")
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


class NodeIds:
    """Slurm node name -> (instance group, instance id) from the SageMaker API, for the nodes the resource
    file does not name with an id (a file without InstanceId, or one not rewritten since a scale-out):
    ListClusterNodes gives each node's id and group (and, in newer API versions, PrivateDnsHostname
    `ip-A-B-C-D.<domain>`); DescribeClusterNode gives PrivatePrimaryIp for the others. A node id's
    address never changes, so it is cached in `cache` (a JSON file) and asked once; the cache keeps only
    the ids ListClusterNodes still lists (an address a deleted node freed may come back)."""

    def __init__(self, sagemaker: Any, cache: Optional[str] = None) -> None:
        self.sagemaker = sagemaker
        self.cache = cache

    def _cached(self) -> Dict[str, str]:
        try:
            with open(self.cache or "") as f:
                found = json.load(f)
            return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
        except (OSError, ValueError):
            return {}

    def _save(self, names: Dict[str, str]) -> None:
        if not self.cache:
            return
        try:
            with open(self.cache + ".tmp", "w") as f:
                json.dump(names, f, sort_keys=True)
            os.replace(self.cache + ".tmp", self.cache)
        except OSError as exc:  # a cache that cannot be written costs API calls, never a wrong answer
            print("note: node id cache not written: %s" % exc, file=sys.stderr)

    def _summaries(self, cluster: str) -> List[Dict[str, Any]]:
        nodes: List[Dict[str, Any]] = []
        token = None
        while True:
            args: Dict[str, Any] = {"ClusterName": cluster, "MaxResults": 100}
            if token:
                args["NextToken"] = token
            page = self.sagemaker.list_cluster_nodes(**args)
            nodes.extend(page.get("ClusterNodeSummaries") or [])
            token = page.get("NextToken")
            if not token:
                return nodes

    def resolve(self, clusters: Iterable[str]) -> Dict[str, Tuple[str, str]]:
        """Every listed node's Slurm name -> (group, id). Raises on an API failure: the caller then
        leaves every node it cannot name unreported (fail closed)."""
        cached = self._cached()
        names: Dict[str, str] = {}
        out: Dict[str, Tuple[str, str]] = {}
        for cluster in sorted(set(clusters)):
            for node in self._summaries(cluster):
                node_id, group = str(node.get("InstanceId") or ""), str(node.get("InstanceGroupName") or "")
                if not node_id or not group:
                    continue
                name = str(node.get("PrivateDnsHostname") or "").split(".")[0] or cached.get(node_id, "")
                if not name:
                    details = self.sagemaker.describe_cluster_node(ClusterName=cluster, NodeId=node_id)
                    ip = str((details.get("NodeDetails") or {}).get("PrivatePrimaryIp") or "")
                    name = slurm_name(ip) if ip else ""
                if name:
                    names[node_id] = name
                    out[name] = (group, node_id)
        if names != cached:
            self._save(names)
        return out


class SlurmNode:
    """One node as `sinfo -N -o '%N|%T|%E'` lists it: its state on each line (one per partition) and its
    reason (the same on each line; "" when none or an older two-field line)."""

    __slots__ = ("reason", "states")

    def __init__(self) -> None:
        self.states: List[str] = []
        self.reason = ""

    @property
    def ours(self) -> bool:
        """Drained by gpufleet: the reason it gave scontrol."""
        return self.reason.startswith(DRAIN_PREFIX)

    def _bases(self) -> List[str]:
        return [s.strip().lower().rstrip(_NOT_IDLE_SUFFIXES) for s in self.states]

    @property
    def drain_flagged(self) -> bool:
        """Slurm shows the drain flag (drained or draining, any suffix)."""
        return any(b.startswith("drain") for b in self._bases())

    @property
    def open(self) -> bool:
        """Nobody has closed it: every line's state is one OPEN_STATES (any suffix)."""
        return bool(self.states) and all(b in OPEN_STATES for b in self._bases())

    @property
    def drained_by_us(self) -> bool:
        """Drained by gpufleet with no job left: exactly `drained` (no suffix) on every line."""
        return bool(self.states) and self.ours and all(s.strip().lower() == "drained" for s in self.states)

    @property
    def idle(self) -> bool:
        """Plainly idle on every line, or drained by gpufleet with no job left (exactly `drained`, no
        suffix, on every line): a node that drains (jobs run) or that someone else drained is not."""
        if not self.states:
            return False
        if all(is_idle(s) for s in self.states):
            return True
        return self.drained_by_us


def parse_sinfo(lines: Iterable[str]) -> Dict[str, SlurmNode]:
    """Slurm node name -> SlurmNode from `sinfo -N -h -o '%N|%T|%E'` (the older `%N|%T` too)."""
    nodes: Dict[str, SlurmNode] = {}
    for line in lines:
        name, sep, rest = line.strip().partition("|")
        if not sep or not name:
            continue
        state, _, reason = rest.partition("|")
        node = nodes.setdefault(name, SlurmNode())
        node.states.append(state)
        reason = reason.strip()
        if reason and reason.lower() != "none":
            node.reason = reason
    return nodes


def node_states(lines: Iterable[str]) -> Dict[str, bool]:
    """Slurm node name -> idle (SlurmNode.idle); `sinfo -N` repeats a node once per partition, so a node
    is idle only when every line of it says so."""
    return {name: node.idle for name, node in parse_sinfo(lines).items()}


def idle_nodes(
    lines: Iterable[str],
    nodes: NodeMap,
    specs: Sequence[GroupSpec],
    api: Optional[Callable[[], Dict[str, Tuple[str, str]]]] = None,
) -> List[Tuple[str, str, str, bool]]:
    """(cluster, group, instance id, idle) of each node of a mapped group that Slurm lists: the id from
    the resource file, else (with `api`, asked only when some node lacks one) from the SageMaker API. A
    node no source names (the API failed too) is left out: the controller reads no datum as not idle."""
    return [(c, g, i, node.idle) for c, g, i, _, node in named_nodes(parse_sinfo(lines), nodes, specs, api)]


def named_nodes(
    states: Dict[str, SlurmNode],
    nodes: NodeMap,
    specs: Sequence[GroupSpec],
    api: Optional[Callable[[], Dict[str, Tuple[str, str]]]] = None,
) -> List[Tuple[str, str, str, str, SlurmNode]]:
    """(cluster, group, instance id, Slurm name, node) of each listed node of a mapped group that a source
    names: the resource file, else (with `api`, asked only when some node lacks an id) the SageMaker API."""
    mapped = {s.group: s.cluster for s in specs}
    found = {name: nodes.lookup(name) for name in states}
    if api is not None and any(not f or not f[1] for f in found.values()):
        try:
            from_api = api()
        except Exception as exc:  # any SageMaker failure (botocore's errors are not importable here)
            print("warning: node ids from the SageMaker API unknown: %s" % exc, file=sys.stderr)
            from_api = {}
        found = {name: f if f and f[1] else from_api.get(name, f) for name, f in found.items()}
    out = []
    for name, node in sorted(states.items()):
        hit = found.get(name)
        if hit and hit[1] and hit[0] in mapped:
            out.append((mapped[hit[0]], hit[0], hit[1], name, node))
    return out


def read_marks(dynamodb: Any, table: str, cluster: str) -> Dict[str, str]:
    """Instance id -> reason of each drain gpufleet asks of the cluster (no item: none). Raises on a
    failed read: the caller then drains and resumes nothing of that cluster."""
    key = {"pk": {"S": MARKS_KEY_PREFIX + cluster}, "sk": {"S": MARKS_SK}}
    item = dynamodb.get_item(TableName=table, Key=key, ConsistentRead=True).get("Item") or {}
    return {
        name[len(MARKS_NODE_PREFIX) :]: str(((value.get("M") or {}).get("reason") or {}).get("S") or "")
        for name, value in item.items()
        if name.startswith(MARKS_NODE_PREFIX)
    }


def drain_reason(asked: str) -> str:
    """`gpufleet: <why>` on one printable line (Slurm keeps it as given; sinfo prints it in `%E`)."""
    text = " ".join("".join(c if c.isprintable() else " " for c in asked).split())
    return DRAIN_PREFIX + " " + (text[:120] or "consolidation by attrition")


def reconcile(
    found: Sequence[Tuple[str, str, str, str, SlurmNode]],
    wanted: Dict[str, Dict[str, str]],
    scontrol: Callable[[List[str]], Any],
    verify: Optional[Callable[[str, str], Optional[str]]] = None,
) -> List[str]:
    """Make Slurm match the drains gpufleet asks for, per node of a cluster whose marks were read
    (`wanted`: cluster -> instance id -> reason; a cluster missing from it is not touched): a requested node
    nobody has closed is drained with a gpufleet reason, unless `verify` (Slurm name, instance id) says why
    the id is not that node's; a node drained with a gpufleet reason and no longer requested is resumed. A
    node drained, down or failed by someone else is never drained again (its reason stays) nor resumed.
    Returns what was done; a failed scontrol is said and the next run tries again."""
    done: List[str] = []
    for cluster, _group, instance_id, name, node in found:
        if cluster not in wanted:
            continue
        asked = wanted[cluster].get(instance_id)
        if asked is not None and node.open:
            doubt = verify(name, instance_id) if verify is not None else None
            if doubt:
                print("note: %s (%s) not drained: %s" % (name, instance_id, doubt), file=sys.stderr)
                continue
            command = ["scontrol", "update", "NodeName=" + name, "State=DRAIN", "Reason=" + drain_reason(asked)]
        elif asked is None and node.ours and node.drain_flagged:
            command = ["scontrol", "update", "NodeName=" + name, "State=RESUME"]
        else:
            continue
        try:
            scontrol(command)
            done.append("%s %s (%s)" % (command[3].split("=")[1].lower(), name, instance_id))
        except (OSError, subprocess.SubprocessError) as exc:
            print("warning: %s failed: %s" % (" ".join(command[:4]), exc), file=sys.stderr)
    return done


def read_wanted(clusters: Iterable[str], read: Callable[[str], Dict[str, str]]) -> Dict[str, Dict[str, str]]:
    """Each cluster's marks (read_marks); a cluster whose read fails is left out (said): nothing of it is
    drained, resumed or reported drained."""
    wanted: Dict[str, Dict[str, str]] = {}
    for cluster in sorted(set(clusters)):
        try:
            wanted[cluster] = read(cluster)
        except Exception as exc:  # any DynamoDB failure (botocore's errors are not importable here)
            print("warning: gpufleet's drains for %s unread, none applied: %s" % (cluster, exc), file=sys.stderr)
    return wanted


class ApiNames:
    """The SageMaker API's Slurm name -> (group, id), asked at most once a run (named_nodes and the check
    before a drain share it); a failure is remembered too and raised again."""

    def __init__(self, resolve: Callable[[], Dict[str, Tuple[str, str]]]) -> None:
        self._resolve = resolve
        self._found: Optional[Dict[str, Tuple[str, str]]] = None
        self._error: Optional[Exception] = None

    def __call__(self) -> Dict[str, Tuple[str, str]]:
        if self._error is not None:
            raise self._error
        if self._found is None:
            try:
                self._found = self._resolve()
            except Exception as exc:  # any SageMaker failure (botocore's errors are not importable here)
                self._error = exc
                raise
        return self._found

    def contradicts(self, name: str, instance_id: str) -> Optional[str]:
        """Why the API says `instance_id` is not node `name`'s (None: it agrees, or does not know the name,
        or cannot be asked: the file's id is used as before, said)."""
        try:
            known = self().get(name)
        except Exception as exc:  # any SageMaker failure
            print("note: %s's id %s not checked with the API: %s" % (name, instance_id, exc), file=sys.stderr)
            return None
        if known and known[1] and known[1] != instance_id:
            return "the SageMaker API says %s is %s (the resource file is stale)" % (name, known[1])
        return None


def run(command: Sequence[str], env: Optional[Dict[str, str]] = None) -> List[str]:
    full_env = dict(os.environ, **env) if env else None
    out = subprocess.run(list(command), capture_output=True, text=True, timeout=30, check=True, env=full_env).stdout
    return out.splitlines()


def run_squeue(command: Sequence[str] = SQUEUE) -> List[str]:
    return run(command, SQUEUE_ENV)


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
    parser.add_argument(
        "--namespace",
        default=SLURM_NAMESPACE,
        help="default Slurm; with --hyperpod, Slurm means Slurm/<this node's aws:userid>, the only one gpufleet "
        "reads and IAM lets the controller write (sts:GetCallerIdentity, which needs no permission)",
    )
    parser.add_argument("--metric", default="PendingGPUs")
    parser.add_argument("--resource-config", default=RESOURCE_CONFIG, help="HyperPod's resource configuration")
    parser.add_argument("--node-cache", help="a JSON file caching node id -> Slurm name (HyperPod)")
    parser.add_argument(
        "--no-api", action="store_true", help="name nodes from the resource file only (no SageMaker calls)"
    )
    parser.add_argument(
        "--marks-table", help="gpufleet's state table: apply the Slurm drains it asks for (HyperPod; GetItem only)"
    )
    parser.add_argument("--region", help="AWS region (default: the environment's)")
    parser.add_argument("--dry-run", action="store_true", help="print the data, send nothing")
    return parser


def hyperpod_data(
    args: argparse.Namespace,
    lines: List[str],
    sinfo: Callable[[], List[str]],
    now: datetime,
    sagemaker: Callable[[], Any],
    dynamodb: Optional[Callable[[], Any]] = None,
    scontrol: Optional[Callable[[List[str]], Any]] = None,
) -> List[Dict[str, Any]]:
    """The backlog per group, then each node of a mapped group that Slurm calls idle: IdleNode 1 (nothing
    for one a job holds, that drains, ...). None when sinfo fails or no node can be named: saying a
    node is idle when it is not could remove it, so an unknown is never idle. With `--marks-table`, the
    drains gpufleet asks for are applied first (read_wanted, reconcile; `dynamodb` makes the client)."""
    specs = [GroupSpec.parse(text) for text in args.hyperpod]
    totals, unmapped = pending_by_group(lines, specs, args.partition)
    if unmapped:
        print("note: GPU jobs in no mapped partition, not counted: %s" % " ".join(unmapped[:20]), file=sys.stderr)
    data = [
        datum({"ClusterName": c, "InstanceGroupName": g}, args.metric, gpus, now) for (c, g), gpus in totals.items()
    ]
    try:
        nodes = NodeMap.load(args.resource_config)
    except (OSError, ValueError) as exc:
        print("note: resource file unreadable (%s): node ids from the SageMaker API" % exc, file=sys.stderr)
        nodes = NodeMap({})

    api = ApiNames(lambda: NodeIds(sagemaker(), args.node_cache).resolve(s.cluster for s in specs))
    try:
        found = named_nodes(parse_sinfo(sinfo()), nodes, specs, None if args.no_api else api)
    except (OSError, subprocess.SubprocessError) as exc:
        print("warning: idle nodes unknown, none published: %s" % exc, file=sys.stderr)
        found = []
    table = getattr(args, "marks_table", None)
    wanted: Dict[str, Dict[str, str]] = {}
    if table and found:
        client = (dynamodb or (lambda: _client("dynamodb", args.region)))()
        wanted = read_wanted((s.cluster for s in specs), lambda c: read_marks(client, table, c))
        verify = None if args.no_api else api.contradicts
        for line in reconcile(found, wanted, scontrol or run, verify):
            print("gpufleet drain: %s" % line, file=sys.stderr)
    for cluster, group, instance_id, _name, node in found:
        dims = {"ClusterName": cluster, "InstanceGroupName": group, "InstanceId": instance_id}
        if node.idle:  # nothing for a node that is not: its series costs only the hours it is idle
            data.append(datum(dims, IDLE_METRIC, 1, now))
        if node.drained_by_us and instance_id in wanted.get(cluster, {}):  # resumed this run: not drained
            data.append(datum(dims, DRAINED_METRIC, 1, now))
    return data


def own_namespace(sts: Any) -> str:
    """Slurm/<aws:userid> of these credentials ("Slurm/ROLEID:SageMaker" on a HyperPod node): GetCallerIdentity's
    UserId is the aws:userid IAM substitutes in the execution role's `Slurm/${aws:userid}` condition, and it
    needs no IAM permission (an explicit Deny cannot refuse it)."""
    userid = str(sts.get_caller_identity().get("UserId") or "")
    if not userid:
        raise ValueError("GetCallerIdentity answered no UserId")
    return SLURM_PREFIX + userid


def report_namespace(args: argparse.Namespace, sts: Callable[[], Any]) -> str:
    """Where the data go: --namespace as given, but with --hyperpod `Slurm` (the default) is this node's own
    Slurm/<aws:userid> (--dry-run: the IAM variable, unresolved: nothing is sent, no credentials asked)."""
    if not args.hyperpod or args.namespace != SLURM_NAMESPACE:
        return str(args.namespace)
    if args.dry_run:
        return SLURM_PREFIX + "${aws:userid}"
    return own_namespace(sts())


def _would_run(command: List[str]) -> None:
    """--dry-run: the drains are read and said, never applied."""
    print("would run: %s" % " ".join(command))


def _client(service: str, region: Optional[str]) -> Any:
    import boto3

    return boto3.client(service, region_name=region)


def main(
    argv: Optional[Sequence[str]] = None,
    squeue: Callable[[], List[str]] = run_squeue,
    cloudwatch: Any = None,
    sinfo: Callable[[], List[str]] = run_sinfo,
    sagemaker: Any = None,
    dynamodb: Any = None,
    scontrol: Optional[Callable[[List[str]], Any]] = None,
    sts: Any = None,
) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for text in args.hyperpod or ():
        try:
            GroupSpec.parse(text)
        except ValueError as exc:
            parser.error(str(exc))  # one line, exit 2, nothing sent
    try:
        namespace = report_namespace(args, lambda: sts or _client("sts", args.region))
    except Exception as exc:  # without its own namespace the report would land where nobody reads it
        print(f"error: this node's aws:userid unknown (sts GetCallerIdentity): {exc}; nothing sent", file=sys.stderr)
        return 1
    try:
        lines = squeue()
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"error: squeue failed: {exc}", file=sys.stderr)
        return 1
    now = datetime.now(timezone.utc)
    if args.hyperpod:
        data = hyperpod_data(
            args,
            lines,
            sinfo,
            now,
            lambda: sagemaker or _client("sagemaker", args.region),
            lambda: dynamodb or _client("dynamodb", args.region),
            _would_run if args.dry_run else scontrol,
        )
    else:
        data = [datum({"AutoScalingGroupName": args.asg}, args.metric, pending_gpus(lines, args.partition), now)]
    if args.dry_run:
        for d in data:
            dims = " ".join("%s=%s" % (x["Name"], x["Value"]) for x in d["Dimensions"])
            print(f"{namespace}/{d['MetricName']} {dims}: {int(d['Value'])}")
        return 0
    if cloudwatch is None:
        cloudwatch = _client("cloudwatch", args.region)
    for i in range(0, len(data), MAX_DATUMS):
        cloudwatch.put_metric_data(Namespace=namespace, MetricData=data[i : i + MAX_DATUMS])
    return 0


if __name__ == "__main__":
    sys.exit(main())
