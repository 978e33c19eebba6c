"""`gpufleet local up | send | down`: the stack on your machine (moto server and what the template
creates), and events delivered the way the stack's EventBridge rules would."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from gpufleet.domain import defaults
from gpufleet.settings import ENV_KUBE_ENDPOINTS
from gpufleet_tools.cli.invoke import call_function
from gpufleet_tools.cli.options import TEMPLATE_HELP, add_invoke_options, find_template, read_event, real_aws_refused

STATE_DIR = ".gpufleet-local"


def add_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    local = parser.add_subparsers(dest="local_command", required=True)
    p = local.add_parser("send", help="deliver an event to the functions whose template rules match it")
    p.add_argument("event", help="event JSON file")
    p.add_argument("--template", help=TEMPLATE_HELP)
    p.add_argument("--param", action="append", metavar="NAME=VALUE", help="a template parameter (repeatable)")
    add_invoke_options(p)
    p.set_defaults(func=send)
    p = local.add_parser("up", help="moto server + the template's table, queues, topic, policy; prints exports")
    p.add_argument("--port", type=int, default=0, help="moto server's port (default: a free one)")
    p.add_argument("--example", action="store_true", help="also a tagged training ASG, its alarms and a policy")
    p.add_argument("--template", help=TEMPLATE_HELP)
    p.add_argument("--dir", default=STATE_DIR, help="where the server's pid, log and policy go")
    p.set_defaults(func=up)
    p = local.add_parser("nodegroup", help="an EKS managed node group with its backing ASG, as EKS makes it")
    p.add_argument("group", metavar="CLUSTER/NODEGROUP", help="the cluster (made if missing) and node group")
    p.add_argument("--min", type=int, default=0, help="the node group's minSize (default 0)")
    p.add_argument("--max", type=int, default=4, help="its maxSize (default 4)")
    p.add_argument("--desired", type=int, default=1, help="its desiredSize (default 1)")
    p.add_argument("--instance-type", default="g5.12xlarge", help="its instance type (default g5.12xlarge)")
    p.add_argument(
        "--tag", action="append", metavar="KEY=VALUE", help="a node group tag (default gpufleet:managed=true)"
    )
    p.add_argument("--dir", default=STATE_DIR, help=f"the directory `local up --dir` used (default {STATE_DIR})")
    p.set_defaults(func=nodegroup)
    p = local.add_parser("pod", help="a pod waiting for GPUs in a local cluster's Kubernetes API")
    p.add_argument("cluster", help="a cluster `local nodegroup` made")
    p.add_argument("pod", metavar="NAMESPACE/NAME", help="the pod to add, waiting (Unschedulable)")
    p.add_argument("--gpus", type=int, default=1, help="nvidia.com/gpu it requests (default 1)")
    p.add_argument("--selector", action="append", metavar="KEY=VALUE", help="its nodeSelector (repeatable)")
    p.add_argument("--dir", default=STATE_DIR, help=f"the directory `local up --dir` used (default {STATE_DIR})")
    p.set_defaults(func=add_pod)
    p = local.add_parser("oncall", help="what on-call's SNS subscription got since the last read")
    p.set_defaults(func=oncall)
    p = local.add_parser("down", help="stop the local stack's moto server")
    p.add_argument("--dir", default=STATE_DIR, help=f"the directory `local up --dir` used (default {STATE_DIR})")
    p.set_defaults(func=down)


def send(args: argparse.Namespace) -> int:
    """Deliver to the functions whose EventBridge rules match, as the stack would. One JSON document on
    stdout (each delivery's result, then the notifier's), logs and notices on stderr; none matched: exit 1."""
    from gpufleet_tools.invoke import NotReady
    from gpufleet_tools.local import rules_matching, template_rules

    if real_aws_refused(args):
        return 2
    event = read_event(args.event)
    params = dict(p.split("=", 1) for p in args.param or ())
    template = find_template(args.template)
    matched = rules_matching(event, template_rules(template, params))
    if not matched:
        print(_not_delivered(event, template, params, args), file=sys.stderr)
        return 1
    try:
        deliveries = []
        for rule in matched:
            print(f"delivered to {rule.function} (rule {rule.name})", file=sys.stderr)
            deliveries.append({"function": rule.function, "rule": rule.name, **_deliver(rule.function, event, args)})
        notifier = _hand_queue_to_notifier(args)
        _as_eks_would(args)
    except NotReady as exc:  # no stack there: one line saying what to start, not a traceback per function
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"delivered_to": deliveries, "notifier": notifier}, indent=2, default=str))
    return 1 if any("error" in d for d in [*deliveries, notifier or {}]) else 0


def _deliver(function: str, event: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One function's part of the document: its result (or its error), and which results were the stored
    ones from an earlier delivery of the same event."""
    return _call(function, event, args)[0]


