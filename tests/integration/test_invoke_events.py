"""Every file in events/ goes through `gpufleet invoke` (a real subprocess) against moto server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet

ROOT = Path(__file__).resolve().parents[2]
EVENT_FILES = sorted(p for p in (ROOT / "events" / "scaler").iterdir() if p.is_file())
NOTIFIER_EVENTS = sorted(p for p in (ROOT / "events" / "notifier").iterdir() if p.is_file())
GUARD_EVENTS = sorted(p for p in (ROOT / "events" / "oom_guard").iterdir() if p.is_file())
SPOT_EVENTS = sorted(p for p in (ROOT / "events" / "spot_watch").iterdir() if p.is_file())


def test_every_events_directory_belongs_to_a_function_and_is_tested() -> None:
    functions = {p.name for p in (ROOT / "functions").iterdir() if (p / "app.py").exists()}
    assert {p.name for p in (ROOT / "events").iterdir()} == functions


def gpufleet(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_METRICS_DISABLED": "true",
        "HOME": str(ROOT),
        **(extra_env or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "gpufleet_tools.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )


def invoke_scaler(fleet: Fleet, event: Path) -> subprocess.CompletedProcess[str]:
    return invoke_function("scaler", fleet, event)


def on_fleet(fleet: Fleet) -> list[str]:
    """The options that point a command at the test fleet: moto server, its policy file, the state table."""
    return ["--endpoint", fleet.endpoint, "--policy", str(fleet.policy_path), "--table", TABLE]


def invoke_function(
    function: str, fleet: Fleet, event: Path, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return gpufleet("invoke", function, "--event", str(event), *on_fleet(fleet), extra_env=extra_env)


def test_events_directory_covers_every_trigger_shape() -> None:
    names = {p.name for p in EVENT_FILES}
    for shape in ("eventbridge-alarm", "alarm-action", "sns-alarm", "scheduler-reconcile", "eventbridge-scheduled"):
        assert any(n.startswith(shape) for n in names), shape


@pytest.mark.parametrize("path", EVENT_FILES, ids=lambda p: p.name)
def test_invoke_every_sample_event(gpu_fleet: Fleet, path: Path) -> None:
    before = (gpu_fleet.desired(), gpu_fleet.nodegroup_desired())
    proc = invoke_scaler(gpu_fleet, path)
    if path.name.startswith("bad-"):
        assert proc.returncode != 0
        assert "error:" in proc.stderr
        assert (gpu_fleet.desired(), gpu_fleet.nodegroup_desired()) == before  # nothing changed
        return
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout[proc.stdout.index('{\n  "results"') :])
    assert result["results"], proc.stdout
    for r in result["results"]:
        for d in r["decisions"]:
            assert d["reason"]


def test_explain_prints_recorded_decisions(gpu_fleet: Fleet) -> None:
    event = ROOT / "events" / "scaler" / "eventbridge-alarm-asg-high.json"
    invoke_scaler(gpu_fleet, event)
    proc = gpufleet("explain", "train-spot", "--endpoint", gpu_fleet.endpoint, "--table", TABLE)
    assert proc.returncode == 0, proc.stderr
    assert "scale-out   applied" in proc.stdout
    assert "alarm gpufleet-train-gpu-high in ALARM: scale out 2 -> 3" in proc.stdout


def test_validate_policy_cli(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("groups: [{name: 'train-*', kind: asg, max: 8}]\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "groups: [{name: 'train-*', kind: asg, scale_in_step: '-5%'}, {name: b, kind: asg, min: 9, max: 8}]\n"
    )
    ok = gpufleet("validate-policy", str(good))
    assert ok.returncode == 0
    assert "ok (1 group rule(s)" in ok.stdout
    no = gpufleet("validate-policy", str(bad))
    assert no.returncode == 1
    assert (
        "groups[0] (train-*).scale_in_step: expected an integer >= 1 or a percentage like '25%' (got '-5%')"
        in no.stderr
    )
    assert "groups[1] (b): min (9) is above max (8)" in no.stderr


@pytest.mark.parametrize("path", NOTIFIER_EVENTS, ids=lambda p: p.name)
def test_invoke_every_notifier_sample_event(aws: str, tmp_path: Path, path: Path) -> None:
    """No Slack secret configured here: notifications go to SNS only (Slack is covered elsewhere)."""
    clients = fleet.Clients.create()
    fleet.create_state_table(clients.dynamodb, TABLE)
    stack = fleet.create_notification_stack(slack_secret=None)
    policy = tmp_path / "policy.yaml"
    policy.write_text("notifications: {grouping: {group_wait_s: 0, group_interval_s: 0}}\n")
    env = stack.env(TABLE, str(policy))
    proc = gpufleet("invoke", "notifier", "--event", str(path), "--endpoint", aws, extra_env=env)
    sqs = boto3.client("sqs")
    if path.name.startswith("bad-"):
        assert proc.returncode != 0 and "error:" in proc.stderr
        assert fleet.drain(sqs, stack.sns_inbox_url) == []
        return
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout[proc.stdout.index('{\n  "') :])  # logs are one-line JSON
    assert result.get("batchItemFailures", []) == []
    published = fleet.drain(sqs, stack.sns_inbox_url)
    rejected = fleet.drain(sqs, stack.dlq_url)
    expected = {
        "sqs-notification.json": (1, 0),
        "sqs-two-groups-with-duplicate.json": (2, 0),  # the duplicate record posts nothing
        "sqs-flush.json": (0, 0),  # nothing is pending for that incident here
        "sqs-malformed-bodies.json": (1, 3),  # three rejected to the DLQ, the valid one proceeds
        "scheduler-sweep.json": (0, 0),
    }[path.name]
    assert (len(published), len(rejected)) == expected


@pytest.mark.parametrize("path", GUARD_EVENTS, ids=lambda p: p.name)
def test_invoke_every_oom_guard_sample_event(gpu_fleet: Fleet, path: Path) -> None:
    proc = invoke_function("oom_guard", gpu_fleet, path)
    if path.name.startswith("bad-"):
        assert proc.returncode != 0 and "error:" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout[proc.stdout.index('{\n  "results"') :])
    [run] = result["results"]
    assert run["gpus"] == 0 and run["at_risk"] == {}  # no publisher data in this fleet: nothing judged


@pytest.mark.parametrize("path", SPOT_EVENTS, ids=lambda p: p.name)
def test_invoke_every_spot_watch_sample_event(gpu_fleet: Fleet, path: Path) -> None:
    proc = invoke_function("spot_watch", gpu_fleet, path)
    if path.name.startswith("bad-"):
        assert proc.returncode != 0 and "error:" in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr
    [run] = json.loads(proc.stdout[proc.stdout.index('{\n  "results"') :])["results"]
    if path.name.startswith("launch-unsuccessful"):
        [group] = run["groups"]
        expected = {
            "spot-capacity": "spot-capacity",
            "insufficient-capacity": "on-demand-capacity",  # EC2's on-demand wording: no fallback
            "vcpu-quota": "quota",
            "subnet-full": "subnet-ip-exhaustion",
        }[path.stem.removeprefix("launch-unsuccessful-")]
        assert [f["class"] for f in group["new_failures"]] == [expected]
    elif path.name.startswith(("spot-interruption", "rebalance")):
        assert run["ignored"] == "i-1234567890abcdef0 is not in a managed group"  # AWS's sample instance id
    elif path.name.startswith("capacity-block"):
        assert run["ignored"] == "no managed group launches into cr-0123456789abcdef0"
    else:
        # Both managed groups have their capacity in service: nothing to read, nothing found.
        assert run["groups_managed"] == 2 and run["groups"] == [] and run["handed_back"] == []


def test_a_function_given_a_kind_it_does_not_handle_rejects_it_in_one_line(gpu_fleet: Fleet) -> None:
    before = (gpu_fleet.desired(), gpu_fleet.nodegroup_desired())
    proc = invoke_function("spot_watch", gpu_fleet, ROOT / "events" / "spot_watch" / "bad-an-alarm-event.json")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    takes = "capacity-block, launch-unsuccessful, rebalance, schedule, spot-interruption"
    reason = f"spot_watch does not handle alarm events (it takes: {takes})"
    assert errors == [f"error: spot_watch failed: UnsupportedEvent: {reason}"]
    assert (gpu_fleet.desired(), gpu_fleet.nodegroup_desired()) == before


def test_invoke_prints_only_the_result_on_stdout_and_the_functions_logs_on_stderr(gpu_fleet: Fleet) -> None:
    proc = invoke_scaler(gpu_fleet, ROOT / "events" / "scaler" / "eventbridge-alarm-asg-high.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)  # the whole of stdout is the handler's result
    assert [d["outcome"] for r in result["results"] for d in r["decisions"]] == ["applied"]
    assert '"service":"scaler"' in proc.stderr  # Powertools' JSON log lines
