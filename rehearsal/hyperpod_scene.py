"""The rehearsal's HyperPod Slurm scene (issue 30), on a fresh moto (reset after the others) with the real
Slurm backlog publisher, node publisher, scaler, OOM guard and `gpufleet report`. hyperpod:ml-cluster/gpu
is a Slurm-orchestrated HyperPod cluster's instance group of ml.p5.48xlarge (8 GPUs), at 0 nodes, tagged
gpufleet:managed=true; its rule reads the backlog (`demand: {metric: {namespace: Slurm, metric_name:
PendingGPUs}, gpus_per_node: 8}`).

- Job 1041 of account nlp (`sbatch -A nlp -p gpu --nodes=2 --gpus-per-node=8`) waits: the backlog
  publisher (ami/slurm_pending_gpus.py's own functions, fed squeue's and sinfo's real output) puts
  PendingGPUs 16; one tick scales the group 0 -> 2 (UpdateCluster [emulated]).
- The two nodes run the real publisher: a HyperPod identity from resource_config.json (the file HyperPod
  writes on each node, in its format), simulated GPUs, attribution on: each GPU's process sits in the job's
  cgroup as Slurm's cgroup/v2 plugin makes it, and squeue (an injected runner, squeue's `%A|%a|%P` format)
  names the job's account and partition. Their usage records go to CloudWatch Logs.
- Job 1041 ends at minute 11; job 1042 of account vision (1 node) starts on node B at once. Slurm reports A
  idle: the backlog publisher puts IdleNode for A each minute.
- Consolidation by attrition (issue 31; the rule has `consolidate: attrition`, `drain_max_share: 100`): after
  five idle minutes the tick asks Slurm to drain A (SlurmMarker: the marks item in the state table); the
  publisher, run with `--marks-table`, applies it the next minute (`scontrol update ... State=DRAIN
  Reason=gpufleet: ...` on rehearsal.slurm_emulation's EmulatedSlurm, kept in step with the jobs). An
  operator drains B (its own reason): gpufleet never touches it. A's ask is withdrawn (SlurmMarker.reopen, as
  the core's reopen calls it; the scene calls it: no waiting job here would make the core reopen A) and the
  publisher resumes A; the next tick asks again. The tick of the minute the publisher applies that drain
  removes nothing (its report was read before the drain: no DrainedNode for A yet); the next one, whose
  report says A is drained by gpufleet and idle (DrainedNode=1), removes A by id (BatchDeleteClusterNodes
  [emulated]) and keeps B, whose GPUs run job 1042.
- `gpufleet report --by account` charges the jobs' GPU-hours to nlp and vision, group hyperpod:ml-cluster/gpu.
- Job 1042 leaks host memory on B (the publisher's host reader reads a /proc/meminfo the scene rewrites each
  minute): the OOM guard, on its host-screening minute, warns for B's host memory.

[emulated]: moto runs no HyperPod node and no Slurm: the scene plays slurmctld (squeue, sinfo, scontrol), the nodes'
processes and HyperPod's resource file. Clock: simulated, from 09:00 on the rehearsal's day (moto's Logs
clock follows it, GPUFLEET_MOTO_LOGS_NOW); HyperPod nodes carry no LaunchTime the scaler reads, and the
adapter's idle window is read on the tick's clock (HyperPodFleet.now, set per tick as
tests/integration/test_hyperpod_moto.py does).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef, MarkChannel
from gpufleet.runtime import build_guard
from gpufleet_node import schema
from gpufleet_node.attribution import Attributor
from gpufleet_node.host import HostFeed, HostReader
from gpufleet_node.identity import Identity, read_hyperpod
from gpufleet_node.nvml import ProcessUse, SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import LogSender, Sender
from gpufleet_node.slurm_jobs import SlurmJobs
from gpufleet_node.tracker import UsageTracker
from rehearsal import fleet, moto_hyperpod
from rehearsal.scenario import START
from rehearsal.slurm_emulation import EmulatedSlurm
from rehearsal.trust_scene import TABLE, TrustResult, TrustScenes

ROOT = Path(__file__).resolve().parents[1]
GROUP = GroupRef(kind=GroupKind.HYPERPOD, cluster="ml-cluster", name="gpu")
PARTITION = "gpu"
GPUS, GPU_MIB = 8, 81559.0  # ml.p5.48xlarge: 8 x H100 80 GB
T0 = START + timedelta(hours=1)  # the scene's clock: 09:00 on the rehearsal's day
EVERY_S = 10  # the node publishers' simulated sampling
# minutes: job 1041 ends and 1042 starts (staging its data: GPUs idle); the scale-in tick; 1042's GPUs busy;
# the guard's run (a host-screening minute)
JOB2_AT, SCALE_IN, JOB2_GPUS, GUARD = 11, 16, 18, 25
# consolidation by attrition (issue 31): an operator drains B; A's ask withdrawn (resumed the next minute) and
# asked again; A removed once Slurm's report says the drain landed (DrainedNode)
OTHER_DRAIN, WITHDRAW, REDRAIN, SETTLING, REMOVE = 17, 18, 19, 20, 21
OTHER_REASON = "ops: ECC check after job 1042"
END = GUARD  # the nodes publish minutes 1 .. END-1
IPS = ("10.1.28.64", "10.1.28.65")  # the GPU nodes' addresses in the cluster's subnet [emulated]
USERS = {2001: "alice", 2002: "bob"}  # [emulated passwd]
MEM_TOTAL_KB = 2_097_152_000  # ml.p5.48xlarge: 2 TiB
RULE = (
    f"  - name: {GROUP.name}\n    kind: hyperpod\n    cluster: {GROUP.cluster}\n    min: 0\n    max: 4\n"
    "    scale_out_cooldown_s: 0\n    scale_in_cooldown_s: 0\n    consolidate: attrition\n    drain_max_share: 100\n"
    "    demand: {metric: {namespace: Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}\n"
)


class Job:
    """One Slurm job as slurmctld knows it [emulated]."""

    def __init__(self, job_id: str, account: str, uid: int, nodes: int, util: float, mem: float) -> None:
        self.job_id, self.account, self.uid, self.nodes = job_id, account, uid, nodes
        self.util, self.mem = util, mem
        self.on: list[str] = []  # the Slurm node names it runs on; empty: pending (or ended)
        self.submitted = job_id == "1041"  # 1042 is submitted when 1041 ends
        self.ended = False


JOBS = (Job("1041", "nlp", 2001, 2, 92.0, 71.0), Job("1042", "vision", 2002, 1, 88.0, 64.0))


def slurm_name(ip: str) -> str:
    """How Slurm names a HyperPod node: its hostname."""
    return "ip-" + ip.replace(".", "-")


def backlog_publisher() -> ModuleType:
    """ami/slurm_pending_gpus.py, the script the controller node runs each minute (not a package)."""
    spec = importlib.util.spec_from_file_location("slurm_pending_gpus", ROOT / "ami" / "slurm_pending_gpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Slurm:
    """[emulated slurmctld] squeue's answers from the scene's jobs; sinfo and scontrol from an EmulatedSlurm
    (rehearsal.slurm_emulation) whose nodes follow the jobs (allocated while one runs there, else idle)."""

    def __init__(self) -> None:
        self.jobs = {j.job_id: j for j in JOBS}
        self.emulated = EmulatedSlurm()

    @property
    def nodes(self) -> list[str]:
        """The registered Slurm nodes."""
        return sorted(self.emulated.nodes)

    def register(self, names: Sequence[str]) -> None:
        for name in names:
            self.emulated.add(name, partitions=(PARTITION,))

    def deregister(self, name: str) -> None:
        """A node HyperPod removed leaves the cluster's slurm.conf [emulated]."""
        self.emulated.nodes.pop(name, None)
        self.emulated.partitions.pop(name, None)

    def pending(self) -> list[str]:
        """`squeue --states=PENDING --noheader --Format=JobID:0|,NumNodes:0|,...` (the backlog publisher's)."""
        return [
            f"{j.job_id}|{j.nodes}|{j.nodes}|{PARTITION}|N/A|gres/gpu:{GPUS}|N/A"
            for j in self.jobs.values()
            if j.submitted and not j.on and not j.ended
        ]

    def sinfo(self) -> list[str]:
        """`sinfo -N -h -o '%N|%T|%E'`: each node allocated or idle by the jobs, its drain flag and reason
        as scontrol left them."""
        busy = {n for j in self.jobs.values() for n in j.on}
        for name in self.emulated.nodes:
            self.emulated.set_base(name, "allocated" if name in busy else "idle")
        return self.emulated.sinfo()

    def squeue_jobs(self, argv: Sequence[str]) -> list[str]:
        """`squeue --noheader --format=%A|%a|%P --jobs=ID,...` (the node publisher's SlurmJobs)."""
        wanted = next(a for a in argv if a.startswith("--jobs=")).removeprefix("--jobs=").split(",")
        return [f"{i}|{self.jobs[i].account}|{PARTITION}" for i in wanted if i in self.jobs]


