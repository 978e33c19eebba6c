"""`gpufleet local send`: deliver an event the way the deployed stack would - to the functions whose
EventBridge rules in template.yaml match it (the template's own patterns, parameters resolved to their
defaults or to what `--param` says), in-process. An event no rule matches is not delivered, as on AWS.

Local tooling: it reads the template with the SAM translator's YAML reader (a dev dependency, not in the
Lambda layer).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpufleet.events.patterns import matches


@dataclass(frozen=True)
class EventRule:
    function: str  # the name under functions/, e.g. "scaler"
    name: str  # the event source's logical name in the template, e.g. "AlarmStateChange"
    pattern: dict[str, Any]


def resolve(node: Any, refs: Mapping[str, str], arns: Mapping[str, str] | None = None) -> Any:
    """`{"Ref": X}` -> refs[X] and `{"Fn::GetAtt": [X, "Arn"]}` -> arns[X], at any depth; what is not
    known stays as it is."""
    if isinstance(node, dict):
        if set(node) == {"Ref"} and node["Ref"] in refs:
            return refs[node["Ref"]]
        if set(node) == {"Fn::GetAtt"} and node["Fn::GetAtt"][1] == "Arn" and node["Fn::GetAtt"][0] in (arns or {}):
            return (arns or {})[node["Fn::GetAtt"][0]]
        return {k: resolve(v, refs, arns) for k, v in node.items()}
    if isinstance(node, list):
        return [resolve(v, refs, arns) for v in node]
    return node


def load_template(template: Path, overrides: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """The template (intrinsic functions as `{"Ref": ...}` mappings) and its parameters: defaults, then
    `overrides`."""
    from samtranslator.yaml_helper import yaml_parse

    doc: dict[str, Any] = yaml_parse(template.read_text())
    parameters = {name: str(p.get("Default", "")) for name, p in doc.get("Parameters", {}).items()}
    return doc, {**parameters, **(overrides or {})}


def template_rules(template: Path, overrides: dict[str, str] | None = None) -> list[EventRule]:
    """Every EventBridge rule of every function in the template, parameters resolved."""
    doc, parameters = load_template(template, overrides)
    rules = []
    for resource in doc.get("Resources", {}).values():
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        props = resource.get("Properties", {})
        function = Path(str(props.get("CodeUri", ""))).name
        for name, source in props.get("Events", {}).items():
            if source.get("Type") in ("EventBridgeRule", "CloudWatchEvent"):
                pattern = resolve(source.get("Properties", {}).get("Pattern", {}), parameters)
                rules.append(EventRule(function=function, name=name, pattern=pattern))
    return rules


def sqs_event(messages: list[dict[str, Any]], queue_arn: str, region: str = "us-east-1") -> dict[str, Any]:
    """Received SQS messages in the shape Lambda's SQS event source delivers them to a function."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m["MD5OfBody"],
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": region,
            }
            for m in messages
        ]
    }


@dataclass(frozen=True)
class DirectRoute:
    """A way the stack hands events to a function without EventBridge (a Lambda permission, an SQS event
    source, a schedule's input): `local send` cannot route those, so it names the `invoke` that runs one."""

    function: str
    via: str  # the template's name for it, e.g. "ScalerAlarmActionPermission"
    shape: str  # a key of DIRECT_SHAPES
    key: str = ""  # a schedule's input "gpufleet" value; an event with another one is not its


DIRECT_SHAPES = {  # shape -> what it is and who delivers it, for the 'not delivered' line
    "alarm-action": "a CloudWatch alarm action's payload: CloudWatch invokes the function directly",
    "sns": "an SNS notification: the topic invokes the function directly",
    "sqs": "an SQS batch: Lambda's event source hands the queue's messages to the function",
    "termination": "an Auto Scaling termination request: Auto Scaling invokes the function directly",
    "schedule": "an EventBridge Scheduler payload: each schedule invokes its function directly",
}
_PRINCIPALS = {"lambda.alarms.cloudwatch.amazonaws.com": "alarm-action", "sns.amazonaws.com": "sns"}


def direct_shape(event: Any) -> tuple[str, str] | None:
    """(shape, key) of an event that reaches a function without EventBridge, by the fields its sender
    always sets; None for anything else."""
    if not isinstance(event, dict):
        return None
    records = event.get("Records")
    first = records[0] if isinstance(records, list) and records and isinstance(records[0], dict) else {}
    if first.get("EventSource") == "aws:sns":
        return "sns", ""
    if first.get("eventSource") == "aws:sqs":
        return "sqs", ""
    if "alarmData" in event and "alarmArn" in event:
        return "alarm-action", ""
    if "CapacityToTerminate" in event and "AutoScalingGroupARN" in event:
        return "termination", ""
    if isinstance(event.get("gpufleet"), str):
        return "schedule", event["gpufleet"]
    return None


