"""`gpufleet local up | send | down`: the stack on your machine (moto server and what the template
creates), and events delivered the way the stack's EventBridge rules would."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gpufleet.domain import defaults
from gpufleet_tools.cli.invoke import run_function
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
    p.add_argument("--dir", default=STATE_DIR)
    p.set_defaults(func=down)


def send(args: argparse.Namespace) -> int:
    """Deliver to the functions whose EventBridge rules match, as the stack would; none: exit 1."""
    from gpufleet_tools.local import describe, rules_matching, template_rules

    if real_aws_refused(args):
        return 2
    event = read_event(args.event)
    params = dict(p.split("=", 1) for p in args.param or ())
    template = find_template(args.template)
    matched = rules_matching(event, template_rules(template, params))
    if not matched:
        print(f"not delivered: no EventBridge rule in {template} matches ({describe(event)})", file=sys.stderr)
        return 1
    codes = []
    for rule in matched:
        print(f"delivered to {rule.function} (rule {rule.name})", file=sys.stderr)
        codes.append(run_function(rule.function, event, args))
    return max([*codes, _hand_queue_to_notifier(args)])


def _hand_queue_to_notifier(args: argparse.Namespace) -> int:
    """[the SQS event source] what the functions queued for the notifier, delivered to it once."""
    from gpufleet_tools.local import sqs_event
    from gpufleet_tools.session import client

    queue = os.environ.get(defaults.ENV_NOTIFY_QUEUE_URL)
    if not queue:
        return 0
    sqs = client("sqs")
    messages = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10, AttributeNames=["All"]).get("Messages", [])
    if not messages:
        return 0
    print(f"delivered {len(messages)} queued notification(s) to notifier", file=sys.stderr)
    arn = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    code = run_function("notifier", sqs_event(messages, arn, os.environ.get("AWS_DEFAULT_REGION", "us-east-1")), args)
    for m in messages:  # what Lambda's event source does after a batch (failures come back on the queue)
        sqs.delete_message(QueueUrl=queue, ReceiptHandle=m["ReceiptHandle"])
    return code


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
