"""The rehearsal's demand-driven scenes: work that waits for a group, not GPU utilization, sizes it.

- eks:ml/train-gpu (min 0): a burst of unschedulable GPU pods in cluster ml, served by a Kubernetes API on
  loopback [emulated], scales it out from 0 in one step; the kube-scheduler [emulated] binds each pod to a
  new node (its EC2 private DNS name) once the node is InService. When the burst is done, one node gets a pod
  that is loading its weights (its GPUs read idle): the scale-in takes the idle nodes and passes over that
  one; when it is done too, the group goes back to 0.
- asg:train-slurm (min 0): Slurm jobs wait [emulated Slurm]; the head node's publisher (as
  ami/slurm_pending_gpus.py) puts Slurm/PendingGPUs every minute on the simulated clock; the group scales
  from 0 in one step, its jobs run, and it goes back to 0 when they are done.

A node's GPUs are busy while work runs on them, idle otherwise (and while a pod loads its weights).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet.settings import ENV_KUBE_ENDPOINTS
from rehearsal import fleet
from rehearsal.kube_api import KubeApi, pod

CLUSTER = "ml"
TRAIN_GPU = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster=CLUSTER, name="train-gpu")
SLURM = GroupRef(kind=GroupKind.ASG, name="train-slurm")
TOKEN = "gpufleet-rehearsal-token"
GPUS_PER_NODE = 4  # g5.12xlarge
SLURM_SUBMIT, SLURM_DONE = 25, 50  # three Slurm jobs wait from 08:25, run once nodes come, end at 08:50
BURST_MINUTE = 40  # three GPU pods are created in cluster ml; nothing there can run them
TRAINED_MINUTE = 56  # the burst's pods succeed; eval-1 arrives and is loading its weights (GPUs idle)
LOADED_MINUTE = 68  # eval-1 succeeds
ON_TRAIN = {"eks.amazonaws.com/nodegroup": TRAIN_GPU.name}
BUSY, IDLE = (95.0, 80.0), (0.0, 2.0)  # a GPU's (utilization %, memory %) with and without work
BURST_REASON = re.compile(r"3 pods \(2x4 GPUs, 1x2\) unschedulable for \d+ min: scale out 0 -> 3 \(4 GPUs per node\)")
SLURM_REASON = "10 GPU(s) requested by waiting jobs: scale out 0 -> 3 (4 GPUs per node)"

# The rules the rehearsal's policy gets for these groups (first in its groups: `train-*` would match first).
POLICY_RULES = f"""\
  - name: {TRAIN_GPU.name}  # pods waiting in cluster {CLUSTER} [emulated Kubernetes API]
    cluster: {CLUSTER}
    kind: eks-nodegroup
    min: 0
    max: 6
    scale_in_cooldown_s: 180
    target: {{low: 30, high: 85}}
    demand: {{kubernetes: {{}}}}
  - name: {SLURM.name}  # the GPUs Slurm's pending jobs request [emulated Slurm]
    kind: asg
    min: 0
    max: 4
    scale_in_cooldown_s: 180
    target: {{low: 30, high: 85}}
    demand: {{metric: {{namespace: Slurm, metric_name: PendingGPUs}}, gpus_per_node: {GPUS_PER_NODE}}}
