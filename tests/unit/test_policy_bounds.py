"""A hostile or broken policy document is a policy error like any other (issue 22, item 4): deep nesting,
alias bombs and oversized texts give one clear line, never a RecursionError, so the last good policy holds
(the loader that holds it: tests/adapters/test_policy_last_good.py)."""

from __future__ import annotations

import pytest

from gpufleet.domain.errors import PolicyError
from gpufleet.policy.fleet import MAX_POLICY_ALIASES, MAX_POLICY_BYTES, MAX_POLICY_DEPTH, parse_policy

NESTED = "defaults: " + "[" * 500 + "]" * 500  # 1 KB, 500 levels: RecursionError before the bound
ALIAS_BOMB = "a: &a [x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(20)
)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (NESTED, f"nested deeper than {MAX_POLICY_DEPTH} levels"),
        (ALIAS_BOMB, f"more than {MAX_POLICY_ALIASES} aliases"),
        ("# " + "x" * MAX_POLICY_BYTES, "more than a policy may be"),
        ("{" * 100_000, "nested deeper than"),  # JSON goes through the same loader
    ],
)
def test_a_hostile_document_is_one_policy_error(text: str, says: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(text, "ssm:/gpufleet/policy")
    [problem] = raised.value.problems
    assert says in problem and problem.startswith("ssm:/gpufleet/policy: ") and "\n" not in problem


def test_real_policies_are_well_within_the_bounds() -> None:
    nested = "defaults:\n  target: {low: 20, high: 80}\n  idle: {gpu_utilization: 5}\n"
    assert parse_policy(nested).defaults.target.low == 20
    anchors = "defaults: &d {scale_out_cooldown_s: 120}\n"
    assert parse_policy(anchors).defaults.scale_out_cooldown_s == 120


# Found by the fuzzer (tests/unit/test_fuzz_inputs.py): a scalar YAML cannot construct escaped as ValueError,
# KeyError or AttributeError, past LastGoodPolicy (it catches PolicyError only), so every function failed.
@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a: 2026-02-30", "'2026-02-30' is not a valid timestamp"),  # implicit: looks like a date, is none
        ("a: 2026-11-23 25:00:00", "'2026-11-23 25:00:00' is not a valid timestamp"),
        ("a: !!int x", "'x' is not a valid int"),
        ("a: !!int 0b2", "'0b2' is not a valid int"),
        ("a: " + "9" * 5000, "is not a valid int"),  # past Python's 4,300-digit limit on int()
        ("a: !!float x", "'x' is not a valid float"),
        ("a: !!bool x", "'x' is not a valid bool"),
        ("a: !!timestamp x", "'x' is not a valid timestamp"),
        ("a: !!timestamp 2001-13-01", "'2001-13-01' is not a valid timestamp"),
    ],
)
def test_a_scalar_yaml_cannot_construct_is_one_policy_error(text: str, says: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(text, "ssm:/gpufleet/policy")
    [problem] = raised.value.problems
    assert problem.startswith("ssm:/gpufleet/policy: not valid YAML: line 1, column 4: ") and says in problem
    assert "\n" not in problem and len(problem) < 300, problem


def test_every_yaml_error_is_one_line() -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy("a: !!omap [1]", "p.yaml")
    assert raised.value.problems == [
        "p.yaml: not valid YAML: line 1, column 12: while constructing an ordered map; "
        "expected a mapping of length 1, but found scalar"
    ]


LONE = '"x\\uD800"'  # a YAML escape that decodes to a lone surrogate (raw ones are refused by PyYAML's reader)
SCHEDULE = "{name: N, cron: '0 8 * * *', duration_minutes: 60, desired: 1}"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (f"groups: [{{name: {LONE}}}]", "groups[0].name"),
        (f"groups: [{{name: g, cluster: {LONE}, kind: eks-nodegroup}}]", "groups[0].cluster"),
        (f"groups: [{{tags: {{team: {LONE}}}}}]", "groups[0].tags.team"),
        (f"groups: [{{tags: {{{LONE}: v}}}}]", "groups[0].tags: key 'x\\ud800'"),
        (f"{LONE}: 1", "(document): key 'x\\ud800'"),
        (f"alarm_prefix: {LONE}", "alarm_prefix"),
        (f"discovery: {{tag_key: {LONE}}}", "discovery.tag_key"),
        (f"discovery: {{tag_value: {LONE}}}", "discovery.tag_value"),
        (f"alarms: [{{alarm: {LONE}, direction: out}}]", "alarms[0].alarm"),
        (f"defaults: {{schedules: [{SCHEDULE.replace('N', LONE)}]}}", "defaults.schedules[0].name"),
        (f"groups: [{{name: q, demand: {{sqs: {{queue_url: {LONE[:1]}https://q/{LONE[1:]}}}}}}}]", "queue_url"),
        (f"defaults: {{demand: {{metric: {{namespace: {LONE}, metric_name: m}}}}}}", "metric.namespace"),
        (f"defaults: {{demand: {{kubernetes: {{gpu_resources: {{{LONE}: 1}}}}}}}}", "gpu_resources: key"),
        (f"notifications: {{routes: [{{match: {{groups: [{LONE}]}}}}]}}", "notifications.routes[0].match.groups[0]"),
        (f"notifications: {{default_route: {{slack_channel: {LONE}}}}}", "default_route.slack_channel"),
        (f"spot: {{groups: [{{group: {LONE}}}]}}", "spot.groups[0].group"),
        (f"spot: {{prices: {{spot: {{{LONE}: 1.5}}}}}}", "spot.prices.spot: key"),
    ],
)
def test_a_lone_surrogate_anywhere_is_a_policy_error_naming_where(text: str, where: str) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(text, "p.yaml")
    [problem] = raised.value.problems
    assert where in problem and problem.endswith("text is not valid Unicode (lone surrogate)"), problem
    problem.encode("utf-8")  # the error itself can be logged, stored and posted


def test_text_outside_the_basic_plane_is_still_fine() -> None:
    policy = parse_policy('groups: [{name: "gpu-\\U0001F525", tags: {"t\\u00e9am": "\\uD83D\\uDD25"}}]')
    assert policy.groups[0].name == "gpu-\U0001f525" and policy.groups[0].tags == {"t\u00e9am": "\U0001f525"}


@pytest.mark.parametrize("price", [".nan", ".inf", "-1"])
def test_a_spot_price_must_be_a_finite_amount(price: str) -> None:
    """Found by the policy fuzz: `.nan` was accepted and every cost in a fallback note became nan."""
    text = f"spot:\n  prices:\n    on_demand:\n      g5.12xlarge: {price}\n"
    with pytest.raises(PolicyError, match=r"spot\.prices\.on_demand"):
        parse_policy(text)
