"""The rehearsal's self-managed node group scene (issue 30), on a fresh moto (reset after the others) with
the real scaler: asg:gpu-spot is an ASG as eksctl makes an unmanaged node group and Cluster Autoscaler sizes
it, tagged kubernetes.io/cluster/ml=owned with Cluster Autoscaler's node-template tags (a label
workload=train, a taint nvidia.com/gpu=true:NoSchedule, 200Gi of ephemeral storage), launched from a launch
template with a g5.12xlarge (4 GPUs). Its policy rule says `demand: {kubernetes: {}}` and nothing about its
nodes: the scaler finds its cluster from its tags and its node shape from its launch template and tags.

- Three training pods (4 GPUs each, selecting workload=train, tolerating the taint) wait in cluster ml
  [emulated Kubernetes API]: one tick scales it out 0 -> 3.
- The kube-scheduler [emulated] binds each to a new node by its EC2 private DNS name; two finish, one keeps
  loading its weights (every GPU reads idle). Nothing waits: the scale-in takes the two idle nodes and passes
  over the node running a GPU pod.

The clock [emulated]: as in the trust scenes, the scene's clock follows what moto reports (its wall clock).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from rehearsal import fleet
from rehearsal.kube_api import pod
from rehearsal.trust_scene import TrustResult, TrustScenes

SPOT = GroupRef(kind=GroupKind.ASG, name="gpu-spot")
CA = "k8s.io/cluster-autoscaler/node-template/"
TAGS = {
    "kubernetes.io/cluster/ml": "owned",  # as eksctl tags an unmanaged node group's ASG
    "k8s.io/cluster-autoscaler/enabled": "true",
    "k8s.io/cluster-autoscaler/ml": "owned",
    CA + "label/workload": "train",
    CA + "taint/nvidia.com/gpu": "true:NoSchedule",
    CA + "resources/ephemeral-storage": "200Gi",
    **fleet.MANAGED_TAG,
}
PODS = ("train-0", "train-1", "train-2")
TOLERATES = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
RULE = (
    f"  - name: {SPOT.name}  # a self-managed node group: no shape configuration\n    kind: asg\n    min: 0\n"
    "    max: 4\n    scale_out_cooldown_s: 0\n    scale_in_cooldown_s: 0\n    demand: {kubernetes: {}}\n"
)
IDLE_FROM, SCALE_IN = 6, 10  # minutes: the nodes publish idle GPUs from here; the scale-in tick


class SelfManagedScene(TrustScenes):
    """The scene; `run()` returns its lines and expected outcomes (TrustScenes' plumbing, its own logs)."""

    def _logger(self, service: str) -> Logger:
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"selfmanaged-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"selfmanaged-{service}", logger_handler=handler)
        return self.loggers[service]

    def run(self) -> TrustResult:
        self.setup()
        self.scene = "self-managed"
        fleet.create_asg(self.clients, SPOT.name, min_size=0, max_size=4, desired=0, tags=TAGS)
        scaler = self._scaler("selfmanaged", RULE)
        now = datetime.now(UTC).replace(microsecond=0)
        since = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        for name in PODS:
            self.api.add(pod(name, "team-c", gpus=4, since=since, node_selector={"workload": "train"},
                             tolerations=TOLERATES))  # fmt: skip
        self.say(0, f"{SPOT.key}: 0 nodes, an ASG tagged kubernetes.io/cluster/ml=owned and with Cluster Autoscaler's "
                 "node-template tags (label workload=train, taint nvidia.com/gpu=true:NoSchedule, ephemeral-storage "
                 "200Gi), launch template g5.12xlarge; its rule: demand {kubernetes: {}}, no shape")  # fmt: skip
        self.say(0, f"[emulated Kubernetes API] cluster ml: {len(PODS)} pods of team-c (4 GPUs, workload=train, "
                 "tolerating nvidia.com/gpu) Pending")  # fmt: skip
        out = self.tick(scaler, now, 0, SPOT)
        nodes = [iid for iid, _ in self.instances(SPOT.name)]
        busy, idle = self._schedule(nodes, now)
        for minute in range(IDLE_FROM, SCALE_IN + 1):
            self.idle_gpus(nodes, SPOT, now + timedelta(minutes=minute))
        cut = self.tick(scaler, now + timedelta(minutes=SCALE_IN, seconds=30), SCALE_IN, SPOT)
        left = [iid for iid, _ in self.instances(SPOT.name)]
        for name in PODS:
            self.api.remove("team-c", name)
        self._verify(out, cut, busy, idle, left)
        return self.result

    def _schedule(self, nodes: list[str], now: datetime) -> tuple[str | None, list[str]]:
        """[emulated kube-scheduler] each pod to a new node by its private DNS name; two finish, one keeps
        loading its weights. Returns (the node still running a pod, the idle ones)."""
        if len(nodes) != len(PODS):
            return None, []
        found = self.clients.ec2.describe_instances(InstanceIds=nodes)["Reservations"]
        dns = {i["InstanceId"]: i["PrivateDnsName"] for r in found for i in r["Instances"]}
        for name, iid in zip(PODS, nodes, strict=True):
            self.api.bind("team-c", name, dns[iid], at=(now + timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ"))
        self.say(3, "[emulated kube-scheduler] bound " + ", ".join(f"{n} -> {dns[i]} ({i})" for n, i in zip(PODS, nodes,
                 strict=True)))  # fmt: skip
        for name in PODS[:2]:
            self.api.finish("team-c", name)
        self.say(IDLE_FROM, f"[emulated Kubernetes API] {', '.join(PODS[:2])}: Succeeded; {PODS[2]} on {nodes[2]} is "
                 "loading its weights (its GPUs read idle)")  # fmt: skip
        return nodes[2], nodes[:2]

    def _verify(
        self, out: dict[str, Any], cut: dict[str, Any], busy: str | None, idle: list[str], left: list[str]
    ) -> None:
        scaled = out["action"] == "scale-out" and out["outcome"] == "applied" and out["desired"] == len(PODS)
        passed = (
            cut["action"] == "scale-in"
            and cut["outcome"] == "applied"
            and sorted(cut["victims"]) == sorted(idle)
            and busy in left
            and "passed over 1 running work" in cut["reason"]
        )
        self._ok(
            scaled and passed,
            SPOT,
            f"self-managed, tagged for Cluster Autoscaler, no gpufleet shape configuration: {len(PODS)} pending pods "
            f"-> scale-out {out['current']} -> {out['desired']} ({out['reason']}); at minute {SCALE_IN} the scale-in "
            f"took the {len(idle)} idle nodes and passed over {busy}, which runs a GPU pod: '{cut['reason']}'",
            f"scale-out {out['action']} {out['outcome']} {out['current']} -> {out['desired']} ({out['reason']}); "
            f"scale-in {cut['action']} {cut['outcome']} victims {cut['victims']} ({cut['reason']}); busy {busy}, "
            f"left {left}",
        )
