"""The rehearsal's removal scene (issue 40), on a fresh moto with the real scaler and notifier: capacity only
ever shrinks by named victims, each looked at again right before the call. Cluster ml's Kubernetes API is
the loopback server of rehearsal/kube_api.py [emulated]; nothing schedules there but this script.

- eks:ml/batch-gpu, 2 nodes: one runs a training pod, one is idle. The tick picks the idle one; while the
  scaler is between its pod read and its terminate, [emulated kube-scheduler] binds a CPU-only pod to it.
  The last look (one pod read of the cluster) keeps it: nothing is terminated, and the decision says why.
- That pod ends. The next tick picks the node again; its TerminateInstanceInAutoScalingGroup is throttled
  [emulated: the call answers Throttling once] and the change stays as the group's intent. A pod lands on
  the node. The next tick, a minute later, does not replay the saved victims: it decides again, keeps the
  node (it runs work) and says so.
- eks:ml/serve-gpu, 3 nodes each running a 4-GPU pod, its rule's max lowered to 1: nothing busy is
  removed, no count is lowered for EKS to choose from, and on-call is told once with the numbers, however
  many ticks repeat it.

The clock [emulated]: as in the trust scenes, the scene's clock follows what moto reports (its wall clock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger
from botocore.client import BaseClient
from botocore.exceptions import ClientError

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet_node import schema
from rehearsal import fleet
from rehearsal.kube_api import node, pod
from rehearsal.trust_scene import TrustResult, TrustScenes, run_alone

BATCH = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="batch-gpu")
SERVE = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="serve-gpu")
NAMESPACE = "team-r"
BUSY, IDLE = 90.0, 0.0


def _rule(ref: GroupRef, max_size: int) -> str:
    return (
        f"  - name: {ref.name}\n    cluster: {ref.cluster}\n    kind: eks-nodegroup\n    min: 0\n    max: {max_size}\n"
        "    scale_out_cooldown_s: 0\n    scale_in_cooldown_s: 0\n    demand: {kubernetes: {}}\n"
    )


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


@contextmanager
def on_call(operations: set[str], act: Callable[[], None]) -> Iterator[list[int]]:
    """[emulated] `act` runs once, right before the first of `operations` any client calls (another actor
    moving between two of gpufleet's calls, or AWS answering an error: `act` may raise)."""
    original = BaseClient._make_api_call
    fired: list[int] = []

    def call(client: BaseClient, name: str, params: dict[str, Any]) -> Any:
        if name in operations and not fired:
            fired.append(1)
            act()
        return original(client, name, params)

    BaseClient._make_api_call = call
    try:
        yield fired
    finally:
        BaseClient._make_api_call = original


def throttled() -> None:
    error = {"Error": {"Code": "Throttling", "Message": "Rate exceeded"}}
    raise ClientError(error, "TerminateInstanceInAutoScalingGroup")


class RemovalScene(TrustScenes):
    """The scene; `run()` returns its lines and expected outcomes (TrustScenes' plumbing, its own logs)."""

    def _logger(self, service: str) -> Logger:
        """Its own service names: Powertools keys a Logger's handler on the name, which the trust scenes hold."""
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"removal-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"removal-{service}", logger_handler=handler)
        return self.loggers[service]

    def run(self) -> TrustResult:
        self.setup()
        self.scene = "removal"
        self.t0 = datetime.now(UTC).replace(microsecond=0)
        self.dns: dict[str, str] = {}
        batch = self._group(BATCH, 2)
        serve = self._group(SERVE, 3)
        scaler = self._scaler("removal", _rule(BATCH, 6) + _rule(SERVE, 1))
        self.say(0, f"{BATCH.key}: 2 x g5.12xlarge; {SERVE.key}: 3 x g5.12xlarge, its rule's max lowered to 1")
        b = [iid for iid, _ in self.instances(batch)]
        s = [iid for iid, _ in self.instances(serve)]
        self._run_pod("train-0", b[0], gpus=4)
        for i, iid in enumerate(s):
            self._run_pod(f"serve-{i}", iid, gpus=4)
        self.say(0, f"[emulated Kubernetes API] train-0 (4 GPUs) Running on {b[0]}; serve-0..2 (4 GPUs each) on "
                 f"{', '.join(s)}; {b[1]} runs nothing")  # fmt: skip
        self._inside_the_tick(scaler, batch, b)
        self._throttled_retry(scaler, batch, b)
        self._max_lowered(scaler, serve, s)
        return self.result

    # ---- plumbing ----

    def _group(self, ref: GroupRef, nodes: int) -> str:
        asg = fleet.create_nodegroup(
            self.clients, ref.cluster or "ml", ref.name, min_size=0, max_size=6, desired=nodes,
            tags=fleet.MANAGED_TAG, instance_type="g5.12xlarge",
        )  # fmt: skip
        ids = [iid for iid, _ in self.instances(asg)]
        found = self.clients.ec2.describe_instances(InstanceIds=ids)["Reservations"]
        for r in found:
            for i in r["Instances"]:
                self.dns[i["InstanceId"]] = i["PrivateDnsName"]
                doc = node(i["PrivateDnsName"], gpus=4)
                doc["spec"]["providerID"] = f"aws:///us-east-1a/{i['InstanceId']}"
                doc["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = ref.name
                self.api.add_node(doc)
        return asg

    def _run_pod(self, name: str, iid: str, gpus: int, minute: float = 0) -> None:
        at = _stamp(self.t0 + timedelta(minutes=minute))
        self.api.add(pod(name, NAMESPACE, gpus=gpus, since=at, requests={"cpu": "2"}))
        self.api.bind(NAMESPACE, name, self.dns[iid], at=at)

    def _publish(self, ref: GroupRef, busy: dict[str, bool], first: int, last: int) -> None:
        """[simulated node publisher] each minute's GPU utilization: busy where a GPU pod runs."""
        data = []
        for minute in range(first, last + 1):
            at = self.t0 + timedelta(minutes=minute)
            for iid, on in busy.items():
                for metric in (schema.GPU_UTILIZATION, schema.GPU_MEMORY_USED_PERCENT):
                    for dims in ({schema.DIM_INSTANCE_ID: iid}, ref.metric_dimensions):
                        dimensions = [{"Name": k, "Value": v} for k, v in dims.items()]
                        value = BUSY if on else IDLE
                        data.append({"MetricName": metric.name, "Dimensions": dimensions, "Value": value,
                                     "Timestamp": at})  # fmt: skip
        fleet.put_data(self.clients.cloudwatch, data)

    def _at(self, minute: float) -> datetime:
        return self.t0 + timedelta(minutes=minute)

    # ---- the scenes ----

    def _inside_the_tick(self, scaler: Any, asg: str, b: list[str]) -> None:
        """A pod bound to the victim between the tick's pod read and its terminate: the last look keeps it."""
        self._publish(BATCH, {b[0]: True, b[1]: False}, 0, 2)

        def schedule() -> None:
            self._run_pod("etl-0", b[1], gpus=0, minute=2)
            self.say(2, f"[emulated kube-scheduler] etl-0 (a CPU-only Job pod) bound to {b[1]} while the scaler is "
                     "between its pod read and its terminate")  # fmt: skip

        # The scaler's next AWS call after its pod read: the last look's, or (with none) the terminate itself.
        with on_call({"DescribeAutoScalingInstances", "TerminateInstanceInAutoScalingGroup"}, schedule):
            d = self.tick(scaler, self._at(2) + timedelta(seconds=30), 2, BATCH)
        left = [iid for iid, _ in self.instances(asg)]
        kept = d["outcome"] == "not-needed" and "last look kept 1 victim" in d["reason"] and b[1] in d["reason"]
        self._ok(
            kept and left == sorted(b),
            BATCH,
            f"a CPU-only pod bound to idle {b[1]} inside the tick: the last look kept it, nothing terminated: "
            f"'{d['reason']}'",
            f"{d['action']} {d['outcome']} '{d['reason']}'; nodes left {left}",
        )

    def _throttled_retry(self, scaler: Any, asg: str, b: list[str]) -> None:
        """A throttled terminate leaves the change as the intent; a pod lands; the next tick decides again."""
        self.api.remove(NAMESPACE, "etl-0")
        self.say(3, "[emulated Kubernetes API] etl-0 Succeeded (its own end)")
        self._publish(BATCH, {b[0]: True, b[1]: False}, 3, 5)
        self.say(4, "[emulated] EC2 Auto Scaling answers the next TerminateInstanceInAutoScalingGroup with Throttling")
        with on_call({"TerminateInstanceInAutoScalingGroup"}, throttled):
            first = self.tick(scaler, self._at(4) + timedelta(seconds=30), 4, BATCH)
        self._run_pod("eval-0", b[1], gpus=1, minute=4.75)
        self.say(4.75, f"[emulated kube-scheduler] eval-0 (1 GPU) bound to {b[1]}, the saved change's victim")
        again = self.tick(scaler, self._at(5) + timedelta(seconds=30), 5, BATCH)
        left = [iid for iid, _ in self.instances(asg)]
        ok = (
            first["outcome"] == "failed"
            and "Throttling" in first["detail"]
            and again["detail"].startswith("decided again, not replayed")
            and left == sorted(b)
        )
        self._ok(
            ok,
            BATCH,
            f"its terminate throttled at minute 4, a pod landed on {b[1]}, minute 5's tick decided again instead of "
            f"replaying the saved victim: '{again['detail']}'",
            f"first {first['outcome']} '{first['detail']}'; then {again['outcome']} '{again['detail']}'; left {left}",
        )

    def _max_lowered(self, scaler: Any, asg: str, s: list[str]) -> None:
        """Max 1 under 3 busy nodes: nothing removed, no count lowered, told once over two ticks."""
        self._publish(SERVE, dict.fromkeys(s, True), 0, 7)
        first = self.tick(scaler, self._at(6) + timedelta(seconds=30), 6, SERVE)
        told = self.notify(self._at(6) + timedelta(seconds=40))
        second = self.tick(scaler, self._at(7) + timedelta(seconds=30), 7, SERVE)
        told += self.notify(self._at(7) + timedelta(seconds=40))
        held = [t for t in told if "above max 1" in t.subject + t.message]
        for t in held:
            self.say(7, f"[SNS] {t.subject}")
        ng = self.clients.eks.describe_nodegroup(clusterName="ml", nodegroupName=SERVE.name)["nodegroup"]
        left = [iid for iid, _ in self.instances(asg)]
        ok = (
            first["action"] == second["action"] == "hold"
            and left == sorted(s)
            and ng["scalingConfig"]["desiredSize"] == 3
            and len(held) == 1
        )
        self._ok(
            ok,
            SERVE,
            f"max lowered to 1 under 3 busy nodes: nothing removed, desiredSize left at 3, told once over two "
            f"ticks: '{first['reason']}'",
            f"{first['action']}/{second['action']} '{first['reason']}'; left {left}; desiredSize "
            f"{ng['scalingConfig']['desiredSize']}; SNS notices {[t.subject for t in held]}",
        )


def main() -> int:
    """`python -m rehearsal.removal_scene [OUT]`: this scene alone (`run_alone`)."""
    return run_alone(RemovalScene, "removal")


if __name__ == "__main__":
    raise SystemExit(main())