class Node:
    """One GPU node: its publisher (HyperPod identity, simulated GPUs, attribution, host reader)."""

    def __init__(self, root: Path, iid: str, config: Path, slurm: Slurm, clients: Any) -> None:
        self.iid, self.root = iid, root
        found = read_hyperpod(str(config), iid, lambda: None)
        cluster, group = found if found else (None, None)
        self.identity = Identity(iid, "us-east-1", "p5.48xlarge", hyperpod_cluster=cluster, instance_group=group)
        self.backend = SimulatedBackend(gpus=GPUS, memory_total_mib=GPU_MIB)
        self.meminfo = root / "proc" / "meminfo"
        self.meminfo.parent.mkdir(parents=True, exist_ok=True)
        self.memory(30.0)
        uuids = [self.backend.describe(g).uuid for g in range(GPUS)]
        attributor = Attributor(proc_root=str(root / "proc"), log_root=str(root / "var" / "log"), user_name=USERS.get)
        sender = Sender(clients.cloudwatch)
        logs = LogSender(boto3.client("logs"), schema.USAGE_LOG_GROUP, iid)
        tracker = UsageTracker(
            attributor, None, uuids, logs, sender, sample_s=EVERY_S, jobs=SlurmJobs(runner=slurm.squeue_jobs)
        )
        host = HostFeed(HostReader(filesystems=(), meminfo=str(self.meminfo)))
        self.pub = Publisher(self.backend, self.identity, sender, detail="adaptive", usage=tracker, host=host)
        self.pub.start(xid_thread=False)

    def memory(self, used_percent: float) -> None:
        """/proc/meminfo as the kernel writes it (kB), MemAvailable setting the used percent."""
        available = int(MEM_TOTAL_KB * (1 - used_percent / 100))
        self.meminfo.write_text(
            f"MemTotal:       {MEM_TOTAL_KB} kB\nMemFree:        {available - 4_000_000} kB\n"
            f"MemAvailable:   {available} kB\nBuffers:          412000 kB\nCached:         3588000 kB\n"
            "SwapCached:            0 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n"
        )

    def run(self, job: Job | None) -> None:
        """Each GPU runs one task of `job` (None: nothing), its process in the job's cgroup."""
        for g in range(GPUS):
            if job is None:
                self.backend.set(g, utilization=0.0, memory_percent=0.0)
                self.backend.set_processes(g, [])
                continue
            pid = 5000 + 100 * int(job.job_id[-1]) + g
            write_slurm_process(self.root, pid, job.job_id, g, job.uid)
            self.backend.set(g, utilization=job.util, memory_percent=job.mem)
            self.backend.set_processes(g, [ProcessUse(pid, GPU_MIB * job.mem / 100, job.util)])

    def minute(self, at: datetime) -> None:
        simulate(self.pub, at, 60, every_s=EVERY_S)
        self.pub.close_windows(at + timedelta(seconds=59))