def _call(function: str, event: Any, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """_deliver's part, and the function's imported module (None when it raised)."""
    from gpufleet_tools.invoke import NotReady

    try:
        done = call_function(function, event, args)
    except NotReady:
        raise
    except Exception as exc:
        print(f"error: {function} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {"error": f"{type(exc).__name__}: {exc}"}, None
    return {"already_handled": [s.as_json() for s in done.already_handled], "result": done.result}, done.module


def _not_delivered(event: Any, template: Path, params: dict[str, str], args: argparse.Namespace) -> str:
    """Why nothing was delivered; for a shape that reaches a function without EventBridge (an alarm
    action, SNS, SQS, a schedule's input, a termination request), the `invoke` that runs it instead."""
    from gpufleet_tools.local import DIRECT_SHAPES, describe, direct_routes, routes_for

    routes = routes_for(event, direct_routes(template, params))
    if not routes:
        return f"not delivered: no EventBridge rule in {template} matches ({describe(event)})"
    routes.sort(key=lambda r: r.function not in Path(args.event).parts)  # events/<function>/... first
    given = [w for k in _PASSED_ON if getattr(args, k, None) for w in (f"--{k.replace('_', '-')}", getattr(args, k))]
    given += [f"--{k.replace('_', '-')}" for k in ("dry_run", "aws") if getattr(args, k, False)]
    commands = [shlex.join(["gpufleet", "invoke", r.function, "--event", args.event, *given]) for r in routes]
    who = ", ".join(f"{r.function}: {r.via}" for r in routes)
    also = "".join(f" (or: {c})" for c in commands[1:])
    return (
        f"not delivered: this is {DIRECT_SHAPES[routes[0].shape]} ({who}), not through an EventBridge rule; "
        f"run it with: {commands[0]}{also}"
    )


_PASSED_ON = ("endpoint", "policy", "table", "functions_dir")


# `local send` hands the queue to the notifier batch after batch, as Lambda's event source polls, until a
# receive finds nothing visible; at most this many batches of 10 (200 notifications), so a notifier that
# queues as fast as it takes cannot keep one send running. What is left then is said, and the send fails.
MAX_RECEIVE_ROUNDS = 20


def _hand_queue_to_notifier(args: argparse.Namespace) -> dict[str, Any] | None:
    """[the SQS event source] what the functions queued for the notifier, delivered to it in batches of 10
    until the queue has nothing visible: its part of the document, or None when nothing was queued. As
    Lambda's event source with ReportBatchItemFailures: the records the notifier answers as failed (or every
    record of a batch, when it raises) stay on the queue and come back after its visibility timeout; only
    the others are deleted."""
    from gpufleet_tools.session import client

    queue = os.environ.get(defaults.ENV_NOTIFY_QUEUE_URL)
    if not queue:
        return None
    sqs = client("sqs")
    attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["All"])["Attributes"]
    done: dict[str, Any] = {"function": "notifier", "notifications": 0, "already_handled": [], "result": None}
    failures: list[dict[str, str]] = []
    for _ in range(MAX_RECEIVE_ROUNDS):
        messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, AttributeNames=["All"]).get(
            "Messages", []
        )
        if not messages:
            break
        entry, failed = _deliver_batch(sqs, queue, messages, attributes, args)
        done["notifications"] += len(messages)
        done["already_handled"] += entry.get("already_handled", [])
        done["result"] = _merged(done["result"], entry.get("result"))
        failures += failed
        if "error" in entry:
            done.setdefault("error", entry["error"])
    else:
        left = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages"])
        if int(left["Attributes"]["ApproximateNumberOfMessages"]):
            why = f"notifications still queued after {MAX_RECEIVE_ROUNDS} batches: run `gpufleet local send` again"
            print(f"error: {why}", file=sys.stderr)
            done.setdefault("error", why)
    if not done["notifications"]:
        return None
    if failures:
        done["failed"] = failures
        done.setdefault("error", f"{len(failures)} of {done['notifications']} notification(s) failed")
    return done


