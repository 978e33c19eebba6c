"""`make demo`: the whole scaler rehearsed on moto server, no AWS account. Exits 1 if the
scenario's expected outcomes don't happen."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from rehearsal.busy_scene import BusyScene
from rehearsal.calls import ENV_RECORD, CallRecorder
from rehearsal.consolidation_scene import ConsolidationScene
from rehearsal.demand_scene import TOKEN
from rehearsal.forged_scene import ForgedScene
from rehearsal.hyperpod_scene import HyperPodScene
from rehearsal.kube_api import KubeApi, kube_api
from rehearsal.moto import moto_server
from rehearsal.moto_ext import ENV_LOGS_NOW
from rehearsal.queued_scene import QueuedScene
from rehearsal.removal_scene import RemovalScene
from rehearsal.scenario import SLACK_CHANNEL, START, Rehearsal, write_outputs
from rehearsal.selfmanaged_scene import SelfManagedScene
from rehearsal.slack import slack_receiver
from rehearsal.trust_scene import TrustScenes


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m rehearsal", description=__doc__)
    parser.add_argument("--out", default="demo-out", help="where timeline, decisions and logs go")
    parser.add_argument("--minutes", type=int, default=100, help="simulated minutes")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    recorder = None
    if os.environ.get(ENV_RECORD):  # the test session's IAM conformance check reads what we called
        recorder = CallRecorder()
        recorder.install()
    # [emulated] CloudWatch Logs takes records from 14 days back only: moto's Logs clock follows the rehearsal's
    os.environ.setdefault(ENV_LOGS_NOW, (START + timedelta(minutes=args.minutes)).isoformat())
    print("gpufleet rehearsal: moto server on 127.0.0.1, simulated clock from 2026-11-23 08:00 UTC")
    print("(moto doesn't evaluate alarms or run EKS: lines marked [emulated] are the harness standing in)\n")
    with moto_server(out / "moto.log") as server, slack_receiver() as slack, kube_api(KubeApi(tokens={TOKEN})) as kube:
        print(
            f"moto server: {server.url}; Slack Web API receiver, local [emulated Slack]: {slack[1]}/api/; "
            f"cluster ml's Kubernetes API [emulated]: {kube[1]}\n"
        )
        result = Rehearsal(out, slack, minutes=args.minutes, kube=kube).run()
        print(
            "\ndemand you can trust (rehearsal/trust_scene.py): moto reset, three more groups, each scene on its own "
            "clock from its nodes' LaunchTime [emulated]"
        )
        server.reset()
        trust = TrustScenes(out, kube, TOKEN).run()
        print(
            "\none compromised node (rehearsal/forged_scene.py): moto reset, asg:infer and one node of asg:train "
            "writing what the node role lets any node write [emulated: moto enforces no IAM]"
        )
        server.reset()
        forged = ForgedScene(out, kube, TOKEN).run()
        print(
            "\na busy worker another group's node tries to get removed (rehearsal/busy_scene.py): moto reset, "
            "asg:workers and asg:batch [emulated: moto enforces no IAM, so the forged calls land]"
        )
        server.reset()
        busy = BusyScene(out, kube, TOKEN).run()
        print(
            "\na self-managed node group (rehearsal/selfmanaged_scene.py): moto reset, an ASG tagged for Cluster "
            "Autoscaler, pods waiting in cluster ml [emulated Kubernetes API]"
        )
        server.reset()
        selfmanaged = SelfManagedScene(out, kube, TOKEN).run()
        print(
            "\na HyperPod Slurm cluster (rehearsal/hyperpod_scene.py): moto reset, an instance group at 0 nodes "
            "[emulated: UpdateCluster, BatchDeleteClusterNodes, the nodes, Slurm], its clock from 09:00"
        )
        server.reset()
        hyperpod = HyperPodScene(out, kube, TOKEN).run()
        print(
            "\nconsolidation by attrition (rehearsal/consolidation_scene.py): moto reset, a managed node group of 4 "
            "nodes of 8 GPUs, pods spread over all of them in cluster ml [emulated Kubernetes API]"
        )
        server.reset()
        consolidation = ConsolidationScene(out, kube, TOKEN).run()
        print(
            "\njobs that wait before they are pods (rehearsal/queued_scene.py): moto reset, a Kueue Workload and a "
            "Volcano gang in cluster ml [emulated Kubernetes API, Kueue and Volcano objects]"
        )
        server.reset()
        queued = QueuedScene(out, kube, TOKEN).run()
        print(
            "\nnever remove a node that runs work (rehearsal/removal_scene.py): moto reset, two managed node groups "
            "in cluster ml [emulated Kubernetes API, a throttled terminate]"
        )
        server.reset()
        removal = RemovalScene(out, kube, TOKEN).run()
    for scene in (trust, forged, busy, selfmanaged, hyperpod, consolidation, queued, removal):
        result.lines += ["", *scene.lines]
        result.decisions += scene.decisions
        result.checks += scene.checks
        result.failures += scene.failures
    write_outputs(result, out)
    if recorder is not None:
        recorder.dump(os.environ[ENV_RECORD])
    if result.report:
        print("\n$ gpufleet report --start 2026-11-23T08:00 --end ... (the nodes' usage records, 100 minutes)")
        print(result.report.rstrip())
    if result.thread:
        print(f"\n{SLACK_CHANNEL} as on-call reads it: one incident's thread [emulated Slack, bot-token mode]")
        print("\n".join(result.thread))
    print("\nexpected outcomes:")
    for check in result.checks:
        print(f"  ok    {check}")
    for failure in result.failures:
        print(f"  FAIL  {failure}")
    print(
        f"\n{len(result.decisions)} decisions, {len(result.slack)} Slack messages; timeline.txt, decisions.jsonl, "
        f"slack-messages.json, slack/*.json, usage-report.png, scaler.log and notifier.log in {out}/ "
        f"({time.monotonic() - started:.1f} s)"
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
