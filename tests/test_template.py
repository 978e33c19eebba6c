"""template.yaml facts that must hold, and the architecture of what `sam build` produced."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.domain import defaults
from gpufleet_node import schema

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / ".aws-sam" / "build"
EM_AARCH64 = 183


class _CfnLoader(yaml.SafeLoader):
    pass


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return {suffix: loader.construct_scalar(node)}
    if isinstance(node, yaml.SequenceNode):
        return {suffix: loader.construct_sequence(node, deep=True)}
    return {suffix: loader.construct_mapping(node, deep=True)}  # type: ignore[arg-type]


_CfnLoader.add_multi_constructor("!", _tag)


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load((ROOT / "template.yaml").read_text(), Loader=_CfnLoader)
    return loaded


def test_every_gpu_metric_named_in_the_template_is_in_the_schema(template: dict[str, Any]) -> None:
    text = (ROOT / "template.yaml").read_text()
    named = set(re.findall(r"\b(GPU[A-Z][A-Za-z]+|NVMLUp)\b", text)) - {"GPUFleet"}
    assert named, "the template names GPU metrics (alarms, dashboard)"
    assert named <= set(schema.METRICS_BY_NAME), named - set(schema.METRICS_BY_NAME)
    for name, res in template["Resources"].items():
        props = res.get("Properties", {})
        if res["Type"] == "AWS::CloudWatch::Alarm" and props.get("Namespace") == schema.NAMESPACE:
            assert props["MetricName"] in schema.METRICS_BY_NAME, name


def test_memory_alarms_cover_every_group_kind_and_wake_only_the_oom_guard(template: dict[str, Any]) -> None:
    res = template["Resources"]
    expressions = [res[n]["Properties"]["Metrics"][0]["Expression"] for n in ("AsgGpuMemoryAlarm", "EksGpuMemoryAlarm")]
    select = f"SELECT MAX({schema.GPU_MEMORY_USED_PERCENT.name}) FROM SCHEMA({schema.NAMESPACE}, "
    assert expressions == [select + "AutoScalingGroupName)", select + "ClusterName, NodegroupName)"]
    guard_rule = res["OomGuardFunction"]["Properties"]["Events"]["MemoryAlarm"]["Properties"]["Pattern"]
    assert guard_rule["detail"]["alarmName"] == [{"prefix": {"Ref": "MemoryAlarmPrefix"}}]
    assert (
        template["Parameters"]["MemoryAlarmPrefix"]["Default"] != template["Parameters"]["AlarmNamePrefix"]["Default"]
    )
    assert not template["Parameters"]["MemoryAlarmPrefix"]["Default"].startswith(
        template["Parameters"]["AlarmNamePrefix"]["Default"]
    )


def test_dashboard_body_is_valid_json_once_substituted(template: dict[str, Any]) -> None:
    body = template["Resources"]["FleetDashboard"]["Properties"]["DashboardBody"]["Sub"]
    widgets = json.loads(body.replace("${AWS::Region}", "eu-west-1"))["widgets"]
    assert [w["properties"]["title"].split(" ")[0] for w in widgets] == [
        "Fleet",
        "GPU",
        "Decisions",
        "Incidents:",
        "GPU-hours",
        "GPU-hours",
        "Host",
        "Host",
    ]
    host = set(re.findall(r"\b(Host[A-Z][A-Za-z]+)\b", body))  # the host widgets name schema metrics only
    assert host == {m.name for m in schema.HOST_METRICS}, host
    team = [w for w in widgets if "per team" in w["properties"]["title"]]
    names = {schema.TEAM_GPU_HOURS_ALLOCATED.name, schema.TEAM_GPU_HOURS_BUSY.name}
    assert {m for w in team for m in names if m in json.dumps(w)} == names
    assert all(f"{{{schema.NAMESPACE},{schema.DIM_TEAM}}}" in json.dumps(w) for w in team)


def test_runtime_is_python313_arm64_and_layers_build_for_arm64(template: dict[str, Any]) -> None:
    fn = template["Globals"]["Function"]
    assert (fn["Runtime"], fn["Architectures"]) == ("python3.13", ["arm64"])
    for name, res in template["Resources"].items():
        if res["Type"] == "AWS::Serverless::LayerVersion":
            # Each layer is built by the Makefile beside its content (what goes in, for python3.13 on arm64).
            assert res["Metadata"] == {"BuildMethod": "makefile", "BuildArchitecture": "arm64"}, name
            makefile = ROOT / res["Properties"]["ContentUri"] / "Makefile"
            assert f"build-{name}:" in makefile.read_text(), name
    assert "--python-version 3.13" in (ROOT / "layers" / "gpufleet" / "Makefile").read_text()


@pytest.mark.parametrize("function", ["ScalerFunction", "OomGuardFunction", "SpotWatchFunction"])
def test_scaling_calls_are_limited_to_tagged_resources(template: dict[str, Any], function: str) -> None:
    """Every statement of a scaling function's own policy is one of four kinds; nothing else slips in."""
    policies = template["Resources"][function]["Properties"]["Policies"]
    statements = [s for p in policies if isinstance(p, dict) and "Statement" in p for s in p["Statement"]]
    mutating = {
        "autoscaling:SetDesiredCapacity",
        "autoscaling:SetInstanceHealth",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "eks:UpdateNodegroupConfig",
        "sagemaker:UpdateCluster",
        "sagemaker:BatchDeleteClusterNodes",
        "autoscaling:SetInstanceProtection",  # the scaler keeps busy marks as protection (domain/busy.py)
    }
    for s in statements:
        actions = s["Action"] if isinstance(s["Action"], list) else [s["Action"]]
        cond = s.get("Condition", {})
        if mutating & set(actions):
            tags = cond["StringEquals"]
            assert any(k.endswith(f"ResourceTag/{defaults.TAG_MANAGED}") for k in tags), s["Sid"]
            assert set(tags.values()) == {defaults.TAG_MANAGED_VALUE}
        elif actions == ["autoscaling:CreateOrUpdateTags"]:
            # Adoption: only EKS backing groups, only our managed tag, only its one value.
            assert cond["Null"] == {"autoscaling:ResourceTag/eks:nodegroup-name": "false"}, s["Sid"]
            assert cond["ForAllValues:StringEquals"] == {"aws:TagKeys": [defaults.TAG_MANAGED]}
            assert cond["StringEquals"] == {f"aws:RequestTag/{defaults.TAG_MANAGED}": defaults.TAG_MANAGED_VALUE}
        elif actions == ["iam:PassRole"]:
            # UpdateCluster sends the group's ExecutionRole back: passing it, to SageMaker only.
            assert cond == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}, s["Sid"]
        elif s["Resource"] == {"Fn::GetAtt": ["BusyTable", "Arn"]} or s["Resource"] == {"GetAtt": "BusyTable.Arn"}:
            # The busy table (queue workers' marks): read whole; the scaler also writes its own records there.
            assert set(actions) <= {"dynamodb:Scan", "dynamodb:PutItem", "dynamodb:DeleteItem"}, s["Sid"]
            assert set(actions) == {"dynamodb:Scan"} or function == "ScalerFunction", s["Sid"]
        elif all(a.startswith("dynamodb:") for a in actions):
            # State: only items under the function's own leading keys, and never a Scan.
            assert "dynamodb:Scan" not in actions, s["Sid"]
            assert cond["Null"] == {"dynamodb:LeadingKeys": "false"}, s["Sid"]
            keys = cond["ForAllValues:StringLike"]["dynamodb:LeadingKeys"]
            # POLICY: the last good fleet policy, kept by the controllers (policy_loading.LastGoodPolicy);
            # slurm-marks#*: the Slurm drains the scaler asks of HyperPod controllers (aws/slurm_marks.py)
            marks = defaults.SLURM_MARKS_KEY_PREFIX + "*"
            own = [k.startswith(("GROUP#", "IDEMPOTENCY#")) or k in ("POLICY", marks) for k in keys]
            assert keys and all(own), s["Sid"]
        else:
            assert all(re.match(r"^\w+:(Describe|List|Get)", a) for a in actions), s["Sid"]


