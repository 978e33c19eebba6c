"""The rehearsal's busy-mark scene (issue 41): a node of another group tries to get a busy queue worker
removed, on a fresh moto with the real scaler and notifier.

asg:workers has two nodes and reads queue work-jobs. Worker W received a job (in flight) and marked its
node busy with the code `gpufleet-node busy -- COMMAND` runs (gpufleet_node.busy: BusyMark, keyed by its
own aws:userid); its GPUs read idle (it is downloading its inputs). Spare X is idle. Without anything
else, a tick keeps W and removes X.

Node A of asg:batch, with the node role's credentials, tries the finding's two calls: clear W's
protection and protect X. In AWS the node policy allows neither (no autoscaling:SetInstanceProtection;
the IAM evaluator on the template's policy says so, tests/iam/test_busy_marks_iam.py), nor deleting W's
mark (its key is W's aws:userid, not A's). moto enforces no IAM, so the scene makes both protection calls
anyway [emulated: as a principal with Auto Scaling rights would]: the worst case. The tick: W's own mark
protects it again and keeps it, X's protection (no mark explains it) is kept, nothing is removed, and
on-call is told once; the next tick tells nothing new.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from aws_lambda_powertools import Logger

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet_node.busy import BusyMark
from rehearsal import fleet
from rehearsal.trust_scene import Told, TrustResult, TrustScenes, run_alone, runner_userid

WORKERS = GroupRef(kind=GroupKind.ASG, name="workers")
BATCH = GroupRef(kind=GroupKind.ASG, name="batch")
TICKS = (1, 2)  # minutes after the nodes' LaunchTime


class BusyScene(TrustScenes):
    """One scene; `run()` returns its lines and expected outcome."""

    def _logger(self, service: str) -> Logger:
        """Loggers of its own (Powertools keys a handler on the service's name: the trust scenes' are taken)."""
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"busy-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"busy-{service}", logger_handler=handler)
        return self.loggers[service]

    def run(self) -> TrustResult:
        self.setup()
        self.scene = "busy marks"
        queue = self.sqs.create_queue(QueueName="work-jobs")["QueueUrl"]
        fleet.create_asg(self.clients, WORKERS.name, min_size=0, max_size=4, desired=2, tags=fleet.MANAGED_TAG)
        fleet.create_asg(self.clients, BATCH.name, min_size=1, max_size=1, desired=1, tags=fleet.MANAGED_TAG)
        scaler = self._scaler(
            "busy",
            f"  - name: {WORKERS.name}\n    kind: asg\n    min: 0\n    max: 4\n    scale_in_step: 100%\n"
            "    scale_out_cooldown_s: 0\n    scale_in_cooldown_s: 0\n"
            f'    demand: {{sqs: {{queue_url: "{queue}"}}, gpus_per_node: 1}}\n',
        )
        (worker, t0), (spare, _) = self.instances(WORKERS.name)
        [(attacker, _)] = self.instances(BATCH.name)
        self.say(0, f"{WORKERS.key}: worker {worker} and spare {spare}; {BATCH.key}: node {attacker}")
        self.sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"job": "render-1"}))
        self.sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=1, VisibilityTimeout=3600)
        BusyMark(self.clients.dynamodb, runner_userid(worker), worker, WORKERS.name).set(True)
        self.say(0, f"[emulated runner] {worker} received render-1 (in flight) and ran `gpufleet-node busy -- "
                 "render.sh`: its own mark written; downloading inputs, GPUs idle")  # fmt: skip
        autoscaling = self.clients.autoscaling
        for iid, value in ((worker, False), (spare, True)):
            autoscaling.set_instance_protection(
                InstanceIds=[iid], AutoScalingGroupName=WORKERS.name, ProtectedFromScaleIn=value
            )
        self.say(0, f"[emulated attacker] {attacker} ({BATCH.key}) calls SetInstanceProtection: {worker} false, "
                 f"{spare} true. In AWS both are AccessDenied (the node role has no SetInstanceProtection; nor may "
                 f"it delete {worker}'s mark: dynamodb:LeadingKeys is the caller's own aws:userid); moto enforces "
                 "no IAM, so here they land, as if a principal with Auto Scaling rights made them")  # fmt: skip
        told: list[Told] = []
        kept: list[tuple[list[str], dict[str, bool], list[str]]] = []
        for minute in TICKS:
            now = t0 + timedelta(minutes=minute, seconds=30)
            for m in range(5):
                self.idle_gpus([worker, spare], WORKERS, now - timedelta(minutes=m + 1))
            d = self.tick(scaler, now, minute, WORKERS)
            kept.append((d["victims"], self._protection(), sorted(i for i, _ in self.instances(WORKERS.name))))
            for n in self.notify(now + timedelta(seconds=50)):
                if n.incident.startswith("unexplained-protection:"):
                    told.append(n)
                    self.say(minute, f"[SNS] {n.subject}: {n.why}")
        both = sorted([worker, spare])
        expected: tuple[list[str], dict[str, bool], list[str]] = ([], {worker: True, spare: True}, both)
        ok = all(k == expected for k in kept) and len(told) == 1 and spare in told[0].message
        self._ok(
            ok,
            WORKERS,
            f"another group's node cleared busy worker {worker}'s protection and protected spare {spare}: the "
            f"worker's own mark protected it again, nothing was removed in {len(TICKS)} ticks, and on-call was "
            "told once of the protection no mark explains",
            f"ticks kept {kept} (expected {expected}); told {len(told)} time(s)",
        )
        return self.result

    def _protection(self) -> dict[str, bool]:
        [group] = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[WORKERS.name])[
            "AutoScalingGroups"
        ]
        return {i["InstanceId"]: bool(i["ProtectedFromScaleIn"]) for i in group["Instances"]}


if __name__ == "__main__":
    raise SystemExit(run_alone(BusyScene, "busy"))
