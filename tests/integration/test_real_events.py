"""Payloads other people published (AWS docs, SDK and Powertools fixtures, `sam local generate-event`,
a captured SNS delivery; sources in tests/fixtures/real_events/SOURCES.md) through `gpufleet invoke`
against moto server: each is either handled or rejected in one line, never a crash, and a suppressed or
muted alarm changes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpufleet.events.origin import Origin, origins_of
from tests.integration.conftest import Fleet
from tests.integration.test_invoke_events import invoke_function

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real_events"
OK, REJECTED = "ok", "rejected"
HOME = Origin(account="123456789012", region="us-east-1")  # moto's account; the tests' region
# file -> (function, expected, text that must appear in the decision reasons or the error line)
EXPECTED = {
    "eb-alarm-state-change-metric--awsdocs-cloudwatch-user-guide.json": ("scaler", OK, "no action"),
    "eb-alarm-state-change-metricmath--awsdocs-cloudwatch-user-guide.json": ("scaler", OK, "no action"),
    "eb-alarm-state-change-anomaly--awsdocs-cloudwatch-user-guide.json": ("scaler", OK, "no action"),
    "eb-alarm-state-change-multi-time-series--aws-docs-cloudwatch-and-eventbridge.json": ("scaler", OK, "no action"),
    "eb-alarm-state-change-metric-mutedetail--aws-docs-cloudwatch-and-eventbridge.json": ("scaler", OK, ""),
    "eb-alarm-state-change-composite-suppressed-mutedetail--aws-docs-cloudwatch-and-eventbridge.json": (
        "scaler",
        OK,
        "",
    ),
    "eb-alarm-state-change-composite-suppressor-hybrid--rust-lambda-events.json": (
        "scaler",
        REJECTED,
        "alarmArn: Field required",
    ),
    "lambda-alarm-action-composite--powertools-python.json": ("scaler", OK, "no action"),
    "lambda-alarm-action-metricmath--powertools-python.json": ("scaler", OK, "no action"),
    "lambda-alarm-action-metric--rust-lambda-events.json": (
        "scaler",
        REJECTED,
        "alarm action event is malformed: time",
    ),
    "sns-cloudwatch-alarm-single-metric--aws-lambda-go.json": ("scaler", OK, ""),
    "sns-cloudwatch-alarm-multiple-metrics--aws-lambda-go.json": ("scaler", OK, ""),
    "sns-cloudwatch-alarm-real-capture-milan--github-discord-notifier-comment.json": ("scaler", OK, ""),
    "sns-event--aws-lambda-go.json": ("scaler", REJECTED, "is not JSON: not a CloudWatch alarm notification"),
    "sns-event-urlcaps--rust-lambda-events.json": (
        "scaler",
        REJECTED,
        "is not JSON: not a CloudWatch alarm notification",
    ),
    "sns-notification--sam-local-generate-event.json": ("scaler", REJECTED, "not a CloudWatch alarm notification"),
    "eb-scheduled-event--sam-local-generate-event.json": ("scaler", OK, ""),
    "eb-scheduled-event-with-version--awsdocs-lambda-developer-guide.json": ("scaler", OK, ""),
    "sqs-event--aws-lambda-go.json": ("notifier", OK, ""),
    "sqs-event--powertools-python.json": ("notifier", OK, ""),
    "sqs-receive-message--sam-local-generate-event.json": ("notifier", OK, ""),
    "asg-launch-unsuccessful--aws-lambda-go.json": ("spot_watch", OK, "is not a managed group"),
    "asg-launch-unsuccessful--awsdocs-asg-user-guide.json": (
        "spot_watch",
        REJECTED,
        "time: Input should be a valid datetime",
    ),
    "ec2-spot-interruption-warning--awsdocs-ec2-user-guide.json": (
        "spot_watch",
        REJECTED,
        "EventBridge event is malformed",  # its time is "yyyy-mm-ddThh:mm:ssZ"; events/spot_watch has a real one
    ),
    "ec2-rebalance-recommendation--awsdocs-ec2-user-guide.json": (
        "spot_watch",
        REJECTED,
        "EventBridge event is malformed",
    ),
    "capacity-block-reservation-expiration-warning--aws-docs-capacity-blocks-monitor.json": (
        "spot_watch",
        REJECTED,
        # The page's own spelling (customer_event_id, detail_type) is understood; its "[Current time]" is not.
        "time: Input should be a valid datetime",
    ),
}


def test_every_real_sample_has_an_expectation() -> None:
    assert {p.name for p in REAL.glob("*.json")} == set(EXPECTED)
    assert len(EXPECTED) >= 10


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(EXPECTED), ids=lambda n: n[:60])
def test_a_real_sample_is_handled_or_rejected_in_one_line(gpu_fleet: Fleet, name: str) -> None:
    function, expected, text = EXPECTED[name]
    env = None
    if function == "notifier":
        from rehearsal import fleet

        env = fleet.create_notification_stack(slack_secret=None).env("gpufleet-state", str(gpu_fleet.policy_path))
    before = (gpu_fleet.desired(), gpu_fleet.nodegroup_desired())
    proc = invoke_function(function, gpu_fleet, at_home(REAL / name, gpu_fleet.policy_path.parent), extra_env=env)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in proc.stderr
    if expected == REJECTED:
        assert proc.returncode == 1 and len(errors) == 1 and text in errors[0], proc.stderr[-2000:]
        assert len(errors[0]) < 400  # one line, no echoed body
    else:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert text in proc.stdout
    assert (gpu_fleet.desired(), gpu_fleet.nodegroup_desired()) == before


def foreign(doc: dict[str, Any]) -> list[Origin]:
    return [o for o in origins_of(doc) if o.account not in (None, HOME.account) or o.region not in (None, HOME.region)]


def at_home(path: Path, tmp: Path) -> Path:
    """The sample as if sent in the test's account and region (the shape is under test here; another
    account's or region's event is refused, below)."""
    text = path.read_text()
    for origin in foreign(json.loads(text)):
        for theirs, ours in ((origin.account, HOME.account), (origin.region, HOME.region)):
            text = text.replace(theirs, ours) if theirs and ours else text
    moved = tmp / f"home-{path.name}"
    moved.write_text(text)
    return moved


@pytest.mark.integration
def test_real_samples_of_another_account_or_region_are_refused_in_one_line(gpu_fleet: Fleet) -> None:
    away = [n for n, (fn, expected, _) in EXPECTED.items() if fn == "scaler" and expected == OK]
    away = [n for n in away if foreign(json.loads((REAL / n).read_text()))]
    assert len(away) >= 3  # published samples come from many accounts and regions
    for name in away:
        proc = invoke_function("scaler", gpu_fleet, REAL / name)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert proc.returncode == 1 and len(errors) == 1, proc.stderr[-2000:]
        assert "but this function serves account 123456789012 in us-east-1: nothing done" in errors[0]
    assert (gpu_fleet.desired(), gpu_fleet.nodegroup_desired()) == (2, 2)


def _retargeted(name: str, gpu_fleet: Fleet) -> Path:
    """A published suppressed/muted alarm event, pointed at this fleet's group and scale-out alarm."""
    event = json.loads((REAL / name).read_text())
    event["resources"] = ["arn:aws:cloudwatch:us-east-1:123456789012:alarm:gpufleet-train-gpu-high"]
    event["detail"]["alarmName"] = "gpufleet-train-gpu-high"
    event["detail"]["state"]["value"] = "ALARM"
    event["detail"]["configuration"] = {
        "metrics": [
            {
                "id": "m1",
                "metricStat": {
                    "metric": {
                        "namespace": "GPUFleet",
                        "name": "GPUUtilization",
                        "dimensions": {"AutoScalingGroupName": "train-spot"},
                    }
                },
            }
        ]
    }
    path = gpu_fleet.policy_path.parent / name
    path.write_text(json.dumps(event))
    return at_home(path, gpu_fleet.policy_path.parent)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("eb-alarm-state-change-metric-mutedetail--aws-docs-cloudwatch-and-eventbridge.json", "muted by"),
        (
            "eb-alarm-state-change-composite-suppressed-mutedetail--aws-docs-cloudwatch-and-eventbridge.json",
            "actions are suppressed (WaitPeriod)",
        ),
    ],
)
def test_a_suppressed_or_muted_alarm_changes_nothing(gpu_fleet: Fleet, name: str, reason: str) -> None:
    proc = invoke_function("scaler", gpu_fleet, _retargeted(name, gpu_fleet))
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout[proc.stdout.index('{\n  "results"') :])
    [d] = [d for r in result["results"] for d in r["decisions"]]
    assert d["group"] == "asg:train-spot" and d["action"] == "hold" and reason in d["reason"]
    assert gpu_fleet.desired() == 2


@pytest.mark.integration
def test_a_suppressed_alarm_delivered_as_an_alarm_action_changes_nothing(gpu_fleet: Fleet) -> None:
    event = json.loads((REAL / "lambda-alarm-action-composite--powertools-python.json").read_text())
    event["alarmArn"] = "arn:aws:cloudwatch:us-east-1:123456789012:alarm:gpufleet-train-gpu-high"
    data = event["alarmData"]
    data["alarmName"] = "gpufleet-train-gpu-high"
    data["state"].update(value="ALARM", actionsSuppressedBy="ExtensionPeriod")
    data["configuration"] = {
        "metrics": [{"metricStat": {"metric": {"dimensions": {"AutoScalingGroupName": "train-spot"}}}}]
    }
    path = gpu_fleet.policy_path.parent / "suppressed-action.json"
    path.write_text(json.dumps(event))
    gpu_fleet.alarm_state("gpufleet-train-gpu-high", "ALARM")  # in ALARM in CloudWatch too, its actions suppressed
    proc = invoke_function("scaler", gpu_fleet, at_home(path, path.parent))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "actions are suppressed (ExtensionPeriod)" in proc.stdout and gpu_fleet.desired() == 2
