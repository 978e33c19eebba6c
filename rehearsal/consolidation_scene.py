"""The rehearsal's consolidation-by-attrition scene (issue 31), on a fresh moto (reset after the others) with
the real scaler: eks:ml/serve-gpu is an EKS managed node group of 4 nodes with 8 GPUs each, its rule
`consolidate: attrition` and `demand: {kubernetes: {}}`. Cluster ml's Kubernetes API is the loopback server
of rehearsal/kube_api.py [emulated]: the pods and nodes are in the API's own JSON, the cordons are real JSON
merge PATCHes to it, and nothing schedules or evicts there but this script.

- The pods are spread one or two a node (as kube-scheduler's default LeastAllocated scoring spreads them):
  no node is empty, so no node can be removed. One tick drains the emptiest surplus nodes: cordon
  (`spec.unschedulable: true`) plus the `gpufleet.io/drained` annotation, each recorded by the API.
- The pod on the emptiest drained node ends; once the node has been idle a few minutes, the next tick
  removes it (TerminateInstanceInAutoScalingGroup on the node group's ASG). Nothing is evicted.
- A burst of pods waits that the open nodes cannot take but a drained one can: the next tick uncordons it
  (unschedulable false, annotation removed) and launches nothing.

The clock [emulated]: as in the trust scenes, the scene's clock follows what moto reports (its wall clock).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from aws_lambda_powertools import Logger

from gpufleet.domain.defaults import DRAIN_ANNOTATION
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet_node import schema
from rehearsal import fleet
from rehearsal.kube_api import node, pod
from rehearsal.trust_scene import TrustResult, TrustScenes, run_alone

SERVE = GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="serve-gpu")
INSTANCE_TYPE, GPUS = "p4d.24xlarge", 8
NAMESPACE = "team-s"
# Pods by node index: (name, GPUs). 16 GPUs of work on 4 nodes of 8: packed, 2 nodes would hold it.
SPREAD = {0: (("serve-a", 4), ("serve-b", 3)), 1: (("serve-c", 6),), 2: (("serve-d", 2),), 3: (("serve-e", 1),)}
HELD, OPEN_FREE = 16, 3  # GPUs held at first; GPUs free on the two nodes kept open (1 + 2)
BURST = (("burst-0", 3), ("burst-1", 3))  # no open node can take one; the drained node with 6 free takes both
RULE = (
    f"  - name: {SERVE.name}  # consolidation by attrition\n    cluster: {SERVE.cluster}\n    kind: eks-nodegroup\n"
    "    min: 0\n    max: 6\n    scale_out_cooldown_s: 0\n    scale_in_cooldown_s: 0\n    consolidate: attrition\n"
    "    demand: {kubernetes: {}}\n"
)
DRAIN_AT, ENDS_AT, REMOVE_AT, BURST_AT, REOPEN_AT = 2, 3, 9, 10, 11  # minutes
BUSY, IDLE = 90.0, 0.0


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


class ConsolidationScene(TrustScenes):
    """The scene; `run()` returns its lines and expected outcomes (TrustScenes' plumbing, its own logs)."""

    def _logger(self, service: str) -> Logger:
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"consolidation-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"consolidation-{service}", logger_handler=handler)
        return self.loggers[service]

    def run(self) -> TrustResult:
        self.setup()
        self.scene = "consolidation"
        asg = fleet.create_nodegroup(
            self.clients, SERVE.cluster or "ml", SERVE.name, min_size=0, max_size=6, desired=4,
            tags=fleet.MANAGED_TAG, instance_type=INSTANCE_TYPE,
        )  # fmt: skip
        scaler = self._scaler("consolidation", RULE)
        ids = [iid for iid, _ in self.instances(asg)]
        found = self.clients.ec2.describe_instances(InstanceIds=ids)["Reservations"]
        self.dns = {i["InstanceId"]: i["PrivateDnsName"] for r in found for i in r["Instances"]}
        self.t0 = datetime.now(UTC).replace(microsecond=0)
        self.running: dict[str, tuple[str, int]] = {}  # pod -> (instance, GPUs)
        self._nodes_and_pods(ids)
        self._publish(ids, 0, DRAIN_AT)
        drain = self.tick(scaler, self.t0 + timedelta(minutes=DRAIN_AT, seconds=30), DRAIN_AT, SERVE)
        cordons = self._patches_since(0)
        self._show_patches(DRAIN_AT, cordons)
        removed = self._attrition(scaler, asg, ids, drain)
        reopen, reopens = self._burst(scaler, asg, ids, drain)
        self._verify(ids, drain, cordons, removed, reopen, reopens)
        for name in [*self.running, *(n for n, _ in BURST)]:
            self.api.remove(NAMESPACE, name)
        return self.result

    def _nodes_and_pods(self, ids: list[str]) -> None:
        """The 4 nodes as the kubelet registers them (name: the EC2 private DNS name, providerID: the
        instance), and the pods kube-scheduler spread over them, Running."""
        for iid in ids:
            doc = node(self.dns[iid], gpus=GPUS)
            doc["spec"]["providerID"] = f"aws:///us-east-1a/{iid}"
            doc["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = SERVE.name
            self.api.add_node(doc)
        placed = []
        for index, pods in SPREAD.items():
            for name, gpus in pods:
                self.api.add(pod(name, NAMESPACE, gpus=gpus, since=_stamp(self.t0), owner="ReplicaSet"))
                self.api.bind(NAMESPACE, name, self.dns[ids[index]], at=_stamp(self.t0))
                self.running[name] = (ids[index], gpus)
                placed.append(f"{name} ({gpus}) -> {ids[index]}")
        self.say(0, f"{SERVE.key}: 4 x {INSTANCE_TYPE} ({GPUS} GPUs) InService; rule: consolidate: attrition, "
                 "demand {kubernetes: {}}")  # fmt: skip
        self.say(0, f"[emulated Kubernetes API] cluster ml: pods spread one or two a node, none empty ({HELD} of 32 "
                 f"GPUs held): {', '.join(placed)}")  # fmt: skip

    def _publish(self, ids: list[str], first: int, last: int) -> None:
        """[simulated node publisher] each minute's GPU utilization: busy where a pod runs, idle elsewhere."""
        data = []
        for minute in range(first, last + 1):
            at = self.t0 + timedelta(minutes=minute)
            holding = {iid for iid, _ in self.running.values()}
            for iid in ids:
                value = BUSY if iid in holding else IDLE
                for metric in (schema.GPU_UTILIZATION, schema.GPU_MEMORY_USED_PERCENT):
                    for dims in ({schema.DIM_INSTANCE_ID: iid}, SERVE.metric_dimensions):
                        dimensions = [{"Name": k, "Value": v} for k, v in dims.items()]
                        data.append({"MetricName": metric.name, "Dimensions": dimensions, "Value": value,
                                     "Timestamp": at})  # fmt: skip
        fleet.put_data(self.clients.cloudwatch, data)

    def _patches_since(self, start: int) -> list[dict[str, Any]]:
        return [p for p in self.api.patches[start:] if p["name"] in self.dns.values()]

    def _show_patches(self, minute: int, patches: list[dict[str, Any]]) -> None:
        by_name = {v: k for k, v in self.dns.items()}
        for p in patches:
            body = p["body"]
            spec = body.get("spec", {})
            note = (body.get("metadata") or {}).get("annotations", {}).get(DRAIN_ANNOTATION, "?")
            annotation = "removed" if note is None else f"set ({note})"
            cordon = str(spec.get("unschedulable")).lower()
            self.say(minute, f"[emulated Kubernetes API] PATCH /api/v1/nodes/{p['name']} ({by_name.get(p['name'])}) "
                     f"{p['content_type']} -> {p['code']}: spec.unschedulable {cordon}, {DRAIN_ANNOTATION} "
                     f"{annotation}")  # fmt: skip

    def _attrition(self, scaler: Any, asg: str, ids: list[str], drain: dict[str, Any]) -> dict[str, Any]:
        """The pod on the emptiest drained node ends; after its idle window the node is removed."""
        drained = list(drain.get("drain") or [])
        ending = [name for name, (iid, _) in self.running.items() if drained and iid == drained[0]]
        for name in ending:
            self.api.finish(NAMESPACE, name)
            self.api.remove(NAMESPACE, name)
            del self.running[name]
        where = drained[0] if drained else "-"
        self.say(ENDS_AT, f"[emulated Kubernetes API] {', '.join(ending) or 'no pod'} on {where} Succeeded "
                 "(its own end, nothing evicted); the node is now empty")  # fmt: skip
        self._publish(ids, DRAIN_AT + 1, REMOVE_AT)
        out = self.tick(scaler, self.t0 + timedelta(minutes=REMOVE_AT, seconds=30), REMOVE_AT, SERVE)
        left = [iid for iid, _ in self.instances(asg)]
        self.say(REMOVE_AT, f"{SERVE.key} nodes now: {', '.join(left)}; pods still running: "
                 f"{', '.join(sorted(self.running))}")  # fmt: skip
        return out

    def _burst(
        self, scaler: Any, asg: str, ids: list[str], drain: dict[str, Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Pods that the open nodes cannot take but a drained node can: it is opened, nothing launched."""
        since = _stamp(self.t0 + timedelta(minutes=BURST_AT))
        for name, gpus in BURST:
            self.api.add(pod(name, NAMESPACE, gpus=gpus, since=since, owner="ReplicaSet"))
        self.say(BURST_AT, f"[emulated Kubernetes API] cluster ml: {', '.join(f'{n} ({g} GPUs)' for n, g in BURST)} "
                 f"Pending, Unschedulable (the open nodes have {OPEN_FREE} GPUs free, 1 and 2)")  # fmt: skip
        alive = [iid for iid, _ in self.instances(asg)]
        self._publish(alive, REMOVE_AT + 1, REOPEN_AT)
        start = len(self.api.patches)
        out = self.tick(scaler, self.t0 + timedelta(minutes=REOPEN_AT, seconds=30), REOPEN_AT, SERVE)
        patches = self._patches_since(start)
        self._show_patches(REOPEN_AT, patches)
        return out, patches

    def _verify(
        self,
        ids: list[str],
        drain: dict[str, Any],
        cordons: list[dict[str, Any]],
        removed: dict[str, Any],
        reopen: dict[str, Any],
        reopens: list[dict[str, Any]],
    ) -> None:
        emptiest = [ids[3], ids[2]]  # 1 GPU held, then 2
        names = [self.dns[iid] for iid in emptiest]
        cordoned = [p["name"] for p in cordons if _marked(p["body"], True) and p["code"] == 200]
        drained = drain["action"] != "scale-in" and list(drain["drain"]) == emptiest and cordoned == names
        _, listed = self.api.list_pods(NAMESPACE, {})
        running = sorted(p["metadata"]["name"] for p in listed["items"] if p["status"]["phase"] == "Running")
        kept = sorted(n for n, _ in (*SPREAD[0], *SPREAD[1], *SPREAD[2]))
        gone = removed["action"] == "scale-in" and removed["outcome"] == "applied" and removed["victims"] == [ids[3]]
        doc = self.api.node_doc(names[1])
        opened = (
            reopen["action"] != "scale-out"
            and reopen["desired"] == reopen["current"]
            and list(reopen["undrain"]) == [ids[2]]
            and [p["name"] for p in reopens if _marked(p["body"], False) and p["code"] == 200] == [names[1]]
            and doc["spec"].get("unschedulable") is False
            and DRAIN_ANNOTATION not in doc["metadata"].get("annotations", {})
        )
        self._ok(
            drained,
            SERVE,
            f"4 nodes, none empty, {HELD} GPUs of work: the tick at minute {DRAIN_AT} cordoned the 2 emptiest "
            f"({', '.join(emptiest)}) with {DRAIN_ANNOTATION}, no scale-in: '{drain['reason']}'",
            f"drain {drain['action']} {drain['drain']} (expected {emptiest}); cordon PATCHes {cordons}",
        )
        self._ok(
            gone and running == kept,
            SERVE,
            f"its pod ended at minute {ENDS_AT}; at minute {REMOVE_AT} the scale-in removed {ids[3]} only, nothing "
            f"evicted ({', '.join(running)} still Running)",
            f"scale-in {removed['action']} {removed['outcome']} {removed['victims']}; Running {running}",
        )
        self._ok(
            opened,
            SERVE,
            f"{len(BURST)} pods of 3 GPUs waiting, no open node with room: minute {REOPEN_AT}'s tick uncordoned "
            f"{ids[2]} (unschedulable false, {DRAIN_ANNOTATION} removed) and launched nothing: '{reopen['reason']}'",
            f"{reopen['action']} {reopen['current']} -> {reopen['desired']}, undrain {reopen['undrain']}; "
            f"PATCHes {reopens}; node {doc['spec']}",
        )


def _marked(body: dict[str, Any], on: bool) -> bool:
    """A cordon PATCH with gpufleet's note (on), or an uncordon taking it off (not on)."""
    note = (body.get("metadata") or {}).get("annotations", {}).get(DRAIN_ANNOTATION, "absent")
    return bool(body.get("spec", {}).get("unschedulable") is on and (note is None) is (not on) and note != "absent")


def main() -> int:
    """`python -m rehearsal.consolidation_scene [OUT]`: this scene alone (`run_alone`)."""
    return run_alone(ConsolidationScene, "consolidation")


if __name__ == "__main__":
    raise SystemExit(main())
