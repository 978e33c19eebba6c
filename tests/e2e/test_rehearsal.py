"""The rehearsal (`make demo`) end to end: its own moto server, the real scaler, expected outcomes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rehearsal.calls import ENV_RECORD
from tests.conftest import REHEARSAL_CALLS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_rehearsal_meets_its_expected_outcomes(tmp_path: Path) -> None:
    # Its AWS calls, for the IAM conformance test: written aside and moved in whole once the run has ended,
    # so a test reading them from another session (`make pytest`) never reads half a run.
    partial = REHEARSAL_CALLS.with_suffix(".partial")
    env = {**os.environ, ENV_RECORD: str(partial)}
    proc = subprocess.run(
        [sys.executable, "-m", "rehearsal", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    if partial.exists():
        os.replace(partial, REHEARSAL_CALLS)
    out = proc.stdout
    for expected in (
        "asg:train-spot: scaled out on load 2 -> 6",
        "eks:ml/infer-gpu: scaled in after the drop",
        "capacity stayed within [1, 6] every minute",
        "a duplicate EventBridge delivery changed nothing",
        "a malformed event was rejected",
        "the morning-peak window",
        "Slack posts after grouping",
        "updates at most every 5 min",
        "a malformed queue message went to the DLQ",
        "a Slack 429 (Retry-After: 1) was retried",
        # bot-token mode against the local receiver [emulated Slack]: one thread per incident
        "Slack bot mode [emulated Slack]: ",
        "later posts replied in their incident's thread (thread_ts)",
        "#gpu-oncall as on-call reads it: one incident's thread [emulated Slack, bot-token mode]",
        "    ↳ thread reply [slack #2] [INFO update] asg:train-spot: scaled 4 -> 6",
        "(one call per node-minute)",
        # attribution (rehearsal/usage_scene.py): two teams' pods, one pod requested 2 GPUs and uses 1
        "`gpufleet report` read the nodes' usage records",
        "requested 2 GPUs, one idle 100 % of its life: $",
        "WARNING at minute",
        "health incident, instance replaced once",
        "spot outage:",
        "after the 5 min wait, handed back",
        # demand-driven scaling (rehearsal/demand_scene.py): pods waiting in cluster ml, a Slurm backlog
        "eks:ml/train-gpu: 3 unschedulable GPU pods -> one scale-out at minute 40 (3 pods (2x4 GPUs, 1x2) "
        "unschedulable for 0 min: scale out 0 -> 3 (4 GPUs per node))",
        "(eval-1 loading its weights, GPUs idle): 'passed over 1 running work'",
        "asg:train-slurm: Slurm/PendingGPUs 10 -> one scale-out at minute 25 (10 GPU(s) requested by waiting jobs: "
        "scale out 0 -> 3 (4 GPUs per node))",
        # demand you can trust (rehearsal/trust_scene.py, issue 28)
        "asg:queue-runners: 3 jobs in flight on 3 of 5 nodes, every GPU idle: the tick at minute 3 kept the 3 "
        "runners holding jobs and released the 2 free nodes (5 -> 3); the jobs done, minute 6 released the runners "
        "(3 -> 0)",
        "no second node at +5 and +10 min (on its way); at +16 min one GPU-health incident, gpu-not-ready/i-",
        "never became GPU-ready' (delivered at +1",
        "min), told once over 3 ticks; its job got a new node at +16 min (1 -> 2)",
        "eks:ml/gpu-infer: 3 pods (cpu 4, memory 16Gi, 1 GPU) fit no g5.xlarge: nothing launched, told once in 3 ticks",
        # one compromised node (rehearsal/forged_scene.py, issue 29): it writes what the node role allows
        "asg:infer: [emulated: moto enforces no IAM; tests/iam/test_node_policy.py: any node may write the GPUFleet "
        "namespace, any dimensions] a node of asg:train flooded its GPUUtilization series (Values=[100], Counts "
        "50,000 in all; Average 99.",
        "held 2 -> 2 on its members' own series (5 %), on-call told: 'gpufleet [WARNING] asg:infer: GPU metrics hold "
        "data no member could publish'",
        "asg:infer: [emulated: moto enforces no IAM; tests/iam/test_node_policy.py: a node writes only its own "
        "GPUFleet/Node/${aws:userid}] GPU 1 lost forged under i-",
        "(replace_unhealthy on): not replaced, told once over 2 guard runs ('action: GPU fault reported for i-",
        "under the shared namespace but not by the instance itself: not replacing; possible forgery from another "
        "node'); then i-",
        "'s own publisher reported it: replaced (told at +11 min, the incident's updates paced: 'gpufleet [CRITICAL "
        "update] asg:infer: GPU failure confirmed by i-",
        "asg:infer: [emulated: moto enforces no IAM; tests/integration/test_report_moto.py: any node may write any "
        "stream] `gpufleet report` on 2026-11-23: a record for team finance holding GPU 0 for 1e9 s under i-",
        "is FLAGGED, not summed ('1. stream i-",
        "claim 277,777.8 GPU-h (teams finance)",
        "the totals unchanged (1.33 GPU-h, $1.89), no team finance",
        # a self-managed node group (rehearsal/selfmanaged_scene.py, issue 30): tagged for Cluster Autoscaler
        "asg:gpu-spot: self-managed, tagged for Cluster Autoscaler, no gpufleet shape configuration: 3 pending pods "
        "-> scale-out 0 -> 3",
        "the scale-in took the 2 idle nodes and passed over i-",
        "which runs a GPU pod: 'no pods waiting (cluster ml): 2 idle node(s) not needed: scale in 3 -> 1",
        # a HyperPod Slurm cluster (rehearsal/hyperpod_scene.py, issue 30): emulated UpdateCluster, nodes, Slurm
        "hyperpod:ml-cluster/gpu: Slurm/PendingGPUs 16 (job 1041, 2 nodes x 8 GPUs) -> scale-out 0 -> 2 "
        "(UpdateCluster [emulated])",
        "hyperpod:ml-cluster/gpu: at minute 21, i-",
        "drained by gpufleet and idle by Slurm, removed by id once Slurm's report showed the drain landed "
        "(BatchDeleteClusterNodes [emulated]); i-",
        ", running Slurm job 1042 with every GPU idle too, kept: 'no GPUs waiting (metric Slurm/PendingGPUs): 1 idle "
        "node(s) not needed: scale in 2 -> 1, terminating i-",
        "hyperpod:ml-cluster/gpu: `gpufleet report --by account`: nlp 2.67 GPU-h, vision 0.93 GPU-h, group "
        "hyperpod:ml-cluster/gpu",
        "hyperpod:ml-cluster/gpu: host memory leak on i-",
        ": OOM guard warning: host memory 84.0% used; rising 2.00 %/min over 8 min, full in ~8 min",
        # ... by attrition through Slurm (issue 31): drained, resumed when its ask was withdrawn, drained, removed
        "hyperpod:ml-cluster/gpu: consolidate: attrition: minute 16's tick asked Slurm to drain i-",
        "the controller's publisher ran `scontrol update NodeName=ip-10-1-28-64 State=DRAIN Reason=gpufleet: ...`, "
        "then `State=RESUME` once the ask was withdrawn (SlurmMarker.reopen), then drained it again (minute 19's "
        "ask) [emulated Slurm]; minute 20's tick, before Slurm's report showed that drain landed (no DrainedNode "
        "for ip-10-1-28-64 yet), removed nothing",
        "hyperpod:ml-cluster/gpu: ip-10-1-28-65 (i-",
        "drained by an operator ('ops: ECC check after job 1042'), left drained: gpufleet resumed only its own",
        # consolidation by attrition (rehearsal/consolidation_scene.py, issue 31): cordon, attrition, reopen
        "eks:ml/serve-gpu: 4 nodes, none empty, 16 GPUs of work: the tick at minute 2 cordoned the 2 emptiest (i-",
        "by attrition: 4 serving node(s) hold 16 GPUs of work, which 2 node(s) hold packed; closed to new work and "
        "removed once idle, nothing evicted",
        "application/merge-patch+json -> 200: spec.unschedulable true, gpufleet.io/drained set (",
        "eks:ml/serve-gpu: its pod ended at minute 3; at minute 9 the scale-in removed i-",
        " only, nothing evicted (serve-a, serve-b, serve-c, serve-d still Running)",
        "eks:ml/serve-gpu: 2 pods of 3 GPUs waiting, no open node with room: minute 11's tick uncordoned i-",
        "(unschedulable false, gpufleet.io/drained removed) and launched nothing: '2 pods (2x3 GPUs) unschedulable",
        "reopening i-",
        "before any launch: waiting pods fit 1 drained node(s) (6 GPUs free)",
        "application/merge-patch+json -> 200: spec.unschedulable false, gpufleet.io/drained removed",
        # jobs that wait before they are pods (rehearsal/queued_scene.py, issue 32): Kueue, Volcano, gangs whole
        "eks:ml/train-gpu: a pending Workload of 4 x 8 GPUs, no pod yet: 0 -> 4 in one change",
        "eks:ml/gang-gpu: a Volcano gang of 4 at max 3 launched nothing, told why: '4 pods of gang ",
        "volcano:ml/allreduce-",
        "the gang needs 4 nodes, its max is 3",
        "eks:ml/train-gpu: admitted, its 4 pods counted once (not with the Workload again): no new node",
        "1 Workload (16 GPUs) waits for quota in ClusterQueue team-b: nvidia.com/gpu 16 of 16 in use in flavor train",
        # never remove a node that runs work (rehearsal/removal_scene.py, issue 40): last look, retry, max lowered
        "eks:ml/batch-gpu: a CPU-only pod bound to idle i-",
        "inside the tick: the last look kept it, nothing terminated",
        "minute 5's tick decided again instead of replaying the saved victim: 'decided again, not replayed",
        "eks:ml/serve-gpu: max lowered to 1 under 3 busy nodes: nothing removed, desiredSize left at 3, told once",
    ):
        assert expected in out
    assert "FAIL" not in out
    timeline = (tmp_path / "timeline.txt").read_text()
    assert "scale-in   applied" in timeline
    assert (tmp_path / "decisions.jsonl").read_text().count("\n") > 100
    assert "[slack #1] [INFO] asg:train-spot: scaled 2 -> 4" in timeline
    assert "[slack #2]   ↳ thread reply to #1: [INFO update] asg:train-spot: scaled 4 -> 6" in timeline
    # issue 23: the reconcile band's own label, a bounds fix that says why its target, no "resolved" on info
    assert "trigger: utilization-band" in timeline and "target-tracking" not in timeline
    assert "desired 1 is below min 2 (schedule 'morning-peak'): raised to the window's desired 3" in timeline
    assert "Severity: info | State:" not in timeline
    assert "owed back to spot: 0 | fallback group: asg:train-ondemand at 0 (was 1)" in timeline
    assert "[emulated kube-scheduler] bound team-a/train-a-0 -> ip-" in timeline  # a node's name: its private DNS
    assert "no pods waiting (cluster ml): 1 idle node(s) not needed: scale in 1 -> 0" in timeline
    # the runners holding jobs were passed over as protected; the incident names the node's age
    assert "3 node(s) held by running messages: 2 idle node(s) not needed: scale in 5 -> 3" in timeline
    assert "passed over 3 scale-in protected" in timeline
    assert "launched 16 min ago and is not GPU-ready" in timeline
    # what on-call got about the flood: the numbers, and what the scaler decided on instead
    assert (
        "[SNS] gpufleet [WARNING] asg:infer: GPU metrics hold data no member could publish: decided on 2 of 2 "
        "InService members' own series (group asg:infer GPUUtilization: " in timeline
    )
    assert "samples, more than the 1,920 its publishers can write) instead." in timeline
    assert "1 flagged, not summed" in timeline and "FLAGGED RECORDS" in timeline
    # the HyperPod scene: the real backlog publisher's data, job attribution by account in the report
    assert "slurm_pending_gpus.py --hyperpod ml-cluster:gpu=gpu: PendingGPUs=0, IdleNode[i-" in timeline
    assert "Slurm job 1041 (alice)     nlp    16         2.7" in timeline
    assert "[SNS] gpufleet [WARNING] hyperpod:ml-cluster/gpu: host memory warning: i-" in timeline
    assert (
        "slurm_pending_gpus.py --marks-table gpufleet-state: `scontrol update NodeName=ip-10-1-28-64 State=DRAIN "
        "Reason=gpufleet: surplus node drained by attrition at 2026-11-23T09:16Z; removed once idle` [emulated Slurm]"
    ) in timeline
    assert "ip-10-1-28-64|drained|gpufleet: surplus node drained by attrition" in timeline
    assert "`scontrol update NodeName=ip-10-1-28-64 State=RESUME` [emulated Slurm]" in timeline
    assert "ip-10-1-28-65|draining|ops: ECC check after job 1042" in timeline
    posted = sorted((tmp_path / "slack").glob("*.json"))
    assert posted and all(json.loads(p.read_text())["blocks"][0]["type"] == "header" for p in posted)
