"""`gpufleet` command line: validate-policy, invoke (Docker-free local invoke), explain, silence(s), replay."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import ipaddress
import json
import os
import sys
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from gpufleet.domain import defaults
from gpufleet.domain.policy import PolicyError, parse_policy
from gpufleet.domain.policy_checks import policy_problems
from gpufleet.notify.model import NotificationKind, Severity

DEFAULT_TABLE = "gpufleet-state"


class LocalLambdaContext:
    """Enough of the Lambda context object for Powertools and our handlers."""

    def __init__(self, function_name: str, timeout_s: int = 60, memory_mb: int = 512) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
        self.invoked_function_arn = f"arn:aws:lambda:{region}:000000000000:function:{function_name}"
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "local"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def find_function(name: str, functions_dir: str | None) -> Path:
    candidates = [Path(functions_dir)] if functions_dir else []
    here = Path.cwd()
    candidates += [p / "functions" for p in (here, *here.parents)]
    candidates.append(Path(__file__).resolve().parents[3] / "functions")
    for base in candidates:
        app = base / name / "app.py"
        if app.is_file():
            return app
    raise SystemExit(f"error: no functions/{name}/app.py found (try --functions-dir)")


def _use_endpoint(endpoint: str | None) -> None:
    """Point every boto3 client at `endpoint` (moto server); only a loopback one gets fake credentials."""
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    if endpoint:
        os.environ[defaults.ENV_ENDPOINT_URL] = endpoint
        if _is_loopback(endpoint):  # moto accepts any credentials; never fake them for real AWS
            os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
            os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")


def _cmd_doctor(args: argparse.Namespace) -> int:
    """Exit 0 when all checks pass, 1 with warnings, 2 with errors (the policy's own included)."""
    from gpufleet.doctor.core import Level, diagnose, worst
    from gpufleet.runtime import build_account_reader

    try:
        policy = parse_policy(Path(args.policy).read_text(), args.policy)
    except (OSError, PolicyError) as exc:
        for problem in getattr(exc, "problems", [str(exc)]):
            print(f"error   policy: {problem}")
        return 2
    _use_endpoint(args.endpoint)
    slack = args.slack_secret or os.environ.get(defaults.ENV_SLACK_SECRET)
    topic = args.topic or os.environ.get(defaults.ENV_NOTIFY_TOPIC_ARN)
    findings = diagnose(policy, build_account_reader().read(policy, slack, topic))
    order = {Level.ERROR: 0, Level.WARNING: 1, Level.OK: 2}
    for f in sorted(findings, key=lambda f: order[f.level]):
        print(f"{f.level:<7} {f.subject}: {f.text}")
    counts = {level: sum(f.level is level for f in findings) for level in Level}
    verdict = worst(findings)
    print(f"{counts[Level.ERROR]} error(s), {counts[Level.WARNING]} warning(s), {counts[Level.OK]} ok: {verdict}")
    return {Level.OK: 0, Level.WARNING: 1, Level.ERROR: 2}[verdict]


def invoke(
    function: str,
    event: Any,
    *,
    endpoint: str | None,
    policy: str | None,
    table: str | None,
    dry_run: bool,
    functions_dir: str | None = None,
) -> Any:
    """Import functions/<function>/app.py in-process and call its handler once."""
    env = os.environ
    env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    env["POWERTOOLS_TRACE_DISABLED"] = "true"
    env[defaults.ENV_STATE_TABLE] = table or env.get(defaults.ENV_STATE_TABLE, DEFAULT_TABLE)
    _use_endpoint(endpoint)
    if policy:
        env[defaults.ENV_POLICY_FILE] = str(Path(policy).resolve())
    if dry_run:
        env[defaults.ENV_DRY_RUN] = "true"
    app = find_function(function, functions_dir)
    spec = importlib.util.spec_from_file_location(f"gpufleet_local_{function}", app)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {app}")
    module = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(sys.stderr):  # the function's logs and EMF: stderr; its result: stdout
        spec.loader.exec_module(module)
        return module.lambda_handler(event, LocalLambdaContext(function))


def _cmd_validate(args: argparse.Namespace) -> int:
    try:
        policy = parse_policy(Path(args.file).read_text(), args.file)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PolicyError as exc:
        problems = list(exc.problems)
    else:
        problems = policy_problems(policy)  # parses, but would bite: shadowed rules, windows above max...
    if problems:
        print(f"{args.file}: invalid", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    rules = len(policy.groups)
    print(
        f"{args.file}: ok ({rules} group rule(s), {len(policy.alarms)} alarm mapping(s), "
        f"discovery by tag {policy.discovery.tag_key}={policy.discovery.tag_value}"
        f"{', dry-run' if policy.dry_run else ''})"
    )
    return 0


def _read_event(path: str) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SystemExit(f"error: cannot read event {path}: {exc}") from None


def real_aws_refused(args: argparse.Namespace) -> bool:
    """Commands that can change AWS run against real AWS only when asked to: --endpoint, or --aws."""
    endpoint = args.endpoint or os.environ.get(defaults.ENV_ENDPOINT_URL)  # `local up` exports one
    if args.aws or (endpoint and (args.endpoint or _is_loopback(endpoint))):
        return False
    command = " ".join(filter(None, (args.command, getattr(args, "local_command", None))))
    print(
        f"error: {command} would use your AWS credentials against real AWS; pass --aws to mean it, "
        "or --endpoint http://127.0.0.1:PORT for moto server",
        file=sys.stderr,
    )
    return True


def _run(function: str, event: Any, args: argparse.Namespace) -> int:
    if real_aws_refused(args):
        return 2
    try:
        result = invoke(
            function,
            event,
            endpoint=args.endpoint,
            policy=args.policy,
            table=args.table,
            dry_run=args.dry_run,
            functions_dir=args.functions_dir,
        )
    except Exception as exc:
        print(f"error: {function} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str))
    return 0


def _cmd_invoke(args: argparse.Namespace) -> int:
    return _run(args.function, _read_event(args.event), args)


def find_template(given: str | None) -> Path:
    here = Path.cwd()
    candidates = [Path(given)] if given else [p / "template.yaml" for p in (here, *here.parents)]
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise SystemExit("error: no template.yaml found (try --template)")
    return found


def _cmd_local_send(args: argparse.Namespace) -> int:
    """Deliver to the functions whose EventBridge rules match, as the stack would; none: exit 1."""
    from gpufleet.local import describe, rules_matching, template_rules

    if real_aws_refused(args):
        return 2
    event = _read_event(args.event)
    params = dict(p.split("=", 1) for p in args.param or ())
    template = find_template(args.template)
    matched = rules_matching(event, template_rules(template, params))
    if not matched:
        print(f"not delivered: no EventBridge rule in {template} matches ({describe(event)})", file=sys.stderr)
        return 1
    codes = []
    for rule in matched:
        print(f"delivered to {rule.function} (rule {rule.name})", file=sys.stderr)
        codes.append(_run(rule.function, event, args))
    return max([*codes, _hand_queue_to_notifier(args)])


def _hand_queue_to_notifier(args: argparse.Namespace) -> int:
    """[the SQS event source] what the functions queued for the notifier, delivered to it once."""
    import boto3

    from gpufleet.local import sqs_event

    queue = os.environ.get(defaults.ENV_NOTIFY_QUEUE_URL)
    if not queue:
        return 0
    sqs = boto3.client("sqs")
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, AttributeNames=["All"]).get("Messages", [])
    if not messages:
        return 0
    print(f"delivered {len(messages)} queued notification(s) to notifier", file=sys.stderr)
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    code = _run("notifier", sqs_event(messages, arn, os.environ.get("AWS_DEFAULT_REGION", "us-east-1")), args)
    for m in messages:  # what Lambda's event source does after a batch (failures come back on the queue)
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
    return code


def _cmd_alarms(args: argparse.Namespace) -> int:
    """CloudFormation on stdout; with --apply, PutMetricAlarm for each (real AWS only with --aws)."""
    import yaml

    from gpufleet.domain.models import GroupRef
    from gpufleet.scaling.alarm_specs import cloudformation, put_metric_alarm_args, scaling_alarms

    try:
        refs = [GroupRef.parse_key(g) for g in args.groups]
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    specs = [s for ref in refs for s in scaling_alarms(ref, args.prefix, args.high, args.low, args.memory_high)]
    if not args.apply:
        print(yaml.safe_dump(cloudformation(specs), sort_keys=False), end="")
        return 0
    if real_aws_refused(args):
        return 2
    import boto3

    _use_endpoint(args.endpoint)
    cloudwatch = boto3.client("cloudwatch")
    for spec in specs:
        cloudwatch.put_metric_alarm(**put_metric_alarm_args(spec))
        print(f"put {spec.name}: scale {spec.direction} {spec.group}", file=sys.stderr)
    return 0


def _cmd_local_up(args: argparse.Namespace) -> int:
    """Exports on stdout (`eval "$(gpufleet local up)"`), what was made on stderr."""
    from gpufleet import local_stack

    state = Path(args.dir)
    if (state / "moto.pid").exists():
        print(f"error: a local stack is already up ({state}); `gpufleet local down` first", file=sys.stderr)
        return 1
    endpoint = local_stack.start_moto(state, args.port)
    env = local_stack.create_stack(find_template(args.template), endpoint)
    print(f"moto server on {endpoint}; made: " + ", ".join(sorted(env)), file=sys.stderr)
    if args.example:
        policy = local_stack.create_example(endpoint, env, state)
        print(f"example: asg:train-spot (2 nodes), alarms gpufleet-train-gpu-high/low, {policy}", file=sys.stderr)
    print("\n".join(local_stack.exports(env, endpoint)))
    return 0


def _cmd_local_down(args: argparse.Namespace) -> int:
    from gpufleet import local_stack

    stopped = local_stack.stop(Path(args.dir))
    print("local stack stopped" if stopped else "no local stack is up", file=sys.stderr)
    return 0


def _dynamodb(args: argparse.Namespace) -> tuple[Any, str]:
    import boto3

    from gpufleet.aws.clients import RETRY_CONFIG

    client = boto3.client("dynamodb", endpoint_url=args.endpoint, config=RETRY_CONFIG)
    return client, args.table or os.environ.get(defaults.ENV_STATE_TABLE, DEFAULT_TABLE)


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """'90m', '2h', '1d' -> timedelta."""
    value, unit = text[:-1], text[-1:]
    if unit not in _DURATION_UNITS or not value.isdigit() or int(value) <= 0:
        raise argparse.ArgumentTypeError(f"expected a duration like 30m, 2h or 1d (got {text!r})")
    return timedelta(seconds=int(value) * _DURATION_UNITS[unit])


def _cmd_silence(args: argparse.Namespace) -> int:
    from gpufleet.aws.incidents import IncidentStore
    from gpufleet.notify.incidents import Silence
    from gpufleet.notify.model import Severity

    if real_aws_refused(args):
        return 2
    store = IncidentStore(*_dynamodb(args))
    now = datetime.now(UTC)
    if args.expire:
        expired = store.expire_silence(args.expire, now)
        print(f"silence {args.expire} expired" if expired else f"no silence {args.expire}")
        return 0 if expired else 1
    if not (args.group or args.kind or args.severity):
        print("error: a silence needs at least one of --group, --kind, --severity", file=sys.stderr)
        return 2
    silence = Silence(
        silence_id=uuid.uuid4().hex[:12],
        groups=tuple(args.group or ()),
        kinds=tuple(args.kind or ()),
        severities=tuple(Severity(s) for s in args.severity or ()),
        reason=args.reason,
        created_by=args.by or os.environ.get("USER", ""),
        starts_at=now,
        expires_at=now + args.duration,
    )
    store.put_silence(silence)
    print(f"silence {silence.silence_id} until {silence.expires_at:%Y-%m-%d %H:%M}Z: {_describe_silence(silence)}")
    return 0


def _describe_silence(s: Any) -> str:
    parts = [
        f"groups {', '.join(s.groups)}" if s.groups else "",
        f"kinds {', '.join(s.kinds)}" if s.kinds else "",
        f"severities {', '.join(s.severities)}" if s.severities else "",
    ]
    return "; ".join(p for p in parts if p) + f" ({s.reason})"


def _cmd_silences(args: argparse.Namespace) -> int:
    from gpufleet.aws.incidents import IncidentStore

    silences = IncidentStore(*_dynamodb(args)).silences(datetime.now(UTC))
    if not silences:
        print("no active silences")
    for s in sorted(silences, key=lambda s: s.expires_at):
        print(f"{s.silence_id}  until {s.expires_at:%Y-%m-%d %H:%M}Z  by {s.created_by or '?'}  {_describe_silence(s)}")
    return 0


def _cmd_explain(args: argparse.Namespace) -> int:
    from gpufleet.aws.audit import AuditLog
    from gpufleet.domain.models import GroupRef

    key = args.group if args.group == "unresolved" else GroupRef.parse_key(args.group).key
    decisions = AuditLog(*_dynamodb(args)).recent(key, args.limit)
    if not decisions:
        print(f"no recorded decisions for {key}")
        return 0
    for d in decisions:
        change = f"{d.current} -> {d.desired}" if d.desired != d.current or d.victims else f"{d.current}"
        print(f"{d.at:%Y-%m-%d %H:%M:%S}Z  {d.action:<11} {d.outcome:<13} {change:<8} {d.trigger!s}")
        print(f"    {d.reason}")
        if d.detail:
            print(f"    -> {d.detail}")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from gpufleet.replay.service import main as replay_main

    return replay_main(args)


def _add_replay(sub: Any) -> None:
    from gpufleet.replay.model import DEFAULT_NODE_PRICE

    p = sub.add_parser(
        "replay", help="replay a workload trace or a group's CloudWatch history through the decision core"
    )
    p.add_argument("--trace", help="Alibaba GPU trace CSV (v2025 DLRM instances or v2023 pods), or synthetic:bursty")
    p.add_argument("--from-cloudwatch", metavar="GROUP", help="asg:NAME or eks:CLUSTER/NODEGROUP")
    p.add_argument("--days", type=int, default=7, help="history days (CloudWatch) or synthetic trace days")
    p.add_argument("--policy", help="fleet policy file (default: the README's recommendation for the workload)")
    p.add_argument("--workload", choices=["serving", "batch"], help="which recommended policy (default: by trace)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--boot-minutes", type=int, default=5, help="launch to schedulable")
    p.add_argument("--node-price", type=float, default=DEFAULT_NODE_PRICE, help="$/node-hour (g5.48xlarge)")
    p.add_argument("--placement", choices=["spread", "pack"], default="spread")
    p.add_argument("--min-nodes", type=int, default=1)
    p.add_argument("--max-nodes", type=int, help="the group's max (default 1.5x the peak)")
    p.add_argument("--tt-target", type=float, default=70.0, help="asg-target-tracking's target GPU %%")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--experiments", action="store_true", help="also run the labelled gpufleet experiments")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--endpoint", help="AWS endpoint URL (moto server) for --from-cloudwatch")
    p.add_argument("--out", default="replay-out")
    p.set_defaults(func=_cmd_replay)


TEMPLATE_HELP = "the SAM template (default: template.yaml here or above)"


def _add_account_options(p: argparse.ArgumentParser, *, table: bool = False, changes: str | None = None) -> None:
    """Where a command talks to: --endpoint (moto), the state --table, and for commands that change AWS
    the --aws that says real AWS is meant (`changes` says what would change)."""
    p.add_argument("--endpoint", help="AWS endpoint URL, e.g. http://127.0.0.1:5000 for moto server")
    if table:
        p.add_argument("--table", help=f"state table name (default ${defaults.ENV_STATE_TABLE} or {DEFAULT_TABLE})")
    if changes:
        p.add_argument("--aws", action="store_true", help=f"without --endpoint: yes, {changes} in real AWS")


def _add_invoke_options(p: argparse.ArgumentParser) -> None:
    _add_account_options(p, table=True, changes="run the function")
    p.add_argument("--policy", help="fleet policy file (instead of the SSM parameter)")
    p.add_argument("--dry-run", action="store_true", help="decide and record, change nothing")
    p.add_argument("--functions-dir", help="where functions/<name>/app.py live")


def _add_local(sub: Any) -> None:
    p = sub.add_parser("local", help="the stack on your machine: `local send EVENT` delivers as EventBridge would")
    local = p.add_subparsers(dest="local_command", required=True)
    p = local.add_parser("send", help="deliver an event to the functions whose template rules match it")
    p.add_argument("event", help="event JSON file")
    p.add_argument("--template", help=TEMPLATE_HELP)
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="a template parameter (repeatable)")
    _add_invoke_options(p)
    p.set_defaults(func=_cmd_local_send)
    p = local.add_parser("up", help="moto server + the template's table, queues, topic, policy; prints exports")
    p.add_argument("--port", type=int, default=0, help="moto server's port (default: a free one)")
    p.add_argument("--example", action="store_true", help="also a tagged training ASG, its alarms and a policy")
    p.add_argument("--template", help=TEMPLATE_HELP)
    p.add_argument("--dir", default=".gpufleet-local", help="where the server's pid, log and policy go")
    p.set_defaults(func=_cmd_local_up)
    p = local.add_parser("down", help="stop the local stack's moto server")
    p.add_argument("--dir", default=".gpufleet-local")
    p.set_defaults(func=_cmd_local_down)


