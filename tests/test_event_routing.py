"""Which function an event reaches is decided by the template's EventBridge rules, not by the samples:
every EventBridge-shaped sample in events/<function>/ must be matched by one of that function's rules
(so a rule that would never fire on AWS fails here), and real events other services send must not reach
a function they are not for. This is how the spot_watch rule for interruptions and Capacity Blocks was
found missing: the samples invoked fine, the stack would never have delivered them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet_tools.local import rules_matching, template_rules

ROOT = Path(__file__).resolve().parents[1]
RULES = template_rules(ROOT / "template.yaml")
RULE_SOURCES = {"aws.cloudwatch", "aws.autoscaling", "aws.ec2"}  # scheduled events come from Scheduler


def samples() -> list[tuple[str, Path]]:
    found = []
    for path in sorted((ROOT / "events").glob("*/*.json")):
        if path.name.startswith("bad-"):
            continue
        event = json.loads(path.read_text())
        if isinstance(event, dict) and event.get("source") in RULE_SOURCES and "detail-type" in event:
            found.append((path.parent.name, path))
    return found


@pytest.mark.parametrize(("function", "path"), samples(), ids=lambda v: getattr(v, "name", v))
def test_every_eventbridge_sample_reaches_its_function_by_the_templates_rules(function: str, path: Path) -> None:
    targets = {r.function for r in rules_matching(json.loads(path.read_text()), RULES)}
    assert function in targets, f"no {function} rule in template.yaml matches {path.name} (reached: {targets})"


def test_the_rules_cover_every_function_that_takes_eventbridge_events() -> None:
    assert {r.function for r in RULES} == {"scaler", "oom_guard", "spot_watch"}
    assert {f for f, _ in samples()} == {"scaler", "oom_guard", "spot_watch"}


def test_an_alarm_named_without_the_prefix_reaches_no_function() -> None:
    real = (
        ROOT / "tests" / "fixtures" / "real_events" / "eb-alarm-state-change-metric--awsdocs-cloudwatch-user-guide.json"
    )
    event = json.loads(real.read_text())
    assert rules_matching(event, RULES) == []
    event["detail"]["alarmName"] = "gpufleet-" + event["detail"]["alarmName"]
    assert [r.function for r in rules_matching(event, RULES)] == ["scaler"]
    assert [
        r.function for r in rules_matching(event, template_rules(ROOT / "template.yaml", {"AlarmNamePrefix": "x"}))
    ] == []
