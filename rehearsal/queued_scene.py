"""The rehearsal's queued-jobs scene (issue 32), on a fresh moto with the real scaler and notifier: jobs that
wait before they are pods. Cluster ml's Kubernetes API is the loopback server of rehearsal/kube_api.py
[emulated]: Kueue's and Volcano's objects are served in their CRDs' own JSON (rehearsal/kueue_objects.py,
rehearsal/volcano_objects.py), and nothing admits, schedules or creates pods there but this script.

- eks:ml/train-gpu (p4d.24xlarge, 8 GPUs, max 6) is Kueue's flavor `train` (its node group label). A
  Workload of 4 x 8 GPUs waits in ClusterQueue team-a with quota left, no pod exists: one tick scales the
  group 0 -> 4 in one change. A Workload of ClusterQueue team-b, whose quota is all in use, is told once,
  not counted (more nodes would not admit it).
- eks:ml/gang-gpu (max 3) is where a Volcano Job's pods go (its nodeSelector). Its PodGroup (minMember 4,
  4 x 8 GPUs) is Pending: the gang needs 4 nodes and the group may have 3, so nothing is launched, and
  it is told with the numbers.
- Kueue admits the Workload; its Job creates 4 pods, Pending while the nodes boot. The next tick counts
  them once, as pods (the admitted Workload is not counted again): no new node.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from rehearsal import fleet
from rehearsal import kueue_objects as kq
from rehearsal import volcano_objects as vc
from rehearsal.kube_api import pod
from rehearsal.trust_scene import Told, TrustResult, TrustScenes, run_alone

TRAIN = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="train-gpu")
GANG = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="gang-gpu")
INSTANCE_TYPE = "p4d.24xlarge"
NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
GPU = "nvidia.com/gpu"
RULES = "".join(
    f"  - name: {name}\n    cluster: ml\n    kind: eks-nodegroup\n    min: 0\n    max: {top}\n"
    "    scale_out_cooldown_s: 0\n    demand: {kubernetes: {}}\n"
    for name, top in ((TRAIN.name, 6), (GANG.name, 3))
)
WORKLOAD_JOB, PODS = "llm-pretrain", 4
ADMIT_AT = 2  # minutes


class QueuedScene(TrustScenes):
    """The scene; `run()` returns its lines and expected outcomes (TrustScenes' plumbing, its own logs)."""

    def _logger(self, service: str) -> Logger:
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"queued-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"queued-{service}", logger_handler=handler)
        return self.loggers[service]

    def run(self) -> TrustResult:
        self.setup()
        self.scene = "queued jobs"
        for ref, top in ((TRAIN, 6), (GANG, 3)):
            fleet.create_nodegroup(
                self.clients, "ml", ref.name, min_size=0, max_size=top, desired=0,
                tags=fleet.MANAGED_TAG, instance_type=INSTANCE_TYPE,
            )  # fmt: skip
        scaler = self._scaler("queued", RULES)
        self.t0 = datetime.now(UTC).replace(microsecond=0)
        self._kueue()
        self._volcano()
        first = self._tick(scaler, 0)
        told = self.notify(self.t0 + timedelta(seconds=50))
        admitted = self._admit(scaler)
        told += self.notify(self.t0 + timedelta(minutes=ADMIT_AT, seconds=50))
        for n in told:
            self.say(ADMIT_AT, f"[SNS] {n.subject}: {n.why}")
        self._verify(first, admitted, told)
        return self.result

    def _kueue(self) -> None:
        api = self.api
        api.install(kq.API_VERSION, *kq.PLURALS)
        api.add_object("resourceflavors", kq.resource_flavor("train", {NODEGROUP_LABEL: TRAIN.name}))
        quota: dict[str, dict[str, str | int]] = {"train": {GPU: 64, "cpu": 2000, "memory": "20Ti"}}
        api.add_object("clusterqueues", kq.cluster_queue("team-a", quota))
        full = {"train": {GPU: 16}}
        small: dict[str, dict[str, str | int]] = {"train": {GPU: 16, "cpu": 1000, "memory": "10Ti"}}
        api.add_object("clusterqueues", kq.cluster_queue("team-b", small, used=full))
        api.add_object(
            "localqueues", kq.local_queue("ml", "team-a", "team-a"), kq.local_queue("ml", "team-b", "team-b")
        )
        big = kq.pod_set(count=PODS, gpus=8, cpu="90", memory="900Gi")
        api.add_object("workloads", kq.workload("ml", WORKLOAD_JOB, "team-a", [big]))
        api.add_object("workloads", kq.workload("ml", "eval-sweep", "team-b", [kq.pod_set(count=2, gpus=8)]))
        self.say(0, f"[emulated Kubernetes API, Kueue {kq.API_VERSION}] Workload ml/job-{WORKLOAD_JOB}: {PODS} x 8 "
                 "GPUs, QuotaReserved False (ClusterQueue team-a, 64 GPUs, none used; flavor train = node group "
                 f"{TRAIN.name}); its Job suspended, no pod exists. Workload ml/job-eval-sweep: 2 x 8 GPUs in "
                 "ClusterQueue team-b, 16 of 16 GPUs in use")  # fmt: skip

    def _volcano(self) -> None:
        api = self.api
        api.install(vc.SCHEDULING, "podgroups")
        api.install(vc.BATCH, "jobs")
        job = vc.vcjob(
            "allreduce", "ml", tasks=[vc.task("worker", PODS, gpus=8, node_selector={NODEGROUP_LABEL: GANG.name})]
        )
        api.add_object("jobs", job)
        api.add_object("podgroups", vc.podgroup_of(job))
        self.say(0, f"[emulated Kubernetes API, Volcano {vc.SCHEDULING}] PodGroup ml/allreduce Pending, "
                 f"minMember {PODS} (Job allreduce: {PODS} workers x 8 GPUs on node group {GANG.name}, max 3); "
                 "no pod exists")  # fmt: skip

    def _tick(self, scaler: Any, minute: int) -> dict[str, dict[str, Any]]:
        """One reconcile tick; both groups' decisions, shown."""
        now = self.t0 + timedelta(minutes=minute, seconds=30)
        event = {
            "gpufleet": "reconcile",
            "execution_id": f"queued-{minute}",
            "scheduled_time": f"{now:%Y-%m-%dT%H:%M:%SZ}",
        }
        out: dict[str, Any] = scaler.handle(event, now=now)
        found = {d["group"]: d for r in out["results"] for d in r["decisions"] if d["group"] in (TRAIN.key, GANG.key)}
        for d in found.values():
            self.result.decisions.append(d)
            self.say(minute, f"tick: {d['group']} {d['action']} {d['outcome']} {d['current']} -> {d['desired']}: "
                     f"{d['reason']}")  # fmt: skip
        return found

    def _admit(self, scaler: Any) -> dict[str, dict[str, Any]]:
        """Kueue admits the Workload; its Job's 4 pods wait for the booting nodes."""
        self.api.add_object(
            "workloads",
            kq.workload("ml", WORKLOAD_JOB, "team-a", [kq.pod_set(count=PODS, gpus=8, cpu="90", memory="900Gi")],
                        state="admitted", cluster_queue="team-a", flavor="train"),
        )  # fmt: skip
        since = f"{self.t0 + timedelta(minutes=ADMIT_AT):%Y-%m-%dT%H:%M:%SZ}"
        for i in range(PODS):
            self.api.add(pod(f"{WORKLOAD_JOB}-{i}", "ml", gpus=8, since=since, owner="Job",
                             node_selector={NODEGROUP_LABEL: TRAIN.name}))  # fmt: skip
        self.say(ADMIT_AT, f"[emulated Kubernetes API] Kueue admits ml/job-{WORKLOAD_JOB} (Admitted True); its Job "
                 f"creates {PODS} pods, Pending Unschedulable while the nodes boot")  # fmt: skip
        return self._tick(scaler, ADMIT_AT)

    def _verify(self, first: dict[str, dict[str, Any]], admitted: dict[str, dict[str, Any]], told: list[Told]) -> None:
        train, gang = first[TRAIN.key], first[GANG.key]
        eks = self.clients.eks
        groups = [eks.describe_nodegroup(clusterName="ml", nodegroupName=r.name)["nodegroup"] for r in (TRAIN, GANG)]
        desired = [int(n["scalingConfig"]["desiredSize"]) for n in groups]
        self._ok(
            (train["action"], train["outcome"], train["current"], train["desired"]) == ("scale-out", "applied", 0, 4),
            TRAIN,
            f"a pending Workload of {PODS} x 8 GPUs, no pod yet: 0 -> 4 in one change: '{train['reason']}'",
            f"{train['action']} {train['outcome']} {train['current']} -> {train['desired']}: {train['reason']}",
        )
        gang_told = [n for n in told if "fit no group" in n.subject and "volcano:ml/allreduce" in n.message]
        self._ok(
            gang["desired"] == 0 and desired[1] == 0 and "its max is 3" in gang["reason"] and len(gang_told) == 1,
            GANG,
            f"a Volcano gang of {PODS} at max 3 launched nothing, told why: '{gang_told[0].why if gang_told else ''}'",
            f"{gang['action']} -> {gang['desired']} (node group {desired[1]}): {gang['reason']}; told {len(gang_told)}",
        )
        quota = list({n.subject: n for n in told if "team-b" in n.message and "quota" in n.message}.values())
        again = admitted[TRAIN.key]
        self._ok(
            again["action"] == "hold" and again["desired"] == 4 and desired[0] == 4 and len(quota) == 1,
            TRAIN,
            f"admitted, its {PODS} pods counted once (not with the Workload again): no new node: '{again['reason']}'; "
            f"the Workload waiting for quota told once: '{quota[0].why if quota else ''}'",
            f"{again['action']} -> {again['desired']}: {again['reason']}; quota notices {len(quota)}",
        )


def main() -> int:
    """`python -m rehearsal.queued_scene [OUT]`: this scene alone (`run_alone`)."""
    return run_alone(QueuedScene, "queued")


if __name__ == "__main__":
    raise SystemExit(main())
