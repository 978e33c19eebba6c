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
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupRef
from gpufleet_tools.alarm_specs import put_metric_alarm_args, scaling_alarms
from gpufleet_tools.local import load_template, resolve
from gpufleet_tools.local_servers import await_answer, free_port
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


def start_moto(state_dir: Path, port: int = 0) -> str:
    """moto server in its own session (it outlives this command); its pid and log in `state_dir`."""
    state_dir.mkdir(exist_ok=True)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(state_dir / "moto.log", "w")  # noqa: SIM115 (the server keeps it)
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    (state_dir / "moto.pid").write_text(str(proc.pid))
    await_answer(f"{url}/moto-api/", proc, "moto server", state_dir / "moto.log")
    return url


def stop(state_dir: Path) -> bool:
    from gpufleet_tools import local_kube

    pid_file = state_dir / "moto.pid"
    if not pid_file.exists():
        return False
    local_kube.stop_all(state_dir)
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
        if "TableName" in props:  # the busy table: a fixed name the nodes know, made once per server
            name = props["TableName"]
            with contextlib.suppress(ddb.exceptions.ResourceNotFoundException):
                return {"ref": name, "arn": ddb.describe_table(TableName=name)["Table"]["TableArn"]}
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
        url = sqs.create_queue(QueueName=name, Attributes=queue_attributes(props))["QueueUrl"]
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


_NOT_ATTRIBUTES = {"QueueName", "Tags"}  # AWS::SQS::Queue properties that are not SQS queue attributes
_LATER = {"RedrivePolicy", "RedriveAllowPolicy"}  # they name other queues: set once those exist


def queue_attributes(
    props: dict[str, Any], refs: dict[str, str] | None = None, arns: dict[str, str] | None = None
) -> dict[str, str]:
    """An AWS::SQS::Queue's properties as SQS CreateQueue/SetQueueAttributes attributes (the names are
    the same: VisibilityTimeout, MessageRetentionPeriod, SqsManagedSseEnabled, ...), so the local queue
    behaves as the template's: a 720 s visibility, not SQS's 30 s default, keeps a record away while its
    invocation runs. Without `arns` the redrive policies are left out (their targets may not exist yet);
    with them, only those, references resolved, as SQS takes them (JSON text)."""
    out = {}
    for key, value in props.items():
        if key in _NOT_ATTRIBUTES or (key in _LATER) != (arns is not None):
            continue
        if isinstance(value, bool):
            out[key] = str(value).lower()
        elif isinstance(value, dict):
            out[key] = json.dumps(resolve(value, refs or {}, arns))
        else:
            out[key] = str(value)
    return out


def create_stack(template: Path, endpoint: str) -> dict[str, str]:
    """The template's data resources in moto, and the functions' environment (Globals and every
    function's variables, references resolved); an empty value (an unset parameter) is left out."""
    doc, params = load_template(template)
    resources: dict[str, Any] = doc.get("Resources", {})
    made = {n: m for n, r in resources.items() if (m := _make(n, r, endpoint)) is not None}
    refs = {**params, **{n: m["ref"] for n, m in made.items()}}
    arns = {n: m["arn"] for n, m in made.items()}
    for n, r in resources.items():  # redrive policies name queues made above
        later = queue_attributes(r.get("Properties", {}), refs, arns) if r["Type"] == "AWS::SQS::Queue" else {}
        if later:
            _client("sqs", endpoint).set_queue_attributes(QueueUrl=made[n]["ref"], Attributes=later)
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


def eks_backing_asg_tags(cluster: str, nodegroup: str) -> dict[str, str]:
    """The tags EKS puts on a managed node group's Auto Scaling group: the cluster and node group by name,
    and the Cluster Autoscaler's discovery tags (https://docs.aws.amazon.com/eks/latest/userguide/
    managed-node-groups.html: "tags ... so that they are configured to use the Kubernetes Cluster
    Autoscaler"). Never the node group's own tags: EKS does not copy them, so never gpufleet:managed."""
    return {
        defaults.TAG_EKS_CLUSTER: cluster,
        defaults.TAG_EKS_NODEGROUP: nodegroup,
        "k8s.io/cluster-autoscaler/enabled": "true",
        f"k8s.io/cluster-autoscaler/{cluster}": "owned",
        f"kubernetes.io/cluster/{cluster}": "owned",
    }


def _subnet(ec2: Any) -> str:
    """A subnet for local clusters and node groups (moto's default VPC has them; made when it has none)."""
    found = ec2.describe_subnets()["Subnets"]
    if found:
        return str(found[0]["SubnetId"])
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    return str(
        ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
    )