def _add_silences(sub: Any) -> None:
    p = sub.add_parser("silence", help="mute notifications by group / kind / severity until an expiry")
    p.add_argument("--group", action="append", help="group key glob, e.g. 'asg:train-*' (repeatable)")
    p.add_argument(
        "--kind", action="append", choices=[str(k) for k in NotificationKind], help="notification kind (repeatable)"
    )
    p.add_argument("--severity", action="append", choices=[str(s) for s in Severity])
    p.add_argument("--for", dest="duration", type=parse_duration, default=timedelta(hours=2), help="e.g. 30m, 2h")
    p.add_argument("--reason", default="silenced from the CLI")
    p.add_argument("--by", help="who (default $USER)")
    p.add_argument("--expire", metavar="ID", help="end the silence with this id now")
    _add_account_options(p, table=True, changes="write the silence")
    p.set_defaults(func=_cmd_silence)

    p = sub.add_parser("silences", help="list active silences")
    _add_account_options(p, table=True)
    p.set_defaults(func=_cmd_silences)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpufleet", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate-policy", help="check a fleet policy file")
    p.add_argument("file")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("invoke", help="run a function's handler in-process (no Docker)")
    p.add_argument("function", help="name under functions/, e.g. scaler")
    p.add_argument("--event", required=True, help="event JSON file (see events/)")
    _add_invoke_options(p)
    p.set_defaults(func=_cmd_invoke)

    _add_local(sub)

    p = sub.add_parser("alarms", help="the scaling alarms for groups: CloudFormation, or --apply them")
    p.add_argument("groups", nargs="+", metavar="GROUP", help="asg:NAME or eks:CLUSTER/NODEGROUP")
    prefix = os.environ.get(defaults.ENV_ALARM_PREFIX, defaults.DEFAULT_ALARM_PREFIX)
    p.add_argument("--prefix", default=prefix, help="the stack's AlarmNamePrefix (default: $GPUFLEET_ALARM_PREFIX)")
    p.add_argument("--high", type=float, default=85, help="scale out above this GPU utilization (percent)")
    p.add_argument("--low", type=float, default=20, help="scale in below this GPU utilization (percent)")
    p.add_argument("--memory-high", type=float, help="also scale out above this GPU memory use (percent)")
    p.add_argument("--apply", action="store_true", help="put them (PutMetricAlarm) instead of printing")
    _add_account_options(p, changes="put them (with --apply)")
    p.set_defaults(func=_cmd_alarms)

    p = sub.add_parser("explain", help="print a group's recent decisions and their reasons")
    p.add_argument("group", help="asg:NAME, eks:CLUSTER/NODEGROUP, a bare ASG name, or 'unresolved'")
    _add_account_options(p, table=True)
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=_cmd_explain)

    p = sub.add_parser(
        "doctor", help="check a policy against an account (read-only): groups, tags, bounds, alarms, routes"
    )
    p.add_argument("--policy", required=True, help="the fleet policy file")
    _add_account_options(p)
    p.add_argument("--slack-secret", help=f"Slack secret ARN (default ${defaults.ENV_SLACK_SECRET})")
    p.add_argument("--topic", help=f"SNS topic ARN (default ${defaults.ENV_NOTIFY_TOPIC_ARN})")
    p.set_defaults(func=_cmd_doctor)

    _add_silences(sub)
    _add_replay(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