"""


@dataclass
class Work:
    """A GPU pod (namespace/name) or a Slurm job, where it runs and whether it is over."""

    name: str
    gpus: int
    created: int = 0  # the minute it was submitted
    node: str | None = None  # the instance it runs on
    loading: bool = False  # loading its weights: its GPUs read idle
    done: bool = False

    @property
    def running(self) -> bool:
        return self.node is not None and not self.done


class DemandScenes:
    """The two groups, their scripted work and the emulated schedulers; `tick` once a minute before the
    nodes publish, `gpu_load` per node, `verify` at the end."""

    groups = (TRAIN_GPU, SLURM)

    def __init__(
        self,
        clients: fleet.Clients,
        kube: tuple[KubeApi, str],
        instances: Callable[[str], list[str]],
        say: Callable[[int, str], None],
        start: datetime,
    ) -> None:
        self.clients, (self.api, self.url) = clients, kube
        self.instances, self.say, self.start = instances, say, start
        self.pods: list[Work] = []
        self.jobs: list[Work] = []
        self.dns: dict[str, str] = {}  # instance id -> private DNS name (the Kubernetes node's name)
        self.bound_at: dict[str, int] = {}  # pod -> the minute it was bound
        self.loaded_on: str | None = None  # the node eval-1 ran on
        self.running_on: dict[int, set[str]] = {}  # minute -> nodes running work then

    def setup(self) -> dict[str, str]:
        """Both groups at 0, tagged; returns each one's backing ASG."""
        backing = fleet.create_nodegroup(
            self.clients, CLUSTER, TRAIN_GPU.name, min_size=0, max_size=6, desired=0, tags=fleet.MANAGED_TAG
        )
        fleet.create_asg(self.clients, SLURM.name, min_size=0, max_size=4, desired=0, tags=fleet.MANAGED_TAG)
        return {TRAIN_GPU.key: backing, SLURM.key: SLURM.name}

    def env(self) -> dict[str, str]:
        """Where the scaler finds cluster ml's API (the local override of DescribeCluster's endpoint)."""
        return {ENV_KUBE_ENDPOINTS: json.dumps({CLUSTER: {"url": self.url, "token": TOKEN}})}

    def _stamp(self, minute: int, second: int = 0) -> str:
        return (self.start + timedelta(minutes=minute, seconds=second)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def tick(self, minute: int) -> None:
        """This minute's scripted work, then the emulated schedulers place what waits, then Slurm's backlog."""
        if minute == SLURM_SUBMIT:
            self.jobs = [Work(f"job {101 + i}", gpus) for i, gpus in enumerate((4, 4, 2))]
            self.say(minute, "[emulated Slurm] 3 jobs submitted to train-slurm's partition (4+4+2 GPUs), no node")
        if minute == SLURM_DONE:
            for job in self.jobs:
                job.done = True
            self.say(minute, "[emulated Slurm] its 3 jobs completed; train-slurm's nodes are idle")
        if minute == BURST_MINUTE:
            self._submit(
                minute, ("team-a/train-a-0", 4, ON_TRAIN), ("team-a/train-b-0", 4, ON_TRAIN), ("team-b/eval-0", 2, None)
            )
        if minute == TRAINED_MINUTE:
            self._finish(minute, [p for p in self.pods if p.running])
            self._submit(minute, ("team-b/eval-1", 4, ON_TRAIN))
            self.pods[-1].loading = True
        if minute == LOADED_MINUTE:
            self._finish(minute, [p for p in self.pods if p.running])
        self._schedule_pods(minute)
        self._schedule_jobs(minute)
        self.running_on[minute] = {w.node for w in (*self.pods, *self.jobs) if w.running and w.node}

    def _submit(self, minute: int, *pods: tuple[str, int, dict[str, str] | None]) -> None:
        """Pods created now (a nodeSelector of None: any GPU node will do), Pending and Unschedulable."""
        for key, gpus, selector in pods:
            namespace, name = key.split("/")
            self.api.add(pod(name, namespace, gpus=gpus, since=self._stamp(minute), node_selector=selector))
            self.pods.append(Work(key, gpus, minute))
        what = ", ".join(f"{key} ({gpus} GPUs)" for key, gpus, _ in pods)
        self.say(minute, f"[emulated Kubernetes API] cluster {CLUSTER}: created {what}, Pending")

    def _finish(self, minute: int, pods: list[Work]) -> None:
        for p in pods:
            namespace, name = p.name.split("/")
            self.api.finish(namespace, name)
            p.done = True
        self.say(minute, f"[emulated Kubernetes API] {', '.join(p.name for p in pods)}: Succeeded")

    def _free(self, iid: str, work: list[Work]) -> int:
        return GPUS_PER_NODE - sum(w.gpus for w in work if w.running and w.node == iid)

    def _place(self, waiting: list[Work], nodes: list[str], everything: list[Work]) -> list[Work]:
        """First fit, largest first, onto InService nodes: what got a node."""
        placed = []
        for w in sorted(waiting, key=lambda w: -w.gpus):
            node = next((n for n in nodes if self._free(n, everything) >= w.gpus), None)
            if node is not None:
                w.node = node
                placed.append(w)
        return placed

    def _schedule_pods(self, minute: int) -> None:
        """[emulated kube-scheduler] bind each waiting pod to a train-gpu node with room, by node name."""
        waiting = [p for p in self.pods if p.node is None and not p.done]
        if not waiting:
            return
        nodes = self.instances(TRAIN_GPU.key)
        for iid in set(nodes) - set(self.dns):
            found = self.clients.ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]
            self.dns[iid] = found["PrivateDnsName"]
        placed = self._place(waiting, nodes, self.pods)
        for p in placed:
            assert p.node is not None
            namespace, name = p.name.split("/")
            self.api.bind(namespace, name, self.dns[p.node], at=self._stamp(minute, 5))
            self.bound_at[p.name] = minute
            if p.loading:
                self.loaded_on = p.node
        if placed:
            what = ", ".join(f"{p.name} -> {self.dns[p.node or '']} ({p.node})" for p in placed)
            loading = " - loading its weights, its GPUs idle" if any(p.loading for p in placed) else ""
            self.say(minute, f"[emulated kube-scheduler] bound {what}{loading}")
        left = [p.name for p in waiting if p.node is None and p.created == minute]
        if left:
            room = f"no node has room in {TRAIN_GPU.key}" if nodes else f"{TRAIN_GPU.key} has no node"
            self.say(minute, f"[emulated kube-scheduler] {', '.join(left)}: Unschedulable ({room})")

    def _schedule_jobs(self, minute: int) -> None:
        """[emulated Slurm] start waiting jobs on train-slurm's nodes; the head node's cron puts the backlog
        the way ami/slurm_pending_gpus.py does, at the simulated minute."""
        waiting = [j for j in self.jobs if j.node is None and not j.done]
        started = self._place(waiting, self.instances(SLURM.key), self.jobs) if waiting else []
        if started:
            self.say(minute, f"[emulated Slurm] {len(started)} job(s) started on train-slurm's nodes")
        pending = sum(j.gpus for j in self.jobs if j.node is None and not j.done)
        datum = {
            "MetricName": "PendingGPUs",
            "Dimensions": [{"Name": "AutoScalingGroupName", "Value": SLURM.name}],
            "Value": float(pending),
            "Unit": "Count",
            "Timestamp": self.start + timedelta(minutes=minute, seconds=5),
        }
        self.clients.cloudwatch.put_metric_data(Namespace="Slurm", MetricData=[datum])
        if pending:
            self.say(minute, f"[emulated Slurm] slurm_pending_gpus: Slurm/PendingGPUs = {pending} on {SLURM.name}")

    def gpu_load(self, iid: str) -> list[tuple[float, float]]:
        """Each GPU's (utilization, memory) on this node now: busy under running work, else idle."""
        loads: list[tuple[float, float]] = []
        for w in (*self.pods, *self.jobs):
            if w.running and w.node == iid:
                loads += [IDLE if w.loading else BUSY] * w.gpus
        return (loads + [IDLE] * GPUS_PER_NODE)[:GPUS_PER_NODE]


