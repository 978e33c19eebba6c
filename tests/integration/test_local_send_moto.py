"""`gpufleet local send` on moto server: a real EventBridge alarm event (AWS's documentation sample) whose
name lacks the stack's prefix is not delivered - the template's rule pattern decides, as on AWS - and the
same event named with the prefix is delivered to the scaler, which acts on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import Fleet
from tests.integration.test_invoke_events import ROOT, gpufleet, on_fleet

pytestmark = pytest.mark.integration

REAL = ROOT / "tests" / "fixtures" / "real_events" / "eb-alarm-state-change-metric--awsdocs-cloudwatch-user-guide.json"


def send(fleet: Fleet, event: Path, *extra: str) -> tuple[int, str, str]:
    proc = gpufleet("local", "send", str(event), *on_fleet(fleet), *extra)
    return proc.returncode, proc.stdout, proc.stderr


def test_an_alarm_without_the_prefix_is_not_delivered_one_with_it_is(gpu_fleet: Fleet, tmp_path: Path) -> None:
    code, out, err = send(gpu_fleet, REAL)
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"not delivered: no EventBridge rule in {ROOT / 'template.yaml'} matches (source 'aws.cloudwatch', "
        "detail-type 'CloudWatch Alarm State Change', alarmName 'ServerCpuTooHigh')"
    ]
    event = json.loads(REAL.read_text())
    event["detail"]["alarmName"] = "gpufleet-train-spot-high"
    event["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["dimensions"] = {
        "AutoScalingGroupName": "train-spot"
    }
    event["detail"]["configuration"]["metrics"][0]["metricStat"]["metric"]["namespace"] = "GPUFleet"
    named = tmp_path / "named.json"
    named.write_text(json.dumps(event))
    gpu_fleet.policy_path.write_text(
        gpu_fleet.policy_path.read_text() + "alarms: [{alarm: 'gpufleet-train-spot-*', direction: out}]\n"
    )
    before = gpu_fleet.desired()
    code, out, err = send(gpu_fleet, named, "--param", "AlarmNamePrefix=gpufleet-")
    assert code == 0, err
    assert "delivered to scaler (rule AlarmStateChange)" in err
    [delivery] = json.loads(out)["delivered_to"]  # stdout is one JSON document; the logs are on stderr
    assert (delivery["function"], delivery["rule"], delivery["already_handled"]) == ("scaler", "AlarmStateChange", [])
    [decision] = [d for r in delivery["result"]["results"] for d in r["decisions"]]
    assert decision["group"] == "asg:train-spot" and gpu_fleet.desired() == before + 1, decision
