"""`gpufleet local up | down`: the stack on your machine, with no AWS account - moto server on 127.0.0.1
and what template.yaml would create for the functions to run against (the state table, queues and DLQs,
topic and policy parameter, read from the template, not from a second list), then the environment the
template gives the functions, printed as `export` lines. `--example` adds a tagged training ASG, its two
scaling alarms and a policy for it.

Local tooling (moto and the SAM translator's YAML reader are dev dependencies, not in the Lambda layer).
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpufleet.domain import defaults
from gpufleet.domain.models import GroupKind, GroupRef
from gpufleet_tools.alarm_specs import put_metric_alarm_args, scaling_alarms
from gpufleet_tools.local import load_template, resolve
from gpufleet_tools.session import client

REGION = "us-east-1"
STACK = "gpufleet"
STATE_DIR = Path(".gpufleet-local")
EXAMPLE_POLICY = """\
version: 1
dry_run: false
groups:
  - {name: train-spot, kind: asg, max: 6, scale_out_step: 2, target: {low: 30, high: 85}}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_moto(state_dir: Path, port: int = 0) -> str:
    """moto server in its own session (it outlives this command); its pid and log in `state_dir`."""
    state_dir.mkdir(exist_ok=True)
    port = port or _free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(state_dir / "moto.log", "w")  # noqa: SIM115 (the server keeps it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    (state_dir / "moto.pid").write_text(str(proc.pid))
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
            return url
        except OSError:
            if proc.poll() is not None:
                raise SystemExit(f"error: moto server exited (see {state_dir / 'moto.log'})") from None
            time.sleep(0.05)
    raise SystemExit(f"error: moto server did not answer on {url}")


def stop(state_dir: Path) -> bool:
    pid_file = state_dir / "moto.pid"
    if not pid_file.exists():
        return False
    with contextlib.suppress(ProcessLookupError):  # already gone
        os.killpg(int(pid_file.read_text()), signal.SIGTERM)
    for leftover in state_dir.iterdir():
        leftover.unlink()
    state_dir.rmdir()
    return True


def _client(service: str, endpoint: str) -> Any:
    return client(service, endpoint, REGION)


def _make(logical: str, resource: dict[str, Any], endpoint: str) -> dict[str, str] | None:
    """One resource the functions use, named `gpufleet-<LogicalId>`: what !Ref and !GetAtt .Arn give."""
    kind, props, name = resource["Type"], resource.get("Properties", {}), f"{STACK}-{logical}"
    if kind == "AWS::DynamoDB::Table":
        ddb = _client("dynamodb", endpoint)
        table = ddb.create_table(
            TableName=name,
            KeySchema=props["KeySchema"],
            AttributeDefinitions=props["AttributeDefinitions"],
            BillingMode=props.get("BillingMode", "PAY_PER_REQUEST"),
        )["TableDescription"]
        if props.get("TimeToLiveSpecification", {}).get("Enabled"):
            spec = {"AttributeName": props["TimeToLiveSpecification"]["AttributeName"], "Enabled": True}
            ddb.update_time_to_live(TableName=name, TimeToLiveSpecification=spec)
        return {"ref": name, "arn": table["TableArn"]}
    if kind == "AWS::SQS::Queue":
        sqs = _client("sqs", endpoint)
        url = sqs.create_queue(QueueName=name)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        return {"ref": url, "arn": arn}
    if kind == "AWS::SNS::Topic":
        arn = _client("sns", endpoint).create_topic(Name=name)["TopicArn"]
        return {"ref": arn, "arn": arn}
    if kind == "AWS::Logs::LogGroup":  # the nodes' usage records: the template names it
        group = props.get("LogGroupName", name)
        logs = _client("logs", endpoint)
        logs.create_log_group(logGroupName=group)
        arn = logs.describe_log_groups(logGroupNamePrefix=group)["logGroups"][0]["arn"]
        return {"ref": group, "arn": arn}
    return None


