"""The rehearsal's "one compromised node" scene (issue 29), on a fresh moto (reset after the issue-28
scenes) with the real publisher, scaler, OOM guard, notifier and `gpufleet report`. Group asg:infer
(2 x g5.12xlarge, truly 5 % busy, `replace_unhealthy: true`) is the victim; the forger is the one node of
asg:train, writing with its own credentials what the node role lets any node write:

- (1) a flood on infer's group GPUUtilization series (Values=[100], Counts 50,000 in all): the group Average
  reads ~99 %, but the series holds more samples than infer's members can publish, so the tick decides on
  the members' own series (5 %) and holds; on-call is told (incident forged-series:asg:infer).
- (2) "GPU 1 lost" under an infer node's InstanceId (the real publisher run with the victim's identity and
  the forger's credentials), and a GPUFaultReported in the forger's own namespace naming the victim: the
  guard does not replace, and tells once over two runs. Then the victim's own publisher (its own
  aws:userid) reports the fault in GPUFleet/Node/<its userid>: replaced.
- (3) a usage record for team `finance` holding a GPU for 1e9 s under the victim's node id, written to
  the forger's log stream: `gpufleet report` on the day lists it under FLAGGED RECORDS, the totals as
  before it.

[emulated] moto does not enforce IAM: every client here holds the same fake keys, so who writes is what
the scene says. What the node role allows and denies (the GPUFleet namespace with no dimension
condition, only its own GPUFleet/Node/${aws:userid}, any stream of the usage log group) is proven on the
deployed policy by tests/iam/test_node_policy.py and tests/integration/test_report_moto.py.

Clocks: (1) and (2) run from what moto reports as infer's LaunchTime (the scaler's GPU-ready probe
measures a node's age against `now`, as in rehearsal/trust_scene.py); (3) on the rehearsal's day
(2026-11-23), which moto's CloudWatch Logs clock follows (GPUFLEET_MOTO_LOGS_NOW, set by __main__).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet.guard.core import forgery_reason
from gpufleet.runtime import build_guard, build_notifier, build_scaler
from gpufleet_node import schema
from gpufleet_node.identity import Identity
from gpufleet_node.nvml import SimulatedBackend
from gpufleet_node.publisher import Publisher, simulate
from gpufleet_node.sender import Sender
from gpufleet_tools.invoke import LocalLambdaContext
from rehearsal import fleet
from rehearsal.kube_api import KubeApi
from rehearsal.scenario import START
from rehearsal.trust_scene import Told, TrustResult, TrustScenes
from rehearsal.usage_scene import UsageScene

VICTIM = GroupRef(kind=GroupKind.ASG, name="infer")
FORGER = GroupRef(kind=GroupKind.ASG, name="train")
GPUS = 4  # g5.12xlarge (fleet.INSTANCE_TYPE)
BUSY = 5.0  # infer's true GPU utilization: inside its band
FLOOD = 50_000  # the forged samples of 100 %, spread over the lookback's minutes
LOOKBACK_MIN = 3
EVERY_S = 10  # the publishers' simulated sampling (the bound is per second: fewer samples stay under it)
USAGE_MINUTES = 10  # two usage windows per node on the day
DAY = START.replace(hour=0)
FINANCE = {"kind": "pod", "namespace": "finance", "pod": "ledger-0", "container": "main"}
HELD_S = 1e9  # said "1e9" in the lines
PACED_MIN = 4  # the confirmation posts once the incident's pacing allows (its first post + 5 min)
POLICY = f"""version: 1
metric_lookback_s: {LOOKBACK_MIN * 60}
discovery: {{enabled: false}}
groups:
  - name: {VICTIM.name}
    kind: asg
    min: 1
    max: 8
    target: {{low: 1, high: 80}}
    scale_out_step: 2
    scale_out_cooldown_s: 0
guard:
  health: {{replace_unhealthy: true, max_replacements_per_hour: 1, min_healthy_percent: 50}}
"""
IAM_PROOF = "tests/iam/test_node_policy.py"


def caller(instance_id: str) -> str:
    """An instance profile's aws:userid as sts:GetCallerIdentity gives it on the node."""
    return f"AROAREHEARSAL:{instance_id}"