# ---- expected outcomes ----

Applied = list[tuple[int, dict[str, Any]]]  # (minute, decision) of the changes made


def verify(
    scenes: DemandScenes, decisions: list[dict[str, Any]], capacity: dict[str, list[int]]
) -> tuple[list[str], list[str]]:
    """(checks, failures) of the three scenes."""
    applied: Applied = []
    for d in decisions:
        if d["outcome"] == "applied" and d["group"] in (TRAIN_GPU.key, SLURM.key):
            at = datetime.fromisoformat(d["at"])
            applied.append((int((at - scenes.start).total_seconds() // 60), d))
    checks: list[str] = []
    failures: list[str] = []
    for ok, text in (_burst(scenes, applied, capacity), _passed_over(scenes, applied), _slurm(applied, capacity)):
        (checks if ok else failures).append(text)
    return checks, failures


def _moves(applied: Applied, group: GroupRef, action: str) -> Applied:
    return [(m, d) for m, d in applied if d["group"] == group.key and d["action"] == action]


def _burst(scenes: DemandScenes, applied: Applied, capacity: dict[str, list[int]]) -> tuple[bool, str]:
    outs, ins = _moves(applied, TRAIN_GPU, "scale-out"), _moves(applied, TRAIN_GPU, "scale-in")
    burst = [name for name in scenes.bound_at if not name.endswith("eval-1")]
    bound = sorted({scenes.bound_at[name] for name in burst})
    end, (last_in, last) = capacity[TRAIN_GPU.key][-1], ins[-1] if ins else (-1, {"reason": ""})
    ok = (
        len(outs) == 1
        and outs[0][0] == BURST_MINUTE
        and bool(BURST_REASON.fullmatch(outs[0][1]["reason"]))
        and len(burst) == 3
        and bound == [BURST_MINUTE + 1]
        and end == 0
        and last_in >= LOADED_MINUTE
        and last["reason"].startswith(f"no pods waiting (cluster {CLUSTER})")
    )
    if not ok:
        return False, f"{TRAIN_GPU.key}: scale-outs {outs}, pods bound at {scenes.bound_at}, scale-ins {ins}, end {end}"
    return True, (
        f"{TRAIN_GPU.key}: 3 unschedulable GPU pods -> one scale-out at minute {outs[0][0]} "
        f"({outs[0][1]['reason']}); [emulated] bound to its new nodes at minute {bound[0]}; back to 0 at minute "
        f"{last_in} once the pods were done"
    )


def _passed_over(scenes: DemandScenes, applied: Applied) -> tuple[bool, str]:
    ins = _moves(applied, TRAIN_GPU, "scale-in")
    disrupted = [(m, v) for m, d in ins for v in d["victims"] if v in scenes.running_on.get(m, set())]
    found = [
        (m, d)
        for m, d in ins
        if TRAINED_MINUTE <= m < LOADED_MINUTE
        and "passed over 1 running work" in d["reason"]
        and scenes.loaded_on not in d["victims"]
        and len(d["victims"]) == 2
    ]
    if disrupted or not found or scenes.loaded_on is None:
        return False, f"{TRAIN_GPU.key}: node running eval-1 {scenes.loaded_on}; scale-ins {ins}; disrupted {disrupted}"
    m = found[0][0]
    return True, (
        f"{TRAIN_GPU.key}: nothing waiting, the scale-in at minute {m} took the 2 idle nodes and passed over "
        f"{scenes.loaded_on} (eval-1 loading its weights, GPUs idle): 'passed over 1 running work'"
    )


def _slurm(applied: Applied, capacity: dict[str, list[int]]) -> tuple[bool, str]:
    outs, ins = _moves(applied, SLURM, "scale-out"), _moves(applied, SLURM, "scale-in")
    end = capacity[SLURM.key][-1]
    ok = (
        len(outs) == 1
        and outs[0][0] == SLURM_SUBMIT
        and outs[0][1]["reason"] == SLURM_REASON
        and end == 0
        and all(m >= SLURM_DONE for m, _ in ins)
    )
    if not ok:
        return False, f"{SLURM.key}: scale-outs {outs}, scale-ins {ins}, end {end}"
    return True, (
        f"{SLURM.key}: Slurm/PendingGPUs 10 -> one scale-out at minute {outs[0][0]} ({SLURM_REASON}); back to 0 at "
        f"minute {ins[-1][0]} after its jobs"
    )