def write_slurm_process(root: Path, pid: int, job_id: str, task: int, uid: int) -> None:
    """/proc/PID/{cgroup,stat,status} of a Slurm task under cgroup/v2 (slurm.schedmd.com/cgroup_v2.html:
    /system.slice/slurmstepd.scope/job_<id>/step_<s>/user/task_<n>; gpufleet_node.attribution reads it)."""
    proc = root / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    (proc / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{job_id}/step_0/user/task_{task}\n")
    rest = f"S 1 {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {1000 + pid} 1000 100"
    (proc / "stat").write_text(f"{pid} (python3) {rest}\n")
    (proc / "status").write_text(f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")


class HyperPodScene(TrustScenes):
    """The scene; `run()` returns its lines and expected outcomes (TrustScenes' plumbing, its own logs)."""

    def _logger(self, service: str) -> Logger:
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"hyperpod-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"hyperpod-{service}", logger_handler=handler)
        return self.loggers[service]

    def run(self) -> TrustResult:
        self.setup()
        self.scene = "hyperpod"
        self.drains: list[dict[str, Any]] = []  # the ticks that asked Slurm to drain A
        self.reopened = ""
        self.settling: dict[str, Any] = {}  # the tick before A's drain settled
        self.sm = boto3.client("sagemaker")
        boto3.client("logs").create_log_group(logGroupName=schema.USAGE_LOG_GROUP)  # what the stack creates
        self.dir = self.out / "hyperpod"
        self.config = self.dir / "opt" / "ml" / "config" / "resource_config.json"
        self.config.parent.mkdir(parents=True, exist_ok=True)
        self.slurm = Slurm()
        self.backlog = backlog_publisher()
        moto_hyperpod.create_cluster(self.sm, GROUP.cluster or "", GROUP.name, count=0, tags=fleet.MANAGED_TAG)
        self.write_config([])
        scaler = self._scaler("hyperpod", RULE)
        self.guard = build_guard(self._logger("oom_guard"), Metrics(service="oom_guard"), env=self._env(
            self.out / "policy-hyperpod.yaml"))  # fmt: skip
        self.say(0, f"{GROUP.key}: a Slurm HyperPod cluster's instance group, ml.p5.48xlarge (8 GPUs), 0 nodes, "
                 "tagged gpufleet:managed=true [emulated: moto's CreateCluster]; its rule: demand {metric: {namespace: "
                 "Slurm, metric_name: PendingGPUs}, gpus_per_node: 8}, max 4")  # fmt: skip
        self.say(0, "[emulated Slurm] job 1041 (account nlp, `sbatch -A nlp -p gpu --nodes=2 --gpus-per-node=8`) "
                 "PENDING")  # fmt: skip
        self.publish_backlog(0)
        out = self.tick_at(scaler, 0)
        nodes = self.nodes()
        if len(nodes) != 2:
            self._ok(False, GROUP, "", f"scale-out {out['action']} {out['outcome']}: nodes {nodes}")
            return self.result
        self.a, self.b = nodes
        self.write_config(nodes)
        self.start_nodes(nodes)
        cut = self.story(scaler)
        report = self.report()
        warned = self.leak_warned()
        self._verify(out, cut, report, warned)
        return self.result

    # ---- plumbing ----

    def tick_at(self, scaler: Any, minute: int) -> dict[str, Any]:
        """One reconcile tick half a minute into `minute`, the adapter's idle window read on that clock;
        what SNS delivered of it shown."""
        now = T0 + timedelta(minutes=minute, seconds=30)
        scaler.ctx.fleet.hyperpod.now = lambda: now  # the idle window on the scene's clock
        scaler.ctx.executor.actuator.markers[MarkChannel.SLURM].now = lambda: now  # the drain asks' time
        decision = self.tick(scaler, now, minute, GROUP)
        for told in self.notify(now + timedelta(seconds=10)) + self.notify(now + timedelta(seconds=50)):
            self.say(minute, f"[SNS] {told.subject}")
        return decision

    def nodes(self) -> list[str]:
        found = self.sm.list_cluster_nodes(ClusterName=GROUP.cluster)["ClusterNodeSummaries"]
        found = [n for n in found if n["InstanceGroupName"] == GROUP.name]  # not Slurm's controller node
        return [n["InstanceId"] for n in sorted(found, key=lambda n: (n["LaunchTime"], n["InstanceId"]))]

    def write_config(self, nodes: list[str]) -> None:
        """[emulated HyperPod] /opt/ml/config/resource_config.json as HyperPod writes it on every node
        (tests/node/hyperpod_config.py cites its fields), listing the group's nodes."""
        doc = {
            "ClusterConfig": {
                "ClusterArn": self.sm.describe_cluster(ClusterName=GROUP.cluster)["ClusterArn"],
                "ClusterName": GROUP.cluster,
            },
            "InstanceGroups": [
                {
                    "Name": "controller-machine",
                    "InstanceType": "ml.c5.xlarge",
                    "Instances": [
                        {
                            "InstanceName": "controller-machine-1",
                            "CustomerIpAddress": "10.1.113.28",
                            "InstanceId": "i-0c0ffee0c0ffee001",
                        }
                    ],
                },
                {
                    "Name": GROUP.name,
                    "InstanceType": "ml.p5.48xlarge",
                    "Instances": [
                        {"InstanceName": f"{GROUP.name}-{n + 1}", "CustomerIpAddress": IPS[n], "InstanceId": iid}
                        for n, iid in enumerate(nodes)
                    ],
                },
            ],
        }
        self.config.write_text(json.dumps(doc, indent=1))

    def publish_backlog(self, minute: int) -> list[str]:
        """The controller node's minute: ami/slurm_pending_gpus.py --hyperpod ml-cluster:gpu=gpu, its own
        parsing and data (squeue and sinfo answered by [emulated Slurm]), stamped on the scene's clock."""
        target = f"{GROUP.cluster}:{GROUP.name}={PARTITION}"
        cache = str(self.out / "hyperpod-node-cache.json")
        args = self.backlog._parser().parse_args(
            ["--hyperpod", target, "--resource-config", str(self.config), "--node-cache", cache, "--marks-table", TABLE]
        )
        at = T0 + timedelta(minutes=minute)  # the file names every node's id: the SageMaker API is not asked
        emulated = self.slurm.emulated
        done = len(emulated.calls)
        with contextlib.redirect_stderr(io.StringIO()):  # its "gpufleet drain: ..." notes: the calls are shown
            data = self.backlog.hyperpod_data(
                args, self.slurm.pending(), self.slurm.sinfo, at, lambda: self.sm,
                dynamodb=lambda: self.clients.dynamodb, scontrol=emulated.scontrol,
            )  # fmt: skip
        for call in emulated.calls[done:]:
            self.say(minute, f"slurm_pending_gpus.py --marks-table {TABLE}: `{' '.join(call)}` [emulated Slurm]")
        if emulated.calls[done:]:
            self.say(minute, f"[emulated Slurm] $ sinfo -N -h -o '%N|%T|%E': {'; '.join(self.slurm.sinfo())}")
        # Into the controller node's own namespace, as the script does with its role (sts GetCallerIdentity).
        namespace = moto_hyperpod.report_namespace(self.sm, GROUP.cluster or "")
        self.clients.cloudwatch.put_metric_data(Namespace=namespace, MetricData=data)
        said = [
            f"{d['MetricName']}"
            + (f"[{dim['Value']}]" if (dim := {x["Name"]: x for x in d["Dimensions"]}.get("InstanceId")) else "")
            + f"={d['Value']:g}"
            for d in data
        ]
        return said

    def start_nodes(self, nodes: list[str]) -> None:
        self.node = {iid: Node(self.dir / iid, iid, self.config, self.slurm, self.clients) for iid in nodes}
        self.slurm.register([slurm_name(ip) for ip in IPS])
        job = self.slurm.jobs["1041"]
        job.on = list(self.slurm.nodes)
        for n in self.node.values():
            n.run(job)
        ids = ", ".join(f"{iid} ({slurm_name(ip)})" for iid, ip in zip(nodes, IPS, strict=True))
        self.say(1, f"[emulated HyperPod] nodes {ids} Running; each one's resource_config.json names it "
                 f"{self.node[nodes[0]].identity.group_key()} (its publisher's identity, read with gpufleet_node."
                 "identity.read_hyperpod)")  # fmt: skip
        self.say(1, "[emulated Slurm] job 1041 RUNNING on both (16 GPUs, user alice); the nodes' publishers attribute "
                 "each GPU's process to it by its cgroup (/system.slice/slurmstepd.scope/job_1041/...)")  # fmt: skip

    def story(self, scaler: Any) -> dict[str, Any]:
        """Minutes 1 .. END-1: the job, the switch to job 1042 on B, A idle; A drained by attrition, its ask
        withdrawn and resumed, drained again; B drained by someone else; A removed once its drain settled."""
        cut: dict[str, Any] = {}
        for minute in range(1, END):
            at = T0 + timedelta(minutes=minute)
            if minute == JOB2_AT:
                self.switch_jobs()
            if minute == JOB2_GPUS:
                self.node[self.b].run(self.slurm.jobs["1042"])
                self.say(minute, f"[emulated Slurm] job 1042's data staged: its tasks run on {self.b}'s 8 GPUs")
            if minute == OTHER_DRAIN:
                self.slurm.emulated.drain_by_someone(slurm_name(IPS[1]), OTHER_REASON)
                self.say(minute, f"[emulated Slurm] an operator drains {slurm_name(IPS[1])} ({self.b}): `scontrol "
                         f"update NodeName={slurm_name(IPS[1])} State=DRAIN Reason=\"{OTHER_REASON}\"`")  # fmt: skip
            if minute == WITHDRAW:
                self.withdraw(scaler)
            said = self.publish_backlog(minute)
            if minute in (1, JOB2_AT, SCALE_IN):
                self.say(minute, f"slurm_pending_gpus.py --hyperpod {GROUP.cluster}:{GROUP.name}={PARTITION}: "
                         f"{', '.join(said)}")  # fmt: skip
            b = self.node[self.b]
            b.memory(40.0 if minute < JOB2_AT else 58.0 + 2.0 * (minute - JOB2_AT))  # job 1042 leaks host memory
            for n in self.node.values():
                n.minute(at)
            if minute in (SCALE_IN, REDRAIN):
                self.drains.append(self.tick_at(scaler, minute))
            if minute == SETTLING:
                self.settling = self.tick_at(scaler, minute)
            if minute == REMOVE:
                cut = self.remove_tick(scaler, minute, at)
        for n in self.node.values():
            n.pub.finish(T0 + timedelta(minutes=END))
        return cut

    def withdraw(self, scaler: Any) -> None:
        """The ask on A withdrawn as the core's reopen withdraws it (FleetActuator -> SlurmMarker.reopen: the
        attribute REMOVEd from the marks item), here called by the scene: the next publisher minute resumes A."""
        marker = scaler.ctx.executor.actuator.markers[MarkChannel.SLURM]
        [obs] = scaler.ctx.fleet.hyperpod.observe([GROUP], attrition={GROUP.key})
        self.reopened = marker.reopen(obs, [self.a])
        self.say(WITHDRAW, f"[scene] A's drain ask withdrawn with SlurmMarker.reopen (what the core's reopen "
                 f"calls): '{self.reopened}'")  # fmt: skip

    def remove_tick(self, scaler: Any, minute: int, at: datetime) -> dict[str, Any]:
        cut = self.tick_at(scaler, minute)
        left = self.nodes()
        if self.a not in left:
            self.node.pop(self.a).pub.finish(at + timedelta(seconds=59))
            self.slurm.deregister(slurm_name(IPS[0]))
        self.say(minute, f"nodes left: {', '.join(left)}; {self.b} kept: Slurm reports {slurm_name(IPS[1])} "
                 f"draining (job 1042 runs; drained by an operator): no IdleNode for it, so it runs work")  # fmt: skip
        return cut

    def switch_jobs(self) -> None:
        first, second = self.slurm.jobs["1041"], self.slurm.jobs["1042"]
        first.on, first.ended = [], True
        second.submitted, second.on = True, [slurm_name(IPS[1])]
        self.node[self.a].run(None)
        self.node[self.b].run(None)  # staging its data set first: every GPU of B reads idle, as A's do
        self.say(JOB2_AT, f"[emulated Slurm] job 1041 COMPLETED; job 1042 (account vision, user bob, 8 GPUs) RUNNING "
                 f"on {slurm_name(IPS[1])} ({self.b}), staging its data set (its GPUs idle, like A's); "
                 f"{slurm_name(IPS[0])} ({self.a}) idle; the staging leaks host memory on B (/proc/meminfo: 58 % "
                 "used, +2 %/min)")  # fmt: skip

    def report(self) -> dict[str, Any]:
        """`gpufleet report --by account` over the scene's hour, as on-call runs it (--max-tps: moto has no
        FilterLogEvents quota); its teams and groups shown, the JSON returned."""
        from gpufleet_tools.cli import main as cli

        start, end = T0, T0 + timedelta(hours=1)
        base = ["report", "--start", start.isoformat(), "--end", end.isoformat(), "--by", "account"]
        base += ["--no-progress", "--max-tps", "100", "--endpoint", os.environ[defaults.ENV_ENDPOINT_URL]]
        texts = []
        for fmt in ("table", "json"):
            text = io.StringIO()
            with contextlib.redirect_stdout(text):
                code = cli([*base, "--format", fmt])
            texts.append((code, text.getvalue()))
        (_, table), (code, doc) = texts
        shown = [line for line in table.splitlines() if line.strip()]
        keep = _sections(shown, ("TEAMS", "WORKLOADS", "GROUPS"))
        for line in [f"$ gpufleet report --start {start:%Y-%m-%dT%H:%M} --end {end:%H:%M} --by account", *keep]:
            self.say(END, f"  {line}")
        result: dict[str, Any] = json.loads(doc) if code == 0 else {}
        return result

    def leak_warned(self) -> dict[str, str]:
        """The OOM guard on its host-screening minute: what it holds at risk, and what on-call is told."""
        now = T0 + timedelta(minutes=GUARD, seconds=30)
        self.guard.ctx.fleet.hyperpod.now = lambda: now  # type: ignore[union-attr]
        result = self.guard.evaluate(now, "hyperpod-guard")
        at_risk: dict[str, str] = dict(result["at_risk"])
        for key, why in at_risk.items():
            self.say(GUARD, f"oom_guard: {key}: {why}")
        for told in self.notify(now + timedelta(seconds=10)) + self.notify(now + timedelta(seconds=50)):
            self.say(GUARD, f"[SNS] {told.subject}: {told.why}")
            at_risk["told"] = told.subject
        return at_risk

    def _verify(self, out: dict[str, Any], cut: dict[str, Any], report: dict[str, Any], warned: dict[str, str]) -> None:
        left = self.nodes()
        scaled = (out["action"], out["outcome"], out["current"], out["desired"]) == ("scale-out", "applied", 0, 2)
        removed = (
            cut.get("action") == "scale-in"
            and cut.get("victims") == [self.a]
            and "BatchDeleteClusterNodes" in cut.get("detail", "")
            and "passed over 1 running" in cut.get("reason", "")  # Slurm's word, not its GPUs (they read idle)
            and left == [self.b]
        )
        teams = {t["team"]: t for t in report.get("teams", [])}
        hours = {k: float(teams[k]["gpu_hours_held"]) if k in teams else 0.0 for k in ("nlp", "vision")}
        groups = [g["group"] for g in report.get("groups", [])]
        host = warned.get(f"{self.b}/host", "")
        self._ok(
            scaled,
            GROUP,
            f"Slurm/PendingGPUs 16 (job 1041, 2 nodes x 8 GPUs) -> scale-out {out['current']} -> {out['desired']} "
            "(UpdateCluster [emulated])",
            f"scale-out {out['action']} {out['outcome']} {out['current']} -> {out['desired']} ({out['reason']})",
        )
        self._ok(
            removed,
            GROUP,
            f"at minute {REMOVE}, {self.a}, drained by gpufleet and idle by Slurm, removed by id once Slurm's report "
            f"showed the drain landed (BatchDeleteClusterNodes [emulated]); {self.b}, running Slurm job 1042 with "
            f"every GPU idle too, kept: '{cut.get('reason', '')}'",
            f"scale-in {cut.get('action')} {cut.get('outcome')} victims {cut.get('victims')} ({cut.get('reason')}; "
            f"{cut.get('detail')}), left {left}",
        )
        self._ok(
            hours["nlp"] > 0 and hours["vision"] > 0 and groups == [GROUP.key],
            GROUP,
            f"`gpufleet report --by account`: nlp {hours['nlp']:.2f} GPU-h, vision {hours['vision']:.2f} GPU-h, group "
            f"{', '.join(groups)}",
            f"report teams {sorted(teams)} {hours}, groups {groups}",
        )
        self._ok(
            host.startswith("warning"),
            GROUP,
            f"host memory leak on {self.b}: OOM guard {host}",
            f"guard at risk {warned}",
        )
        self._verify_marks()

    def _verify_marks(self) -> None:
        """The drains: each drain tick asked for A alone by attrition; the publisher drained A, resumed it once
        its ask was withdrawn, drained it again, and never touched B, which an operator drained."""
        a, b = slurm_name(IPS[0]), slurm_name(IPS[1])
        asked = [(d.get("drain"), "by attrition" in d.get("reason", "")) for d in self.drains]
        calls = [" ".join(c[2:4]) for c in self.slurm.emulated.calls]
        want = [f"NodeName={a} State=DRAIN", f"NodeName={a} State=RESUME", f"NodeName={a} State=DRAIN"]
        other = self.slurm.emulated.nodes[b]
        self._ok(
            asked == [([self.a], True)] * 2 and calls == want and not self.settling.get("victims", ["?"]),
            GROUP,
            f"consolidate: attrition: minute {SCALE_IN}'s tick asked Slurm to drain {self.a} (the state table's marks "
            f"item); the controller's publisher ran `scontrol update NodeName={a} State=DRAIN Reason=gpufleet: ...`, "
            f"then `State=RESUME` once the ask was withdrawn (SlurmMarker.reopen), then drained it again "
            f"(minute {REDRAIN}'s ask) [emulated Slurm]; minute {SETTLING}'s tick, before Slurm's report showed that "
            f"drain landed (no DrainedNode for {a} yet), removed nothing",
            f"drain asks {asked}, scontrol calls {calls}, minute {SETTLING}'s victims {self.settling.get('victims')}",
        )
        self._ok(
            other.drain and other.reason == OTHER_REASON,
            GROUP,
            f"{b} ({self.b}), drained by an operator ('{OTHER_REASON}'), left drained: gpufleet resumed only its own",
            f"{b}: drain {other.drain}, reason '{other.reason}'",
        )


def _sections(lines: list[str], names: tuple[str, ...]) -> list[str]:
    """The table's named sections (a section runs to the next all-caps heading)."""
    out, on = [], False
    for line in lines:
        if line.isupper() or line.split(" (")[0].isupper():
            on = line.split(" (")[0] in names
        if on:
            out.append(line)
    return out
