"""IAM conformance: every AWS call a function made in this test session (integration tests and the e2e
rehearsal) must be allowed by that function's role in the expanded template - actions, resource ARNs and
the condition keys the template uses (resource tags, leading keys, request tags).

moto evaluates no IAM, so without this a call the deployed role denies passes every other test. Runs
last (tests/conftest.py orders it); run alone, it replays the rehearsal first to have calls to check.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from rehearsal.calls import ACCOUNT, REGION, CallRecord, Resource, load
from tests.conftest import RECORDER, REHEARSAL_CALLS
from tests.iam.evaluator import evaluate
from tests.iam.template_roles import function_statements

FUNCTIONS = ("scaler", "oom_guard", "spot_watch", "notifier", "termination_policy")
_QUEUE = f"arn:aws:sqs:{REGION}:{ACCOUNT}"
# Calls the Lambda service makes with a function's role, not our code: the SQS event source polling
# the notification queue, failed async invocations sent to the DLQ, logs and traces.
PLATFORM_CALLS = [
    *(
        CallRecord("notifier", f"sqs:{a}", [Resource(f"{_QUEUE}:gpufleet-notify")])
        for a in ("ReceiveMessage", "DeleteMessage", "GetQueueAttributes", "ChangeMessageVisibility")
    ),
    *(CallRecord(f, "sqs:SendMessage", [Resource(f"{_QUEUE}:gpufleet-scaler-dlq")]) for f in FUNCTIONS[:3]),
    # (termination_policy is invoked synchronously by EC2 Auto Scaling: no async DLQ)
    *(CallRecord(f, "logs:PutLogEvents", [Resource("*")]) for f in FUNCTIONS),
    *(CallRecord(f, "xray:PutTraceSegments", [Resource("*")]) for f in FUNCTIONS),
]


def recorded_calls(tmp_path: Path) -> list[CallRecord]:
    calls = list(RECORDER.records)
    if REHEARSAL_CALLS.exists():
        calls += load(str(REHEARSAL_CALLS))
    if {c.function for c in calls} >= set(FUNCTIONS):
        return calls
    # Run alone: record a full rehearsal in-process (the same scenario `make demo` plays).
    from rehearsal.moto import moto_server
    from rehearsal.scenario import Rehearsal
    from rehearsal.slack import slack_receiver

    with moto_server() as _, slack_receiver() as slack:
        Rehearsal(tmp_path, slack, echo=lambda _: None).run()
    return list(RECORDER.records)


def denials(calls: list[CallRecord], template_text: str | None = None) -> list[str]:
    """Every distinct (function, action, resource) the function's role would deny, with why."""
    roles = function_statements(template_text)
    found: dict[tuple[str, str, str], str] = {}
    for call in calls:
        for resource in call.resources:
            verdict = evaluate(roles[call.function], call.action, resource.arn, resource.context)
            if not verdict.allowed:
                found.setdefault((call.function, call.action, resource.arn), verdict.why)
    return [f"{f}: {a} on {r}: {why}" for (f, a, r), why in sorted(found.items())]


@pytest.mark.integration
def test_every_recorded_call_is_allowed_by_its_functions_role(tmp_path: Path) -> None:
    calls = recorded_calls(tmp_path)
    by_function: dict[str, set[str]] = defaultdict(set)
    for c in calls:
        by_function[c.function].add(c.action)
    assert set(by_function) == set(FUNCTIONS), by_function.keys()
    unmapped = sorted({r.arn for c in calls for r in c.resources if r.arn.startswith("UNMAPPED")})
    assert unmapped == [], "rehearsal/calls.py has no resource mapping for these calls"
    assert denials(calls + PLATFORM_CALLS) == []
