"""Each function's IAM role as deployed: template.yaml expanded by the SAM translator (what `sam validate`
and CloudFormation's transform do), intrinsic functions resolved with the test account's physical names,
AWS managed policies the roles attach replaced by their documents."""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

from rehearsal.calls import ACCOUNT, REGION

ROOT = Path(__file__).resolve().parents[2]
# What moto-based tests and the rehearsal call their resources (rehearsal.fleet).
PHYSICAL = {
    "StateTable": {"Ref": "gpufleet-state", "Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-state"},
    "BusyTable": {"Ref": "gpufleet-busy", "Arn": f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/gpufleet-busy"},
    "NotificationQueue": {"QueueName": "gpufleet-notify", "Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-notify"},
    "NotificationDLQ": {
        "QueueName": "gpufleet-notify-dlq",
        "Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-notify-dlq",
    },
    "ScalerDLQ": {"QueueName": "gpufleet-scaler-dlq", "Arn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:gpufleet-scaler-dlq"},
    "NotificationTopic": {
        "Ref": f"arn:aws:sns:{REGION}:{ACCOUNT}:gpufleet-notifications",
        "TopicName": "gpufleet-notifications",
    },
}
PARAMETERS = {  # a moto secret ARN ends in a random six-character suffix
    "SlackSecretArn": f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:gpufleet/slack-??????",
}
MANAGED = {  # the AWS managed policies SAM attaches, as AWS publishes them
    "AWSLambdaVPCAccessExecutionRole": [  # the scaler's, only with ScalerSubnetIds (a private EKS endpoint)
        {
            "Sid": "AWSLambdaVPCAccessExecutionPermissions",
            "Effect": "Allow",
            "Action": [
                "logs:CreateLogGroup",
                "logs:CreateLogStream",
                "logs:PutLogEvents",
                "ec2:CreateNetworkInterface",
                "ec2:DescribeNetworkInterfaces",
                "ec2:DescribeSubnets",
                "ec2:DeleteNetworkInterface",
                "ec2:AssignPrivateIpAddresses",
                "ec2:UnassignPrivateIpAddresses",
            ],
            "Resource": "*",
        }
    ],
    "AWSLambdaBasicExecutionRole": [
        {
            "Effect": "Allow",
            "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
            "Resource": "*",
        }
    ],
    "AWSXrayWriteOnlyAccess": [
        {
            "Effect": "Allow",
            "Action": [
                "xray:PutTraceSegments",
                "xray:PutTelemetryRecords",
                "xray:GetSamplingRules",
                "xray:GetSamplingTargets",
                "xray:GetSamplingStatisticSummaries",
            ],
            "Resource": "*",
        }
    ],
    "AWSLambdaSQSQueueExecutionRole": [
        {
            "Sid": "AWSLambdaSQSQueueExecutionRole",
            "Effect": "Allow",
            "Action": ["sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"],
            "Resource": "*",
        }
    ],
}


class _Resolver:
    def __init__(self, template: Mapping[str, Any], parameters: Mapping[str, str]) -> None:
        self.template = template
        self.params = {
            name: str(spec.get("Default", "")) for name, spec in template.get("Parameters", {}).items()
        } | dict(parameters)
        self.params |= {
            "AWS::Region": REGION,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::StackName": "gpufleet",
        }

    def condition(self, name: str) -> bool:
        return bool(self(self.template["Conditions"][name]))

    def __call__(self, node: Any) -> Any:
        if isinstance(node, list):
            return [x for x in (self(n) for n in node) if x is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((fn, arg),) = node.items()
            handler = _FUNCTIONS.get(fn)
            if handler is not None:
                return handler(self, arg)
        return {k: v for k, v in ((k, self(v)) for k, v in node.items()) if v is not _NO_VALUE}

    def ref(self, name: str) -> Any:
        if name == "AWS::NoValue":
            return _NO_VALUE
        if name in self.params:
            return self.params[name]
        return PHYSICAL.get(name, {}).get("Ref", name)

    def sub(self, arg: Any) -> str:
        text, extra = (arg, {}) if isinstance(arg, str) else (arg[0], {k: self(v) for k, v in arg[1].items()})

        def one(m: re.Match[str]) -> str:
            name = m.group(1)
            if name in extra:
                return str(extra[name])
            if "." in name:
                res, attr = name.split(".", 1)
                return str(PHYSICAL[res][attr])
            return str(self.ref(name))

        return re.sub(r"\$\{([^}]+)\}", one, text)


_NO_VALUE = object()
_FUNCTIONS: dict[str, Any] = {
    "Ref": lambda r, a: r.ref(a),
    "Fn::GetAtt": lambda r, a: PHYSICAL[a[0] if isinstance(a, list) else a.split(".")[0]][
        a[1] if isinstance(a, list) else a.split(".", 1)[1]
    ],
    "Fn::Sub": lambda r, a: r.sub(a),
    "Fn::If": lambda r, a: r(a[1]) if r.condition(a[0]) else r(a[2]),
    "Fn::Equals": lambda r, a: r(a[0]) == r(a[1]),
    "Fn::Not": lambda r, a: not r(a[0]),
    "Fn::Join": lambda r, a: a[0].join(str(x) for x in r(a[1])),
    "Condition": lambda r, a: r.condition(a),
}


def expand(template_text: str) -> dict[str, Any]:
    """The CloudFormation the SAM transform produces (code locations replaced as `sam validate` does)."""
    doc = yaml_parse(template_text)
    for res in doc["Resources"].values():
        props = res.get("Properties", {})
        for key in ("CodeUri", "ContentUri"):
            if key in props:
                props[key] = "s3://bucket/key"

    class _NoManagedPolicies:
        def load(self) -> dict[str, str]:
            return {}

    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)
    return dict(transform(doc, {}, _NoManagedPolicies()))


def function_statements(
    template_text: str | None = None, parameters: Mapping[str, str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """functions/<name> -> every statement of its role (inline and managed), intrinsics resolved."""
    text = template_text if template_text is not None else (ROOT / "template.yaml").read_text()
    original = yaml_parse(text)
    expanded = expand(text)
    resolve = _Resolver(original, PARAMETERS | dict(parameters or {}))
    out = {}
    for logical, res in original["Resources"].items():
        if res["Type"] != "AWS::Serverless::Function":
            continue
        name = Path(res["Properties"]["CodeUri"]).name
        role_ref = res["Properties"].get("Role")
        role_id = role_ref["Fn::GetAtt"][0] if isinstance(role_ref, dict) else f"{logical}Role"
        role = resolve(copy.deepcopy(expanded["Resources"][role_id]["Properties"]))
        statements = [s for p in role.get("Policies", []) for s in _list(p["PolicyDocument"]["Statement"])]
        for arn in role.get("ManagedPolicyArns", []):
            statements += MANAGED[str(arn).rsplit("/", 1)[-1]]
        out[name] = statements
    return out


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def node_policy_statements() -> list[dict[str, Any]]:
    """The template's NodePublisherPolicy statements, intrinsics resolved (the usage group's ARN named)."""
    original = yaml_parse((ROOT / "template.yaml").read_text())
    physical = dict(PHYSICAL, UsageLogGroup={"Arn": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:/gpufleet/usage"})
    saved = copy.deepcopy(PHYSICAL)
    PHYSICAL.update(physical)
    try:
        doc = _Resolver(original, PARAMETERS)(original["Resources"]["NodePublisherPolicy"]["Properties"])
    finally:
        PHYSICAL.clear()
        PHYSICAL.update(saved)
    statements: list[dict[str, Any]] = doc["PolicyDocument"]["Statement"]
    return statements