def _deliver_batch(
    sqs: Any, queue: str, messages: list[dict[str, Any]], attributes: dict[str, str], args: argparse.Namespace
) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """One batch to the notifier: its entry, and the records left on the queue with why."""
    from gpufleet_tools.local import batch_failures, failure_reasons, sqs_event

    print(f"delivered {len(messages)} queued notification(s) to notifier", file=sys.stderr)
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    entry, module = _call("notifier", sqs_event(messages, attributes["QueueArn"], region), args)
    ids = [m["MessageId"] for m in messages]
    failed = ids if "error" in entry else batch_failures(entry.get("result"), ids)
    for m in messages:
        if m["MessageId"] not in failed:
            sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
    if not failed:
        return entry, []
    reasons = failure_reasons(module) if module is not None else {}
    why = {i: reasons.get(i) or entry.get("error") or "the notifier reported it failed" for i in failed}
    print(_left_on_queue(messages, why, attributes), file=sys.stderr)
    return entry, [{"messageId": i, "why": w} for i, w in why.items()]


def _merged(before: Any, result: Any) -> Any:
    """The batches' answers as one: their batchItemFailures together (a single batch's answer as it was)."""
    if not isinstance(before, dict) or not isinstance(result, dict):
        return result if before is None else before
    items = [*(before.get("batchItemFailures") or []), *(result.get("batchItemFailures") or [])]
    return {**before, **result, "batchItemFailures": items}


def _left_on_queue(messages: list[dict[str, Any]], why: dict[str, str], attributes: dict[str, str]) -> str:
    """The lines that say which notifications failed, why, and what the queue does with them next."""
    redrive = json.loads(attributes.get("RedrivePolicy") or "{}")
    limit = f" of {redrive['maxReceiveCount']} before the DLQ" if "maxReceiveCount" in redrive else ""
    lines = [
        f"error: notifier failed {len(why)} of {len(messages)} notification(s): left on the queue, back after its "
        f"visibility timeout ({attributes.get('VisibilityTimeout', '?')} s)"
    ]
    for m in messages:
        if m["MessageId"] in why:
            count = m.get("Attributes", {}).get("ApproximateReceiveCount", "?")
            lines.append(f"  {m['MessageId']} (receive {count}{limit}): {why[m['MessageId']]}")
    return "\n".join(lines)


def up(args: argparse.Namespace) -> int:
    """Exports on stdout (`eval "$(gpufleet local up)"`), what was made on stderr."""
    from gpufleet_tools import local_stack

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
    if topic := env.get(defaults.ENV_NOTIFY_TOPIC_ARN):
        local_stack.subscribe_oncall(endpoint, topic)
    print("\n".join(local_stack.exports(env, endpoint)))
    return 0


def _local_endpoint(args: argparse.Namespace) -> str | None:
    """The local stack's endpoint (loopback only: these commands emulate AWS, they never touch it)."""
    from gpufleet.aws.clients import is_loopback

    endpoint = getattr(args, "endpoint", None) or os.environ.get(defaults.ENV_ENDPOINT_URL)
    return endpoint if endpoint and is_loopback(endpoint) else None


