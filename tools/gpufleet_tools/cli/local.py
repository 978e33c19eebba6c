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
    except NotReady as exc:  # no stack there: one line saying what to start, not a traceback per function
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({"delivered_to": deliveries, "notifier": notifier}, indent=2, default=str))
    return 1 if any("error" in d for d in [*deliveries, notifier or {}]) else 0


def _deliver(function: str, event: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One function's part of the document: its result (or its error), and which results were the stored
    ones from an earlier delivery of the same event."""
    from gpufleet_tools.invoke import NotReady

    try:
        done = call_function(function, event, args)
    except NotReady:
        raise
    except Exception as exc:
        print(f"error: {function} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"already_handled": [s.as_json() for s in done.already_handled], "result": done.result}


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


def _hand_queue_to_notifier(args: argparse.Namespace) -> dict[str, Any] | None:
    """[the SQS event source] what the functions queued for the notifier, delivered to it once: its part
    of the document, or None when nothing was queued."""
    from gpufleet_tools.local import sqs_event
    from gpufleet_tools.session import client

    queue = os.environ.get(defaults.ENV_NOTIFY_QUEUE_URL)
    if not queue:
        return None
    sqs = client("sqs")
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, AttributeNames=["All"]).get("Messages", [])
    if not messages:
        return None
    print(f"delivered {len(messages)} queued notification(s) to notifier", file=sys.stderr)
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    region = os.environ.get("AWS_DEFAULT_REGION", "us-east-1")
    entry = _deliver("notifier", sqs_event(messages, arn, region), args)
    for m in messages:  # what Lambda's event source does after a batch (failures come back on the queue)
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
    return {"function": "notifier", "notifications": len(messages), **entry}


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
    print("\n".join(local_stack.exports(env, endpoint)))
    return 0


def down(args: argparse.Namespace) -> int:
    from gpufleet_tools import local_stack

    stopped = local_stack.stop(Path(args.dir))
    print("local stack stopped" if stopped else "no local stack is up", file=sys.stderr)
    return 0