def create_nodegroup(
    endpoint: str, cluster: str, name: str, sizes: tuple[int, int, int], instance_type: str, tags: dict[str, str]
) -> str:
    """An EKS managed node group as EKS makes one: the cluster when missing, the node group (`tags` on it),
    and its backing Auto Scaling group, EKS-tagged, under the name the node group's `resources` give
    (moto names one but never makes it: EMULATED here, or every scale through it fails with a moto 500).
    `sizes`: (min, max, desired). Returns the ASG's name."""
    ec2, eks, autoscaling = (_client(s, endpoint) for s in ("ec2", "eks", "autoscaling"))
    subnet = _subnet(ec2)
    role = "arn:aws:iam::123456789012:role/gpufleet-local-node"
    if cluster not in eks.list_clusters()["clusters"]:
        eks.create_cluster(name=cluster, roleArn=role, resourcesVpcConfig={"subnetIds": [subnet]})
    low, high, desired = sizes
    ng = eks.create_nodegroup(
        clusterName=cluster,
        nodegroupName=name,
        nodeRole=role,
        subnets=[subnet],
        scalingConfig={"minSize": low, "maxSize": high, "desiredSize": desired},
        instanceTypes=[instance_type],
        tags=tags,
    )["nodegroup"]
    asg: str = ng["resources"]["autoScalingGroups"][0]["name"]
    template = f"gpufleet-local-{instance_type}"
    if not ec2.describe_launch_templates(Filters=[{"Name": "launch-template-name", "Values": [template]}])[
        "LaunchTemplates"
    ]:
        image = ec2.describe_images()["Images"][0]["ImageId"]
        data = {"ImageId": image, "InstanceType": instance_type}
        ec2.create_launch_template(LaunchTemplateName=template, LaunchTemplateData=data)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=asg,
        LaunchTemplate={"LaunchTemplateName": template, "Version": "$Latest"},
        MinSize=low,
        MaxSize=high,
        DesiredCapacity=desired,
        VPCZoneIdentifier=subnet,
        Tags=[
            {"Key": k, "Value": v, "PropagateAtLaunch": True, "ResourceId": asg, "ResourceType": "auto-scaling-group"}
            for k, v in eks_backing_asg_tags(cluster, name).items()
        ],
    )
    return asg


def sync_nodegroups(endpoint: str) -> list[str]:
    """[EMULATED EKS] each node group's desiredSize onto its backing ASG, as EKS does after
    UpdateNodegroupConfig (moto does not): one line for each group it changed."""
    return sync_nodegroup_sizes(_client("eks", endpoint), _client("autoscaling", endpoint))


def sync_nodegroup_sizes(eks: Any, autoscaling: Any) -> list[str]:
    """`sync_nodegroups` with the clients given (the rehearsal's)."""
    notes = []
    for cluster in eks.list_clusters()["clusters"]:
        for name in eks.list_nodegroups(clusterName=cluster)["nodegroups"]:
            ng = eks.describe_nodegroup(clusterName=cluster, nodegroupName=name)["nodegroup"]
            asg = ng["resources"]["autoScalingGroups"][0]["name"]
            found = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[asg])["AutoScalingGroups"]
            want = ng["scalingConfig"]["desiredSize"]
            if found and found[0]["DesiredCapacity"] != want:
                autoscaling.set_desired_capacity(AutoScalingGroupName=asg, DesiredCapacity=want)
                notes.append(f"[emulated EKS] {cluster}/{name}: backing ASG {found[0]['DesiredCapacity']} -> {want}")
    return notes


ONCALL_QUEUE = "gpufleet-local-oncall"  # the local stand-in for on-call's SNS subscription (email, pager)


def subscribe_oncall(endpoint: str, topic_arn: str) -> str:
    """A queue subscribed to the notification topic: what on-call's subscription would receive lands there
    (moto delivers SNS to SQS), for `gpufleet local oncall` to read."""
    sqs = _client("sqs", endpoint)
    url = sqs.create_queue(QueueName=ONCALL_QUEUE)["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    _client("sns", endpoint).subscribe(TopicArn=topic_arn, Protocol="sqs", Endpoint=arn)
    return str(url)


def read_oncall(endpoint: str) -> list[dict[str, str]]:
    """What the topic published since the last read ({subject, message}, oldest first), taken off the queue."""
    sqs = _client("sqs", endpoint)
    url = sqs.get_queue_url(QueueName=ONCALL_QUEUE)["QueueUrl"]
    out = []
    while batch := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
        for m in batch:
            envelope = json.loads(m["Body"])
            out.append({"subject": str(envelope.get("Subject") or ""), "message": str(envelope.get("Message", ""))})
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return out
