"""validate-policy on consolidation by attrition: a group gpufleet cannot close nodes of would never scale in
(attrition removes only closed nodes), and attrition under owner: external can only advise."""

from __future__ import annotations

from gpufleet.policy.checks import policy_problems
from gpufleet.policy.fleet import parse_policy

POLICY = """
version: 1
groups:
  - {kind: asg, name: plain, consolidate: attrition}
  - {kind: eks-nodegroup, cluster: ml, name: gpu, consolidate: attrition, demand: {kubernetes: {}}}
  - {kind: eks-nodegroup, cluster: ml, name: ext, consolidate: attrition, owner: external, demand: {kubernetes: {}}}
  - {kind: hyperpod, cluster: hp, name: workers, max: 4, consolidate: attrition}
"""


def test_attrition_without_a_way_to_close_nodes_or_under_external_is_a_problem() -> None:
    problems = policy_problems(parse_policy(POLICY, "test"))
    assert any(
        p.startswith("groups[0] (plain): consolidate: attrition needs nodes gpufleet can close") for p in problems
    )
    assert any(p.startswith("groups[2] (ml/ext): consolidate: attrition under owner: external") for p in problems)
    assert not any(p.startswith(("groups[1]", "groups[3]")) for p in problems)


def test_attrition_in_the_defaults_is_checked_on_every_rule() -> None:
    text = "version: 1\ndefaults: {consolidate: attrition}\ngroups:\n  - {kind: asg, name: plain}\n"
    assert any("needs nodes gpufleet can close" in p for p in policy_problems(parse_policy(text, "test")))


def test_attrition_in_the_defaults_reaching_tag_discovered_groups_is_a_problem() -> None:
    text = "version: 1\ndefaults: {consolidate: attrition}\n"  # discovery on: every tagged group gets it
    [problem] = policy_problems(parse_policy(text, "test"))
    assert problem.startswith("defaults: consolidate: attrition reaches every tag-discovered group")