class ForgedScene(TrustScenes):
    """The three forgeries, one after the other; `run()` returns their lines and expected outcomes."""

    def __init__(self, out: Path, kube: tuple[KubeApi, str], token: str) -> None:
        super().__init__(out, kube, token)
        self.publishers: dict[str, Publisher] = {}
        self.minute = 0

    def _logger(self, service: str) -> Logger:
        if service not in self.loggers:
            handler = logging.FileHandler(self.out / f"forged-{service}.log", mode="w")
            self.loggers[service] = Logger(service=f"forged-{service}", logger_handler=handler)
        return self.loggers[service]

    def run(self) -> TrustResult:
        self.setup()
        path = self.out / "policy-forged.yaml"
        path.write_text(POLICY)
        env = self._env(path)
        emf = Metrics(namespace="GPUFleet/Controller", service="scaler")
        self.scaler, idempotency = build_scaler(self._logger("scaler"), emf, env=env)
        idempotency.register_lambda_context(LocalLambdaContext("scaler", timeout_s=900))  # type: ignore[arg-type]
        self.guard = build_guard(self._logger("oom_guard"), Metrics(service="oom_guard"), env=env)
        self.notifier = build_notifier(self._logger("notifier"), Metrics(service="notifier"), env=env)
        fleet.create_asg(self.clients, VICTIM.name, min_size=1, max_size=8, desired=2, tags=fleet.MANAGED_TAG)
        fleet.create_asg(self.clients, FORGER.name, min_size=0, max_size=2, desired=1)
        nodes = self.instances(VICTIM.name)
        self.t0 = nodes[0][1]  # the scene's clock starts at infer's LaunchTime as moto reports it
        self.ids = [iid for iid, _ in nodes]
        [(self.forger, _)] = self.instances(FORGER.name)
        for iid in self.ids:
            self.publishers[iid] = self._publisher(iid, caller(iid))
        self.flood()
        self.forged_fault()
        self.forged_record()
        return self.result

    # ---- plumbing ----

    def _publisher(self, iid: str, credentials: str | None) -> Publisher:
        """The real publisher (detail adaptive, the deployed default) for an infer node's identity, sending
        with `credentials`' aws:userid (None: none that could write an own namespace)."""
        backend = SimulatedBackend(gpus=GPUS, memory_total_mib=23028.0)
        for g in range(GPUS):
            backend.set(g, utilization=BUSY, memory_percent=20)
        identity = Identity(iid, "us-east-1", fleet.INSTANCE_TYPE, asg_name=VICTIM.name)
        pub = Publisher(backend, identity, Sender(self.clients.cloudwatch), detail="adaptive", caller=credentials)
        pub.start(xid_thread=False)
        return pub

    def publish(self, minute: int, publishers: list[Publisher]) -> None:
        """[simulated node] one minute of each publisher, sampled every EVERY_S, its windows closed."""
        start = self.t0 + timedelta(minutes=minute)
        for pub in publishers:
            simulate(pub, start, 60, every_s=EVERY_S)
            pub.close_windows(start + timedelta(seconds=59))

    def honest_until(self, minute: int) -> None:
        """infer's own publishers, up to (not including) `minute` of the scene's clock."""
        while self.minute < minute:
            self.publish(self.minute, list(self.publishers.values()))
            self.minute += 1

    def deliver(self, at: datetime) -> list[Told]:
        """What the SNS topic delivered of what was queued by `at`: the notifier takes the queue 10 s later
        and sends once its 30 s group wait is over (its sweep 40 s after)."""
        return self.notify(at + timedelta(seconds=10)) + self.notify(at + timedelta(seconds=50))

    def group_average(self, now: datetime) -> float:
        """What the group series' Average says over the lookback (what the scaler read before issue 29)."""
        dims = [{"Name": k, "Value": v} for k, v in VICTIM.metric_dimensions.items()]
        metric = {"Namespace": schema.NAMESPACE, "MetricName": schema.GPU_UTILIZATION.name, "Dimensions": dims}
        queries = [
            {"Id": m.lower(), "MetricStat": {"Metric": metric, "Period": 60, "Stat": m}} for m in ("Sum", "SampleCount")
        ]
        got = self.clients.cloudwatch.get_metric_data(
            MetricDataQueries=queries, StartTime=now - timedelta(minutes=LOOKBACK_MIN), EndTime=now
        )["MetricDataResults"]
        sums = {r["Id"]: sum(r["Values"]) for r in got}
        return float(sums["sum"] / sums["samplecount"]) if sums["samplecount"] else 0.0

    def _desired(self, asg: str) -> int:
        groups = self.clients.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])
        return int(groups["AutoScalingGroups"][0]["DesiredCapacity"])

    def health(self, iid: str) -> str:
        found = self.clients.autoscaling.describe_auto_scaling_instances(InstanceIds=[iid])["AutoScalingInstances"]
        return str(found[0]["HealthStatus"]).upper() if found else "GONE"

    # ---- (1) a flood on another group's series ----

    def flood(self) -> None:
        self.scene = "forged series"
        self.say(0, f"{VICTIM.key}: {len(self.ids)} x {fleet.INSTANCE_TYPE} ({', '.join(self.ids)}), GPUs {BUSY:g} % "
                 f"busy (band 1-80 %), their publishers' own data; {FORGER.key}: 1 node, {self.forger}")  # fmt: skip
        minute = LOOKBACK_MIN + 1
        self.honest_until(minute)
        now = self.t0 + timedelta(minutes=minute)
        dims = [{"Name": k, "Value": v} for k, v in VICTIM.metric_dimensions.items()]
        forged = [
            {"MetricName": schema.GPU_UTILIZATION.name, "Dimensions": dims, "Unit": "Percent"}
            | {"Timestamp": now - timedelta(minutes=m + 1), "Values": [100.0], "Counts": [FLOOD / LOOKBACK_MIN]}
            for m in range(LOOKBACK_MIN)
        ]
        self.clients.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=forged)  # the forger's
        average = self.group_average(now)
        self.say(minute, f"[emulated: moto enforces no IAM] {self.forger} ({FORGER.key}) put {LOOKBACK_MIN} datums "
                 f"on {VICTIM.key}'s GPUUtilization, Values=[100], Counts=[{FLOOD // LOOKBACK_MIN:,}] each: the "
                 f"group series' Average reads {average:.1f} %")  # fmt: skip
        d = self.tick(self.scaler, now, minute, VICTIM)
        told = [n for n in self.deliver(now) if n.incident == f"forged-series:{VICTIM.key}"]
        for n in told:
            self.say(minute, f"[SNS] {n.subject}: {n.why} (incident {n.incident})")
        desired = self._desired(VICTIM.name)
        ok = (
            average > 80
            and (d["action"], d["current"], d["desired"], desired) == ("hold", 2, 2, 2)
            and f"{BUSY:g}% is inside the band" in d["reason"]
            and len(told) == 1
        )
        self._ok(
            ok,
            VICTIM,
            f"[emulated: moto enforces no IAM; {IAM_PROOF}: any node may write the GPUFleet namespace, any "
            f"dimensions] a node of {FORGER.key} flooded its GPUUtilization series (Values=[100], Counts "
            f"{FLOOD:,} in all; Average {average:.1f} %): held {d['current']} -> {d['desired']} on its members' own "
            f"series ({BUSY:g} %), on-call told: '{told[0].subject if told else ''}'",
            f"forged Average {average:.1f} %: {d['action']} {d['current']} -> {d['desired']} ({d['reason']}), "
            f"desired {desired}, {len(told)} forged-series notice(s)",
        )

    # ---- (2) a GPU fault under another node's id ----

    def guard_run(self, run: str) -> tuple[list[dict[str, Any]], list[Told]]:
        """The OOM guard at the scene's minute; its replacements shown, and the GPU-health posts the SNS
        topic delivered."""
        at = self.t0 + timedelta(minutes=self.minute)
        result = self.guard.evaluate(at, f"forged-{run}")
        for r in result["replacements"]:
            self.say(self.minute, f"oom_guard ({run}): {r['instance_id']} {'replaced' if r['act'] else 'kept'}: "
                     f"{r['reason']}")  # fmt: skip
        return list(result["replacements"]), self.told_health(at)

    def told_health(self, at: datetime) -> list[Told]:
        told = [n for n in self.deliver(at) if "GPU failure" in n.subject]
        minute = round((at - self.t0).total_seconds() / 60)
        for n in told:
            self.say(minute, f"[SNS] {n.subject}: {n.why}; {fact(n, 'action')}")
        return told

    def forge_fault(self, victim: str) -> None:
        """The forger runs the real publisher with the victim's identity and its own credentials: they
        cannot write the victim's own namespace (the publisher sends none there), so it also writes a
        GPUFaultReported naming the victim into its own."""
        forging = self._publisher(victim, None)
        forging.backend.lost.add(1)
        forging.record_xid(1, 79)
        self.publish(self.minute, [*self.publishers.values(), forging])
        own = schema.node_namespace(caller(self.forger))
        dims = {schema.DIM_INSTANCE_ID: victim, schema.DIM_GPU_INDEX: "1", schema.DIM_FAULT: schema.GPU_LOST.name}
        datum = {"MetricName": schema.GPU_FAULT_REPORTED.name, "Unit": schema.GPU_FAULT_REPORTED.unit, "Value": 1.0}
        datum |= {"Dimensions": [{"Name": k, "Value": v} for k, v in dims.items()]}
        datum["Timestamp"] = self.t0 + timedelta(minutes=self.minute)
        self.clients.cloudwatch.put_metric_data(Namespace=own, MetricData=[datum])
        self.say(self.minute, f"[emulated: moto enforces no IAM] {self.forger} ran the real publisher as {victim} "
                 f"(replace_unhealthy on): GPU 1 lost (XID 79) in the shared namespace, and GPUFaultReported "
                 f"naming {victim} in its own {own}")  # fmt: skip
        self.minute += 1

    def forged_fault(self) -> None:
        self.scene = "forged fault"
        victim, other = self.ids[1], self.ids[0]
        self.forge_fault(victim)
        first, told_first = self.guard_run("run 1")
        self.honest_until(self.minute + 1)
        second, told_second = self.guard_run("run 2")
        kept = self.health(victim)
        mine = self.publishers[victim]  # its own publisher, its own credentials: the fault is real now
        mine.backend.lost.add(1)
        mine.record_xid(1, 79)
        self.say(self.minute, f"{victim}'s own publisher (aws:userid {caller(victim)}) reports GPU 1 lost: in the "
                 f"shared namespace and its own {schema.node_namespace(caller(victim))}")  # fmt: skip
        self.honest_until(self.minute + 1)
        third, told_third = self.guard_run("run 3")
        replaced = self.health(victim)
        self.clients.autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=victim, ShouldDecrementDesiredCapacity=False
        )
        fresh = [iid for iid, _ in self.instances(VICTIM.name) if iid not in self.ids]
        self.say(self.minute, f"[emulated EC2 Auto Scaling] replaced unhealthy {victim} with {', '.join(fresh)}")
        # the notifier paces an incident's updates: at most one per group_interval (5 min) after its first post
        told_third += self.told_health(self.t0 + timedelta(minutes=self.minute + PACED_MIN))
        said = fact(told_first[0], "action") if told_first else ""
        ok = (
            [(r["instance_id"], r["act"]) for r in first + second + third] == [(victim, False)] * 2 + [(victim, True)]
            and (kept, replaced, self.health(other)) == ("HEALTHY", "UNHEALTHY", "HEALTHY")
            and forgery_reason(victim) in said
            and (len(told_first), len(told_second), len(told_third)) == (1, 0, 1)
            and f"confirmed by {victim} itself" in told_third[0].subject
        )
        self._ok(
            ok,
            VICTIM,
            f"[emulated: moto enforces no IAM; {IAM_PROOF}: a node writes only its own GPUFleet/Node/"
            f"${{aws:userid}}] GPU 1 lost forged under {victim}'s id by {self.forger} (replace_unhealthy on): not "
            f"replaced, told once over 2 guard runs ('{said}'); then {victim}'s own publisher reported it: replaced "
            f"(told at +{self.minute + PACED_MIN} min, the incident's updates paced: "
            f"'{told_third[0].subject if told_third else ''}')",
            f"replacements {[(r['instance_id'], r['act']) for r in first + second + third]}, health {kept} then "
            f"{replaced}, told {[[n.subject for n in t] for t in (told_first, told_second, told_third)]}",
        )

    # ---- (3) a usage record under another node's id ----

    def report(self, fmt: str) -> tuple[int, str]:
        """`gpufleet report` over the rehearsal's day, as on-call runs it (--max-tps: moto has no
        FilterLogEvents quota)."""
        from gpufleet_tools.cli import main as cli

        args = ["report", "--start", DAY.isoformat(), "--end", (DAY + timedelta(days=1)).isoformat()]
        args += [
            "--no-progress",
            "--max-tps",
            "100",
            "--format",
            fmt,
            "--endpoint",
            os.environ[defaults.ENV_ENDPOINT_URL],
        ]
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            code = cli(args)
        return code, text.getvalue()

    def honest_usage(self, at: datetime) -> None:
        """[simulated node] infer's nodes on the rehearsal's day: the real publisher, attribution on
        (rehearsal/usage_scene.py's pods), USAGE_MINUTES of records each."""
        usage = UsageScene(self.out / "forged-nodes", boto3.client("logs"), sample_s=EVERY_S)
        for iid in self.ids:
            backend = SimulatedBackend(gpus=GPUS, memory_total_mib=23028.0)
            for g in range(GPUS):
                backend.set(g, utilization=BUSY, memory_percent=20)
            identity = Identity(iid, "us-east-1", fleet.INSTANCE_TYPE, asg_name=VICTIM.name)
            sender = Sender(self.clients.cloudwatch)
            tracker = usage.tracker(iid, identity, backend, sender)
            pub = Publisher(backend, identity, sender, detail="adaptive", usage=tracker, caller=caller(iid))
            pub.start(xid_thread=False)
            for m in range(USAGE_MINUTES):
                usage.load(iid, backend)
                simulate(pub, at + timedelta(minutes=m), 60, every_s=EVERY_S)
                pub.close_windows(at + timedelta(minutes=m, seconds=59))
            pub.finish(at + timedelta(minutes=USAGE_MINUTES))

    def forge_record(self, victim: str) -> None:
        """The forger copies one of the victim's records (any node may read and write the usage group) and
        writes it into its own stream for team finance, GPU 0 held HELD_S."""
        logs = boto3.client("logs")
        [honest, *_] = logs.get_log_events(logGroupName=schema.USAGE_LOG_GROUP, logStreamName=victim)["events"]
        doc = json.loads(honest["message"]) | {"w": {"0": FINANCE}, "u": [[0, "0", HELD_S, 0, 0, 0]]}
        logs.create_log_stream(logGroupName=schema.USAGE_LOG_GROUP, logStreamName=self.forger)
        event = {"timestamp": honest["timestamp"], "message": json.dumps(doc, separators=(",", ":"))}
        logs.put_log_events(logGroupName=schema.USAGE_LOG_GROUP, logStreamName=self.forger, logEvents=[event])
        self.say(USAGE_MINUTES, f"[emulated: moto enforces no IAM] {self.forger} wrote one record into its own stream: "
                 f"node {victim}, team finance, GPU 0 held 1e9 s")  # fmt: skip

    def forged_record(self) -> None:
        self.scene = "forged record"
        victim = self.ids[1]
        at = START + timedelta(hours=1)
        self.honest_usage(at)
        self.say(0, f"{', '.join(self.ids)} wrote {USAGE_MINUTES} minutes of usage records from {at:%Y-%m-%d %H:%M} "
                 "UTC (the real publisher, attribution on)")  # fmt: skip
        code, before = self.report("json")
        self.forge_record(victim)
        code_after, after = self.report("json")
        _, table = self.report("table")
        shown = table.split("\nWORKLOADS")[0].rstrip().splitlines()  # the totals, flagged records and teams
        for line in [f"$ gpufleet report --start {DAY:%Y-%m-%d} --end ... (the day)", *shown]:
            self.say(USAGE_MINUTES, f"  {line}")
        total, later = json.loads(before)["total"], json.loads(after)
        flagged = [(f["stream"], f["node"], f["teams"]) for f in later["flagged"]]
        flag_lines = [line.strip() for line in shown if line.strip().startswith("1. stream ")]
        ok = (
            code == code_after == 0
            and total == later["total"]
            and total["gpu_hours_held"] > 0
            and flagged == [(self.forger, victim, ["finance"])]
            and "finance" not in {t["team"] for t in later["teams"]}
            and len(flag_lines) == 1
        )
        self._ok(
            ok,
            VICTIM,
            f"[emulated: moto enforces no IAM; tests/integration/test_report_moto.py: any node may write any "
            f"stream] `gpufleet report` on {DAY:%Y-%m-%d}: a record for team finance holding GPU 0 for 1e9 s under "
            f"{victim}'s id, in {self.forger}'s stream, is FLAGGED, not summed "
            f"('{flag_lines[0] if flag_lines else ''}'); the totals unchanged ({total['gpu_hours_held']:.2f} GPU-h, "
            f"${total['cost_usd']:,.2f}), no team finance",
            f"report exits {code}/{code_after}, totals {total} -> {later['total']}, flagged {flagged}",
        )


def fact(told: Told, name: str) -> str:
    """One `name: value` line of an SNS message, as the subscriber reads it."""
    return next((line for line in told.message.splitlines() if line.startswith(f"{name}: ")), "")