def test_state_table_is_safe(template: dict[str, Any]) -> None:
    props = template["Resources"]["StateTable"]["Properties"]
    assert props["BillingMode"] == "PAY_PER_REQUEST"
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"] == {"SSEEnabled": True}
    assert props["TimeToLiveSpecification"]["AttributeName"] == "expiration"


def test_alarm_rule_is_filtered_by_prefix_and_failures_reach_the_dlq(template: dict[str, Any]) -> None:
    events = template["Resources"]["ScalerFunction"]["Properties"]["Events"]
    pattern = events["AlarmStateChange"]["Properties"]["Pattern"]
    assert pattern["detail"]["alarmName"] == [{"prefix": {"Ref": "AlarmNamePrefix"}}]
    on_failure = template["Resources"]["ScalerFunction"]["Properties"]["EventInvokeConfig"]["DestinationConfig"]
    assert on_failure["OnFailure"]["Type"] == "SQS"
    assert "<aws.scheduler.execution-id>" in events["Reconcile"]["Properties"]["Input"]


def test_notifier_iam_is_limited_to_its_own_resources(template: dict[str, Any]) -> None:
    """The notifier runs under its own role: its queue, its DLQ, its topic, incident/silence items, its secret."""
    res = template["Resources"]
    fn = res["NotifierFunction"]["Properties"]
    assert fn["Role"] == {"GetAtt": "NotifierRole.Arn"}
    role = res["NotifierRole"]["Properties"]
    [own] = [p for p in role["Policies"] if isinstance(p, dict) and p.get("PolicyName") == "notifier"]
    by_sid = {s["Sid"]: s for s in own["PolicyDocument"]["Statement"]}
    assert by_sid["ConsumeOwnQueueOnly"]["Resource"] == {"GetAtt": "NotificationQueue.Arn"}
    assert by_sid["FlushNudgesAndRejects"]["Resource"] == [
        {"GetAtt": "NotificationQueue.Arn"},
        {"GetAtt": "NotificationDLQ.Arn"},
    ]
    state = by_sid["IncidentsAndSilencesOnly"]
    assert state["Condition"]["ForAllValues:StringEquals"] == {"dynamodb:LeadingKeys": ["INCIDENT", "SILENCE"]}
    assert "dynamodb:Scan" not in state["Action"]
    assert by_sid["PublishToOwnTopic"]["Resource"] == {"Ref": "NotificationTopic"}
    [conditional] = [p for p in role["Policies"] if "If" in p]
    [secret_read] = conditional["If"][1]["PolicyDocument"]["Statement"]
    assert secret_read["Action"] == "secretsmanager:GetSecretValue"
    assert secret_read["Resource"] == {"Ref": "SlackSecretArn"}
    # The secret's ARN is configuration; its value is never in the template or the environment.
    assert fn["Environment"]["Variables"]["GPUFLEET_SLACK_SECRET_ARN"] == {"Ref": "SlackSecretArn"}