def direct_routes(template: Path, overrides: Mapping[str, str] | None = None) -> list[DirectRoute]:
    """Every non-EventBridge way in, from the template: Lambda permissions by principal, SQS event
    sources, schedules with an input."""
    resources: dict[str, Any] = load_template(template, overrides)[0].get("Resources", {})

    def code(logical: str) -> str:
        return Path(str(resources.get(logical, {}).get("Properties", {}).get("CodeUri", logical))).name

    routes = []
    for name, r in resources.items():
        props = r.get("Properties", {})
        if r.get("Type") == "AWS::Lambda::Permission":
            principal, target = str(props.get("Principal")), props.get("FunctionName")
            shape = _PRINCIPALS.get(principal, "termination" if "AWSServiceRoleForAutoScaling" in principal else "")
            logical = (target.get("Ref") or target.get("Fn::GetAtt", [""])[0]) if isinstance(target, dict) else ""
            if shape and logical:
                routes.append(DirectRoute(code(logical), name, shape))
        if r.get("Type") != "AWS::Serverless::Function":
            continue
        for event_name, source in props.get("Events", {}).items():
            given = source.get("Properties", {})
            if source.get("Type") == "SQS":
                routes.append(DirectRoute(code(name), f"{name}.{event_name}", "sqs"))
            elif source.get("Type") == "ScheduleV2" and "Input" in given:
                key = str(json.loads(given["Input"]).get("gpufleet", ""))
                routes.append(DirectRoute(code(name), f"{name}.{event_name}", "schedule", key))
    return routes


def routes_for(event: Any, routes: list[DirectRoute]) -> list[DirectRoute]:
    found = direct_shape(event)
    return [r for r in routes if found and (r.shape, r.key) == found]


def rules_matching(event: Any, rules: list[EventRule]) -> list[EventRule]:
    return [r for r in rules if matches(r.pattern, event)]


def describe(event: Any) -> str:
    """What a rule would look at, for the 'not delivered' line."""
    if not isinstance(event, dict):
        return f"a {type(event).__name__}, not an EventBridge event"
    raw = event.get("detail")
    detail: dict[str, Any] = raw if isinstance(raw, dict) else {}
    alarm = f", alarmName {detail['alarmName']!r}" if "alarmName" in detail else ""
    return f"source {event.get('source')!r}, detail-type {event.get('detail-type')!r}{alarm}"


_WHAT = {  # resource type -> what it is for a reader deciding to deploy
    "AWS::Serverless::Function": "Lambda functions (python3.13, arm64)",
    "AWS::Serverless::LayerVersion": "Lambda layers",
    "AWS::DynamoDB::Table": "DynamoDB tables (state retained on delete)",
    "AWS::SSM::Parameter": "SSM parameter (the fleet policy)",
    "AWS::SQS::Queue": "SQS queues",
    "AWS::SQS::QueuePolicy": "SQS queue policies",
    "AWS::SNS::Topic": "SNS topics",
    "AWS::SNS::Subscription": "SNS subscriptions",
    "AWS::CloudWatch::Alarm": "CloudWatch alarms",
    "AWS::CloudWatch::Dashboard": "CloudWatch dashboards",
    "AWS::Logs::LogGroup": "CloudWatch Logs groups (usage records, retained on delete)",
    "AWS::IAM::Role": "IAM roles declared (SAM adds one for each function without)",
    "AWS::IAM::ManagedPolicy": "IAM managed policies",
    "AWS::EKS::AccessEntry": "EKS access entries (one per name in EksClusters)",
    "AWS::Lambda::Permission": "Lambda invoke permissions",
    "EventBridgeRule": "EventBridge rules",
    "ScheduleV2": "EventBridge Scheduler schedules",
    "SQS": "SQS event source mappings",
}


def stack_resources(template: Path) -> list[str]:
    """The 'what the stack creates' table (docs/deploy.md; the README's summary), counted from the
    template (a test keeps them equal)."""
    resources = load_template(template)[0].get("Resources", {})
    found: dict[str, list[str]] = {}
    for name, r in resources.items():
        label = f"{name} (if {r['Condition']})" if "Condition" in r else name
        found.setdefault(r["Type"], []).append(label)
        for event_name, event in r.get("Properties", {}).get("Events", {}).items():
            found.setdefault(event["Type"], []).append(f"{name}.{event_name}")
    rows = ["| what | count | names |", "|---|---:|---|"]
    for kind in sorted(found, key=lambda k: list(_WHAT).index(k) if k in _WHAT else len(_WHAT)):
        rows.append(f"| {_WHAT.get(kind, kind)} | {len(found[kind])} | {', '.join(found[kind])} |")
    return rows


def batch_failures(response: Any, message_ids: list[str]) -> list[str]:
    """The records Lambda's SQS event source leaves on the queue after a function with
    ReportBatchItemFailures answers `response`; the others it deletes. As AWS documents it
    (https://docs.aws.amazon.com/lambda/latest/dg/services-sqs-errorhandling.html): no answer, an empty
    one or an empty `batchItemFailures` is a success for every record; an item whose `itemIdentifier` is
    missing, empty or not a message of the batch makes the whole batch a failure."""
    if not isinstance(response, dict) or not response.get("batchItemFailures"):
        return []
    items = response["batchItemFailures"]
    if not isinstance(items, list):
        return list(message_ids)
    failed = [item.get("itemIdentifier") if isinstance(item, dict) else None for item in items]
    if any(not isinstance(f, str) or f not in message_ids for f in failed):
        return list(message_ids)
    return [m for m in message_ids if m in failed]


def failure_reasons(module: Any) -> dict[str, str]:
    """Why each record failed, by message id, from the Powertools batch processor the function's app.py
    keeps as `processor` (it holds the failed records and their exceptions until the next batch)."""
    processor = getattr(module, "processor", None)
    pairs = zip(getattr(processor, "fail_messages", []), getattr(processor, "exceptions", []), strict=False)
    return {str(getattr(r, "message_id", "")): f"{e[0].__name__}: {e[1]}" for r, e in pairs if e and e[0]}
