"""A new user's first hour with the CLI (issue 23), each step as the user ran it - a subprocess against moto
server - and each answer one they can act on: a missing stack or missing credentials is one line naming
what to run, `local send` prints one JSON document, a repeated event says it was already handled, a
rejection carries no Powertools noise, and an event EventBridge never carries names the `invoke` that runs
it."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet_node import schema
from rehearsal import fleet
from tests.integration.conftest import TABLE, Fleet
from tests.integration.test_invoke_events import ROOT, on_fleet

pytestmark = pytest.mark.integration

ALARM = ROOT / "events" / "scaler" / "eventbridge-alarm-asg-high.json"
AWS_SETUP = ("AWS_", "GPUFLEET_", "POWERTOOLS_")


def cli(*args: str, env: dict[str, str] | None = None, home: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """`gpufleet ARGS` as a user's shell runs it: only what `env` says about AWS (no credentials unless
    given), Powertools as it comes (metrics on, so its warnings would show)."""
    base = {"PATH": "/usr/bin:/bin", "HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true"}
    base["AWS_CONFIG_FILE"] = base["AWS_SHARED_CREDENTIALS_FILE"] = str(home / "no-such-aws-file")
    return subprocess.run(
        [sys.executable, "-m", "gpufleet_tools.cli", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        cwd=ROOT,
        timeout=120,
        check=False,
    )


MOTO = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


# 1. `gpufleet invoke` (and `local send`) on a bare moto server: no state table there.


def test_invoke_on_a_bare_moto_server_says_to_run_local_up(aws: str, tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("groups: [{name: train-spot, kind: asg, max: 6}]\n")
    proc = cli("invoke", "scaler", "--event", str(ALARM), "--endpoint", aws, "--policy", str(policy))
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: no state table 'gpufleet-state' at {aws}: start the local stack (moto with the template's table, "
        'queues and policy) with `eval "$(gpufleet local up)"` and run this again without --endpoint, or pass '
        "--table NAME"
    ]
    sent = cli("local", "send", str(ALARM), "--endpoint", aws, "--policy", str(policy), "--table", "mine")
    assert sent.returncode == 1 and sent.stdout == ""
    assert sent.stderr.splitlines()[0] == "delivered to scaler (rule AlarmStateChange)"
    [line] = errors(sent)
    assert line.startswith(f"error: no state table 'mine' at {aws}: start the local stack")


def test_invoke_with_nothing_listening_says_so_in_one_line() -> None:
    proc = cli("invoke", "scaler", "--event", str(ALARM), "--endpoint", "http://127.0.0.1:9")
    assert proc.returncode == 1
    [line] = errors(proc)
    assert line.startswith("error: nothing answers at http://127.0.0.1:9 (")
    assert line.endswith('is the server running? `eval "$(gpufleet local up)"` starts one')


# 2. `gpufleet replay --from-cloudwatch`: no credentials, no region, no history, part of a history.


def test_replay_from_cloudwatch_without_credentials_or_region_is_one_line(tmp_path: Path) -> None:
    out = str(tmp_path / "out")
    local = 'or use --endpoint http://127.0.0.1:PORT for the local stack (`eval "$(gpufleet local up)"`)'
    region = {"AWS_DEFAULT_REGION": "us-east-1"}
    proc = cli("replay", "--from-cloudwatch", "asg:train", "--out", out, env=region, home=tmp_path)
    assert proc.returncode == 2
    expected = "error: no AWS credentials found (Unable to locate credentials): run `aws configure` or set AWS_PROFILE"
    assert errors(proc) == proc.stderr.splitlines() == [f"{expected}, {local}"]
    proc = cli("replay", "--from-cloudwatch", "asg:train", "--out", out, home=tmp_path)
    assert proc.returncode == 2
    assert errors(proc) == [
        f"error: no AWS region set: set AWS_REGION or run `aws configure set region REGION`, {local}"
    ]


def test_replay_with_an_endpoint_needs_no_credentials_and_refuses_an_empty_history(aws: str, tmp_path: Path) -> None:
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "train", min_size=1, max_size=4, desired=2, tags=fleet.MANAGED_TAG)
    proc = cli("replay", "--from-cloudwatch", "asg:train", "--days", "1", "--endpoint", aws, "--out", str(tmp_path))
    assert proc.returncode == 2 and proc.stdout == ""
    [line] = errors(proc)
    assert line.startswith("error: nothing to replay for asg:train in the last 1 day(s): no GPUFleet GPUUtilization ")
    assert "no AWS/AutoScaling GroupInServiceInstances datapoints" in line
    assert "without the group's GPU utilization and size every number would be 0" in line
    assert not (tmp_path / "history.md").exists()


def test_replay_says_which_series_were_missing_instead_of_silent_zeros(aws: str, tmp_path: Path) -> None:
    """The group's utilization and size are there, the instances' series are not: the replay runs and says
    which of its numbers are 0 for want of data, on stderr and in the report."""
    clients = fleet.Clients.create()
    fleet.create_asg(clients, "train", min_size=1, max_size=4, desired=2, tags=fleet.MANAGED_TAG)
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    data: list[dict[str, Any]] = []
    for t in range(0, 1440, 1):
        at = end - timedelta(minutes=1440 - t)
        dims = [{"Name": schema.DIM_ASG_NAME, "Value": "train"}]
        data.append({"MetricName": schema.GPU_UTILIZATION.name, "Dimensions": dims, "Timestamp": at, "Value": 60.0})
    for i in range(0, len(data), 1000):
        clients.cloudwatch.put_metric_data(Namespace=schema.NAMESPACE, MetricData=data[i : i + 1000])
    count = [{**d, "MetricName": "GroupInServiceInstances", "Value": 2.0} for d in data]
    for i in range(0, len(count), 1000):
        clients.cloudwatch.put_metric_data(Namespace="AWS/AutoScaling", MetricData=count[i : i + 1000])
    proc = cli("replay", "--from-cloudwatch", "asg:train", "--days", "1", "--endpoint", aws, "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    missing = "no per-instance GPUFleet GPUUtilization or GPUMemoryUsedPercent datapoints: idle node-hours"
    assert [line for line in proc.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: {missing}, reclaimed node-hours and busy nodes removed are 0"
    ]
    assert "Missing in the window (the numbers that need it are 0 for want of data):" in proc.stdout
    assert json.loads((tmp_path / "history.json").read_text())["missing"][0].startswith(missing)


# 3-5. `local send`: one JSON document; the same event again is said to be already handled; no warning.


def test_local_send_prints_one_json_document_and_says_when_the_event_was_already_handled(
    gpu_fleet: Fleet, tmp_path: Path
) -> None:
    stack = fleet.create_notification_stack(slack_secret=None)
    env = {**MOTO, **stack.env(TABLE, str(gpu_fleet.policy_path))}
    first = cli("local", "send", str(ALARM), *on_fleet(gpu_fleet), env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    doc = json.loads(first.stdout)  # the whole of stdout: one document
    [scaler] = doc["delivered_to"]
    assert (scaler["function"], scaler["rule"], scaler["already_handled"]) == ("scaler", "AlarmStateChange", [])
    [decision] = scaler["result"]["results"][0]["decisions"]
    assert decision["outcome"] == "applied" and gpu_fleet.desired() == 3
    assert doc["notifier"]["notifications"] == 1 and doc["notifier"]["result"] == {"batchItemFailures": []}
    assert "already handled" not in first.stderr and "UserWarning" not in first.stderr

    again = cli("local", "send", str(ALARM), *on_fleet(gpu_fleet), env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    doc = json.loads(again.stdout)
    [scaler] = doc["delivered_to"]
    [stored] = scaler["already_handled"]
    assert stored["event_id"] == decision["event_id"] and doc["notifier"] is None  # nothing new to tell
    processed = datetime.fromisoformat(stored["processed_at"])
    assert abs(processed - datetime.fromisoformat(decision["at"].replace("Z", "+00:00"))) < timedelta(seconds=5)
    assert (
        f"already handled: event id {decision['event_id']} was processed at {processed:%Y-%m-%d %H:%M:%S} UTC; "
        "this is the stored result, nothing was changed again"
    ) in again.stderr.splitlines()
    assert gpu_fleet.desired() == 3  # changed once
    assert "UserWarning" not in again.stderr and "No application metrics" not in again.stderr


def test_invoke_says_already_handled_on_stderr_and_keeps_stdout_the_result(gpu_fleet: Fleet) -> None:
    args = ("invoke", "scaler", "--event", str(ALARM), *on_fleet(gpu_fleet))
    assert cli(*args, env=MOTO).returncode == 0
    again = cli(*args, env=MOTO)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["results"][0]["decisions"][0]["outcome"] == "applied"  # the stored result
    [notice] = [line for line in again.stderr.splitlines() if line.startswith("already handled:")]
    assert notice.endswith("this is the stored result, nothing was changed again")
    assert gpu_fleet.desired() == 3


def test_a_rejected_event_carries_no_powertools_metrics_warning(gpu_fleet: Fleet) -> None:
    bad = ROOT / "events" / "scaler" / "bad-alarm-wrong-types.json"
    proc = cli("invoke", "scaler", "--event", str(bad), *on_fleet(gpu_fleet), env=MOTO)
    assert proc.returncode == 1
    assert '"message":"rejected event"' in proc.stderr  # the function ran, metrics on, and rejected it
    assert "No application metrics to publish" not in proc.stderr and "UserWarning" not in proc.stderr
    [line] = errors(proc)
    assert line.startswith("error: scaler failed: InvalidEvent: EventBridge event is malformed: time:")


# 6. Shapes EventBridge never carries: the `invoke` that runs them.


@pytest.mark.parametrize(
    ("sample", "how"),
    [
        (
            "alarm-action-asg-low.json",
            "a CloudWatch alarm action's payload: CloudWatch invokes the function directly "
            "(scaler: ScalerAlarmActionPermission)",
        ),
        (
            "sns-alarm-eks-high.json",
            "an SNS notification: the topic invokes the function directly (scaler: ScalerAlarmTopicPermission)",
        ),
    ],
)
def test_local_send_of_a_direct_shape_names_the_invoke_that_runs_it(gpu_fleet: Fleet, sample: str, how: str) -> None:
    event = f"events/scaler/{sample}"
    proc = cli("local", "send", event, *on_fleet(gpu_fleet), env=MOTO)
    assert proc.returncode == 1 and proc.stdout == ""
    command = shlex.join(["gpufleet", "invoke", "scaler", "--event", event, *on_fleet(gpu_fleet)])
    assert proc.stderr.splitlines() == [
        f"not delivered: this is {how}, not through an EventBridge rule; run it with: {command}"
    ]
    suggested = shlex.split(command)[1:]
    ran = cli(*suggested, env=MOTO)  # the line suggested, as it is
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert json.loads(ran.stdout)["results"][0]["decisions"]


def test_every_sample_reaches_its_function_by_a_rule_or_a_direct_route() -> None:
    """What `local send` cannot deliver, it can point at: every sample in events/ is matched by an
    EventBridge rule or by a direct route to the function it is filed under (bad-* samples and the two
    payloads of schedules a user makes without an input aside)."""
    from gpufleet_tools.local import direct_routes, routes_for, rules_matching, template_rules

    template = ROOT / "template.yaml"
    rules, routes = template_rules(template), direct_routes(template)
    own_wiring = {"eventbridge-scheduled-event.json", "scheduler-default-payload.json"}
    unreached = []
    for path in sorted((ROOT / "events").glob("*/*.json")):
        if path.name.startswith("bad-") or path.name in own_wiring:
            continue
        event = json.loads(path.read_text())
        reached = {r.function for r in rules_matching(event, rules)} | {r.function for r in routes_for(event, routes)}
        if path.parent.name not in reached:
            unreached.append(path.relative_to(ROOT).as_posix())
    assert unreached == []


def test_every_argument_of_replay_and_local_says_what_it_is_for() -> None:
    """The rest of the commands are checked in tests/adapters/test_cli_guidance.py."""
    import argparse

    from gpufleet_tools.cli import build_parser

    def bare(parser: argparse.ArgumentParser, path: str) -> list[str]:
        found = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found += bare(sub, f"{path} {name}".strip())
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                found.append(f"{path} {action.option_strings or action.dest}")
        return found

    assert [b for b in bare(build_parser(), "") if b.split()[0] in ("replay", "local")] == []