def test_notification_queue_redrives_to_a_dlq_and_reports_partial_failures(template: dict[str, Any]) -> None:
    res = template["Resources"]
    queue = res["NotificationQueue"]["Properties"]
    assert queue["RedrivePolicy"]["deadLetterTargetArn"] == {"GetAtt": "NotificationDLQ.Arn"}
    assert queue["VisibilityTimeout"] >= 6 * template["Globals"]["Function"]["Timeout"]
    event = res["NotifierFunction"]["Properties"]["Events"]["Notifications"]["Properties"]
    assert event["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    assert res["NotificationTopic"]["Properties"]["KmsMasterKeyId"] == "alias/aws/sns"


def test_every_function_gets_both_layers(template: dict[str, Any]) -> None:
    """gpufleet imports gpufleet_node.schema: a function without the node layer fails at import."""
    assert template["Globals"]["Function"]["Layers"] == [{"Ref": "GpufleetLayer"}, {"Ref": "SchemaLayer"}]
    functions = [r for r in template["Resources"].values() if r["Type"] == "AWS::Serverless::Function"]
    assert functions and all("Layers" not in f["Properties"] for f in functions)


def test_node_policy_puts_metrics_only_in_the_schema_namespace(template: dict[str, Any]) -> None:
    statements = template["Resources"]["NodePublisherPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    put = next(s for s in statements if s["Action"] == "cloudwatch:PutMetricData")
    own = schema.node_namespace("${aws:userid}")  # the node's own namespace (tests/iam/test_node_policy.py)
    assert put["Condition"] == {"StringEquals": {"cloudwatch:namespace": [schema.NAMESPACE, own]}}
    actions = {a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    assert actions == {
        "cloudwatch:PutMetricData",
        "ec2:DescribeTags",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
        # `gpufleet-node busy`: its own busy mark only (tests/iam/test_busy_marks_iam.py); no Auto Scaling call
        "dynamodb:PutItem",
        "dynamodb:DeleteItem",
    }
    busy = next(s for s in statements if s.get("Sid") == "MarkOnlyItselfBusy")
    assert busy["Condition"]["ForAllValues:StringEquals"] == {"dynamodb:LeadingKeys": ["${aws:userid}"]}
    table = template["Resources"]["BusyTable"]["Properties"]
    assert table["TableName"] == schema.BUSY_TABLE and table["KeySchema"][0]["AttributeName"] == schema.BUSY_KEY
    logs = next(s for s in statements if "logs:PutLogEvents" in s["Action"])
    assert logs["Resource"] == {"Sub": "${UsageLogGroup.Arn}:log-stream:*"}  # the usage group's streams only
    group = template["Resources"]["UsageLogGroup"]["Properties"]
    assert group["LogGroupName"] == schema.USAGE_LOG_GROUP and group["RetentionInDays"] == {"Ref": "UsageRetentionDays"}
    assert "NodePublisherPolicyArn" in template["Outputs"]


def _elf_machine(path: Path) -> int | None:
    head = path.read_bytes()[:20]
    if head[:4] != b"\x7fELF":
        return None
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def test_built_native_code_is_arm64() -> None:
    """`sam build` without BuildArchitecture packs x86_64 wheels (pydantic_core) into an arm64 layer."""
    layer = BUILD / "GpufleetLayer"
    if not layer.is_dir():
        if os.environ.get("GPUFLEET_REQUIRE_SAM_BUILD"):
            pytest.fail("no .aws-sam/build/GpufleetLayer: run `make sam-build` before pytest")
        pytest.skip("sam build has not run (make test runs it first)")
    shared = list(layer.rglob("*.so"))
    assert any("pydantic_core" in str(p) for p in shared), "pydantic_core missing from the layer"
    machines = {p.name: _elf_machine(p) for p in shared}
    assert machines
    wrong = {n: m for n, m in machines.items() if m is not None and m != EM_AARCH64}
    assert not wrong, f"non-arm64 native code in the layer: {wrong}"


def _marked(path: Path, marker: str) -> list[str]:
    text = path.read_text()
    return text.split(f"<!-- {marker}:start -->\n")[1].split(f"\n<!-- {marker}:end -->")[0].splitlines()


def _summary(rows: list[str]) -> list[str]:
    """The README's short form of the table: what and how many, conditional resources counted apart
    ("2 + 1 if HasAlarmTopic")."""
    out = ["| what | count |", "|---|---:|"]
    for row in rows[2:]:
        what, count, names = (cell.strip() for cell in row.strip("|").split("|"))
        conditions = re.findall(r"\(if (\w+)\)", names)
        if conditions:
            always = int(count) - len(conditions)
            extra = f"{len(conditions)} if {', '.join(sorted(set(conditions)))}"
            count = f"{always} + {extra}" if always else extra
        out.append(f"| {what} | {count} |")
    return out


def test_the_docs_say_what_the_stack_creates_as_the_template_does() -> None:
    """docs/deploy.md has the full table; the README (a newcomer's "what does it create?") its counts."""
    from gpufleet_tools.local import stack_resources

    rows = stack_resources(ROOT / "template.yaml")
    assert _marked(ROOT / "docs" / "deploy.md", "stack-resources") == rows
    assert _marked(ROOT / "README.md", "stack-summary") == _summary(rows)


def test_each_named_eks_cluster_lets_the_scaler_view_its_pods(template: dict[str, Any]) -> None:
    """EksClusters has three slots (CloudFormation cannot loop): entry i exists when the list has an i-th
    name, and gives the scaler's own role AmazonEKSViewPolicy over that cluster, nothing wider; spot_watch's
    role the same (its fallback hand-back reads the group's pods as the scaler does)."""
    res = template["Resources"]
    entries = {n: r for n, r in res.items() if r["Type"] == "AWS::EKS::AccessEntry"}
    roles = {"ScalerEksAccess": "ScalerFunctionRole.Arn", "SpotWatchEksAccess": "SpotWatchFunctionRole.Arn"}
    assert sorted(entries) == sorted(f"{p}{i}" for p in roles for i in (1, 2, 3))
    for name, entry in sorted(entries.items()):
        i = int(name[-1]) - 1
        props = entry["Properties"]
        assert entry["Condition"] == f"HasEksCluster{i + 1}"
        assert props["ClusterName"] == {"Select": [i, {"Split": [",", {"Sub": "${EksClusters},,"}]}]}, name
        assert props["PrincipalArn"] == {"GetAtt": roles[name[:-1]]}
        assert props["Type"] == "STANDARD"
        assert props["AccessPolicies"] == [
            {
                "PolicyArn": {"Sub": "arn:${AWS::Partition}:eks::aws:cluster-access-policy/AmazonEKSViewPolicy"},
                "AccessScope": {"Type": "cluster"},
            }
        ]
    pattern = re.compile(template["Parameters"]["EksClusters"]["AllowedPattern"])
    assert [bool(pattern.match(v)) for v in ("", "ml", "ml,train-1,c_3", "a,b,c,d", "ml, train", ",ml")] == [
        True,
        True,
        True,
        False,
        False,
        False,
    ]