def _as_eks_would(args: argparse.Namespace) -> None:
    """[EMULATED EKS] after the functions ran on the local stack: node groups' desiredSize onto their ASGs."""
    from gpufleet_tools import local_stack

    endpoint = _local_endpoint(args)
    if endpoint and not args.aws:
        for note in local_stack.sync_nodegroups(endpoint):
            print(note, file=sys.stderr)


def nodegroup(args: argparse.Namespace) -> int:
    """The node group, its backing ASG and its cluster's Kubernetes API; on stdout the export of
    GPUFLEET_KUBE_ENDPOINTS for every local cluster (`eval "$(gpufleet local nodegroup ...)"`)."""
    from gpufleet_tools import local_kube, local_servers, local_stack

    endpoint, (cluster, _, name) = _local_endpoint(args), args.group.partition("/")
    if not endpoint:
        print(
            f'error: no local stack: `eval "$(gpufleet local up)"` first (or ${defaults.ENV_ENDPOINT_URL})',
            file=sys.stderr,
        )
        return 2
    if not cluster or not name or not 0 <= args.min <= args.desired <= args.max:
        print(
            f"error: {args.group} --min {args.min} --desired {args.desired} --max {args.max}: "
            "want CLUSTER/NODEGROUP and min <= desired <= max",
            file=sys.stderr,
        )
        return 2
    tags = dict(t.split("=", 1) for t in args.tag or ()) or {defaults.TAG_MANAGED: defaults.TAG_MANAGED_VALUE}
    sizes = (args.min, args.max, args.desired)
    asg = local_stack.create_nodegroup(endpoint, cluster, name, sizes, args.instance_type, tags)
    url = local_kube.start(Path(args.dir), cluster, local_servers.free_port())
    print(
        f"eks:{cluster}/{name}: backing ASG {asg} ({args.desired} of {args.max}); Kubernetes API {url} [emulated]",
        file=sys.stderr,
    )
    found = json.dumps(local_kube.endpoints(Path(args.dir)))
    print(f"export {ENV_KUBE_ENDPOINTS}={shlex.quote(found)}")
    return 0


def add_pod(args: argparse.Namespace) -> int:
    """A pod the scheduler could not place, in the cluster's local Kubernetes API."""
    from datetime import UTC, datetime

    from gpufleet_tools import local_kube

    namespace, _, name = args.pod.rpartition("/")
    if args.gpus < 1 or not name or any("=" not in s for s in args.selector or ()):
        raise SystemExit(
            f"error: {args.pod} --gpus {args.gpus} --selector {args.selector}: "
            "want NAMESPACE/NAME, --gpus >= 1, --selector KEY=VALUE"
        )
    selector = dict(s.split("=", 1) for s in args.selector or ())
    doc = local_kube.waiting_pod(namespace or "default", name, args.gpus, selector, datetime.now(UTC))
    local_kube.add_pod(Path(args.dir), args.cluster, doc)
    print(
        f"{args.cluster}: pod {namespace or 'default'}/{name} waits for {args.gpus} GPU(s) [emulated]", file=sys.stderr
    )
    return 0


def oncall(args: argparse.Namespace) -> int:
    """Each SNS message the notification topic published (subject, then body), as on-call would get it."""
    from gpufleet_tools import local_stack

    endpoint = _local_endpoint(args)
    if not endpoint:
        print('error: no local stack: `eval "$(gpufleet local up)"` first', file=sys.stderr)
        return 2
    got = local_stack.read_oncall(endpoint)
    for m in got:
        print(f"== {m['subject']}\n{m['message']}\n")
    print(f"{len(got)} message(s) to on-call", file=sys.stderr)
    return 0


def down(args: argparse.Namespace) -> int:
    from gpufleet_tools import local_stack

    stopped = local_stack.stop(Path(args.dir))
    print("local stack stopped" if stopped else "no local stack is up", file=sys.stderr)
    return 0
