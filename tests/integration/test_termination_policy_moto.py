"""The GPU-aware custom termination policy through `gpufleet invoke` on moto server: EC2 Auto Scaling's
request as its documentation shows it, answered from the instances' GPU metrics."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpufleet.aws.audit import AuditLog
from tests.integration.conftest import TABLE, Fleet
from tests.integration.test_invoke_events import ROOT, gpufleet, invoke_function

SAMPLE = ROOT / "events" / "termination_policy" / "scale-in-three-candidates.json"


def request_for(instances: list[str], tmp_path: Path, cause: str = "SCALE_IN", capacity: int | None = None) -> Path:
    """The documented sample with this fleet's instance ids in it."""
    doc: dict[str, Any] = json.loads(SAMPLE.read_text())
    doc["Instances"] = [{**doc["Instances"][0], "InstanceId": iid} for iid in instances]
    doc["CapacityToTerminate"][0]["Capacity"] = len(instances) if capacity is None else capacity
    doc["Cause"] = cause
    path = tmp_path / "request.json"
    path.write_text(json.dumps(doc))
    return path


def answer(proc: Any) -> list[str]:
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout[proc.stdout.index('{\n  "InstanceIDs"') :])["InstanceIDs"])


def three_nodes_one_idle(gpu_fleet: Fleet) -> tuple[list[str], str]:
    gpu_fleet.clients.autoscaling.set_desired_capacity(AutoScalingGroupName="train-spot", DesiredCapacity=3)
    nodes = gpu_fleet.instances()
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    for minute in range(1, 6):
        at = now - timedelta(minutes=minute)
        gpu_fleet.put_instance_gpu(nodes[0], 0, 1, at)  # idle
        gpu_fleet.put_instance_gpu(nodes[1], 93, 71, at)  # training
        gpu_fleet.put_instance_gpu(nodes[2], 2, 64, at)  # GPU memory still held (a job between steps)
    return nodes, nodes[0]


def test_a_request_for_three_of_which_one_is_idle_returns_exactly_that_one(gpu_fleet: Fleet, tmp_path: Path) -> None:
    nodes, idle = three_nodes_one_idle(gpu_fleet)
    allowed = answer(invoke_function("termination_policy", gpu_fleet, request_for(nodes, tmp_path)))
    assert allowed == [idle]
    [audited] = AuditLog(gpu_fleet.clients.dynamodb, TABLE).recent("asg:train-spot")
    assert audited.trigger.name == "SCALE_IN" and audited.victims == (idle,)
    assert "1 of 3 ready" in audited.reason and "passed over 2 busy" in audited.reason


def test_an_instance_refresh_waits_for_a_busy_node(gpu_fleet: Fleet, tmp_path: Path) -> None:
    nodes, _ = three_nodes_one_idle(gpu_fleet)
    request = request_for([nodes[1]], tmp_path, cause="INSTANCE_REFRESH")
    assert answer(invoke_function("termination_policy", gpu_fleet, request)) == []
    [audited] = AuditLog(gpu_fleet.clients.dynamodb, TABLE).recent("asg:train-spot")
    assert audited.reason.startswith("INSTANCE_REFRESH: none of 1 ready") and "1 busy" in audited.reason


def test_without_metrics_nothing_is_ready_and_auto_scaling_asks_again(gpu_fleet: Fleet, tmp_path: Path) -> None:
    """No GPU metrics (a publisher down, CloudWatch unreadable): unknown is busy, so nothing goes."""
    request = request_for(gpu_fleet.instances(), tmp_path)
    assert answer(invoke_function("termination_policy", gpu_fleet, request)) == []


def test_dry_run_answers_with_auto_scalings_own_choice_and_audits_what_it_would_have_said(
    gpu_fleet: Fleet, tmp_path: Path
) -> None:
    nodes, idle = three_nodes_one_idle(gpu_fleet)
    proc = invoke_function(
        "termination_policy", gpu_fleet, request_for(nodes, tmp_path), extra_env={"GPUFLEET_DRY_RUN": "true"}
    )
    assert answer(proc) == nodes
    [audited] = AuditLog(gpu_fleet.clients.dynamodb, TABLE).recent("asg:train-spot")
    assert audited.dry_run and f"would allow ['{idle}']" in audited.reason


def test_an_alarm_event_is_rejected_in_one_line(gpu_fleet: Fleet) -> None:
    proc = gpufleet(
        "invoke",
        "termination_policy",
        "--event",
        str(ROOT / "events" / "termination_policy" / "bad-an-alarm-event.json"),
        "--endpoint",
        gpu_fleet.endpoint,
        "--policy",
        str(gpu_fleet.policy_path),
        "--table",
        TABLE,
    )
    assert proc.returncode == 1
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "termination_policy does not handle alarm events" in error


def test_every_termination_policy_sample_event(gpu_fleet: Fleet) -> None:
    """The samples name instances this fleet does not have: never observed, so never allowed."""
    for path in sorted((ROOT / "events" / "termination_policy").glob("*.json")):
        proc = invoke_function("termination_policy", gpu_fleet, path)
        if path.name.startswith("bad-"):
            assert proc.returncode != 0 and "error:" in proc.stderr, path.name
        else:
            assert answer(proc) == [], path.name


def test_in_process_the_same_answer_and_its_calls_are_recorded_for_the_iam_check(
    gpu_fleet: Fleet, tmp_path: Path
) -> None:
    """The subprocess runs above are not seen by the session's call recorder; this one is."""
    from aws_lambda_powertools import Logger, Metrics

    from gpufleet.domain import defaults
    from gpufleet.runtime import build_termination_policy

    nodes, idle = three_nodes_one_idle(gpu_fleet)
    env = {defaults.ENV_STATE_TABLE: TABLE, defaults.ENV_POLICY_FILE: str(gpu_fleet.policy_path)}
    policy = build_termination_policy(Logger(service="test"), Metrics(namespace="GPUFleet/Test"), env=env)
    event = json.loads(request_for(nodes, tmp_path).read_text())
    assert policy.handle(event, datetime.now(UTC)) == {"InstanceIDs": [idle]}