def create_stack(template: Path, endpoint: str) -> dict[str, str]:
    """The template's data resources in moto, and the functions' environment (Globals and every
    function's variables, references resolved); an empty value (an unset parameter) is left out."""
    doc, params = load_template(template)
    resources: dict[str, Any] = doc.get("Resources", {})
    made = {n: m for n, r in resources.items() if (m := _make(n, r, endpoint)) is not None}
    refs = {**params, **{n: m["ref"] for n, m in made.items()}}
    arns = {n: m["arn"] for n, m in made.items()}
    for n, r in resources.items():  # redrive policies name queues made above
        redrive = r.get("Properties", {}).get("RedrivePolicy")
        if r["Type"] == "AWS::SQS::Queue" and redrive:
            body = json.dumps(resolve(redrive, refs, arns))
            _client("sqs", endpoint).set_queue_attributes(QueueUrl=made[n]["ref"], Attributes={"RedrivePolicy": body})
    for r in resources.values():
        if r["Type"] == "AWS::SSM::Parameter":
            props = resolve(r["Properties"], refs)
            _client("ssm", endpoint).put_parameter(
                Name=props["Name"], Value=props["Value"], Type="String", Overwrite=True
            )
    env: dict[str, str] = {}
    blocks = [doc.get("Globals", {}).get("Function", {})]
    blocks += [r["Properties"] for r in resources.values() if r["Type"] == "AWS::Serverless::Function"]
    for block in blocks:
        for key, node in block.get("Environment", {}).get("Variables", {}).items():
            value = resolve(node, refs, arns)
            if isinstance(value, str | int | float) and str(value) and key != "POWERTOOLS_SERVICE_NAME":
                env[key] = str(value)
    return env


def create_example(endpoint: str, env: dict[str, str], state_dir: Path) -> Path:
    """A tagged 2-node training ASG, its scale-out/in alarms (tagged with their direction), and a policy for
    it in the policy parameter and in `state_dir/policy.yaml`."""
    ec2, autoscaling = _client("ec2", endpoint), _client("autoscaling", endpoint)
    image = ec2.describe_images()["Images"][0]["ImageId"]
    ec2.create_launch_template(
        LaunchTemplateName="gpufleet-example", LaunchTemplateData={"ImageId": image, "InstanceType": "g5.12xlarge"}
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="train-spot",
        LaunchTemplate={"LaunchTemplateName": "gpufleet-example", "Version": "$Latest"},
        MinSize=0,
        MaxSize=8,
        DesiredCapacity=2,
        AvailabilityZones=[f"{REGION}a"],
        Tags=[
            {
                "Key": defaults.TAG_MANAGED,
                "Value": defaults.TAG_MANAGED_VALUE,
                "PropagateAtLaunch": True,
                "ResourceId": "train-spot",
                "ResourceType": "auto-scaling-group",
            }
        ],
    )
    cloudwatch = _client("cloudwatch", endpoint)
    ref = GroupRef(kind=GroupKind.ASG, name="train-spot")
    prefix = env.get(defaults.ENV_ALARM_PREFIX, defaults.DEFAULT_ALARM_PREFIX)
    for spec in scaling_alarms(ref, prefix, stem="train"):  # the names events/scaler's samples carry
        cloudwatch.put_metric_alarm(**put_metric_alarm_args(spec))
    policy = state_dir / "policy.yaml"
    policy.write_text(EXAMPLE_POLICY)
    parameter = env.get(defaults.ENV_POLICY_PARAMETER)
    if parameter:
        _client("ssm", endpoint).put_parameter(Name=parameter, Value=EXAMPLE_POLICY, Type="String", Overwrite=True)
    return policy


def exports(env: dict[str, str], endpoint: str) -> list[str]:
    """`export` lines for a shell: the endpoint, moto's fake credentials, the functions' environment."""
    base = {
        defaults.ENV_ENDPOINT_URL: endpoint,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    return [f"export {k}={shlex.quote(v)}" for k, v in {**base, **env}.items()]
