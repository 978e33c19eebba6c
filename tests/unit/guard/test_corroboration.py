"""The pure corroboration rule: an instance is replaced for a GPU fault only when its own namespace
(written by its own credentials alone) reports a fault on the same GPU; any other finding holds the
replacement with a reason on-call can act on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.guard.core import (
    GpuRef,
    GuardState,
    HealthCounts,
    corroborated,
    forgery_reason,
    health_findings,
    hold_unconfirmed,
    next_guard_state,
)
from gpufleet.policy.guard import HealthSettings
from tests.profiles import examples

S = HealthSettings(replace_unhealthy=True)
G = "asg:infer"


def counts(iid: str, gpu: int, **kw: float) -> HealthCounts:
    return HealthCounts(gpu=GpuRef(group=G, instance_id=iid, gpu_index=gpu), **kw)


@pytest.mark.parametrize(
    ("shared", "own", "confirmed"),
    [
        ({"lost": 1}, {}, set()),  # the shared namespace alone: possibly another node's forgery
        ({"lost": 1}, {"lost": 1}, {"i-v"}),
        ({"lost": 1}, {"xid_errors": 2}, {"i-v"}),  # any fault the policy checks, on the same GPU
        ({"xid_errors": 1}, {"xid_errors": 0}, set()),  # a zero confirms nothing
        ({"ecc_double_bit": 1}, {"ecc_double_bit": 1}, {"i-v"}),
        ({"remapped_uncorrectable": 1}, {"remapped_uncorrectable": 3}, {"i-v"}),
    ],
)
def test_confirmed_only_by_the_same_gpu_in_the_instances_own_namespace(
    shared: dict[str, float], own: dict[str, float], confirmed: set[str]
) -> None:
    findings = health_findings([counts("i-v", 1, **shared)], S)
    assert corroborated(findings, {"i-v": [counts("i-v", 1, **own)]}, S) == confirmed


def test_another_gpu_or_another_instance_confirms_nothing() -> None:
    findings = health_findings([counts("i-v", 1, lost=1)], S)
    assert corroborated(findings, {"i-v": [counts("i-v", 0, lost=1)]}, S) == set()
    assert corroborated(findings, {"i-forger": [counts("i-forger", 1, lost=1)]}, S) == set()


def test_a_fault_the_policy_ignores_confirms_nothing() -> None:
    findings = health_findings([counts("i-v", 1, lost=1)], S)
    no_lost = S.model_copy(update={"gpu_lost": False, "xid": True})
    assert corroborated(findings, {"i-v": [counts("i-v", 1, lost=1)]}, no_lost) == set()


def test_held_replacements_say_why_once_per_instance() -> None:
    findings = health_findings([counts("i-v", 0, lost=1), counts("i-v", 1, lost=1), counts("i-ok", 0, lost=1)], S)
    ready, held = hold_unconfirmed(findings, {"i-ok"})
    assert [f.gpu.instance_id for f in ready] == ["i-ok"]
    assert [(r.instance_id, r.act, r.reason) for r in held] == [("i-v", False, forgery_reason("i-v"))]
    assert "not replacing; possible forgery from another node" in held[0].reason
    _, unread = hold_unconfirmed(findings, set(), {"i-v": "could not read"})
    assert {r.instance_id: r.reason for r in unread} == {"i-ok": forgery_reason("i-ok"), "i-v": "could not read"}


def test_the_guard_remembers_a_held_instance_only_while_it_has_a_finding() -> None:
    findings = health_findings([counts("i-v", 1, lost=1)], S)
    _, held = hold_unconfirmed(findings, set())
    after = next_guard_state(GuardState(), [], findings, [], held)
    assert after.unconfirmed == {"i-v": forgery_reason("i-v")}
    assert next_guard_state(after, [], [], [], held).unconfirmed == {}  # the finding cleared


FAULTS = st.fixed_dictionaries(
    {k: st.sampled_from([0.0, 1.0, 5.0]) for k in ("lost", "xid_errors", "ecc_double_bit", "remapped_uncorrectable")}
)


@settings(max_examples=examples(60), deadline=None)
@given(
    shared=st.lists(st.tuples(st.sampled_from(["i-a", "i-b", "i-c"]), st.integers(0, 3), FAULTS), max_size=6),
    forged=st.lists(st.tuples(st.sampled_from(["i-a", "i-b", "i-c"]), st.integers(0, 3), FAULTS), max_size=6),
)
def test_a_forger_that_cannot_write_the_victims_own_namespace_never_gets_it_replaced(
    shared: list[tuple[str, int, dict[str, float]]], forged: list[tuple[str, int, dict[str, float]]]
) -> None:
    """Whatever the shared namespace says, an instance whose own namespace is empty is never confirmed;
    what a forger writes lands in its own namespace (i-forger's), which confirms only i-forger."""
    findings = health_findings([counts(i, g, **f) for i, g, f in shared], S)
    own = {"i-forger": [counts("i-forger", g, **f) for _, g, f in forged]}
    assert corroborated(findings, own, S) <= {"i-forger"}
    assert corroborated(findings, own, S) == set()
    ready, held = hold_unconfirmed(findings, corroborated(findings, own, S))
    assert ready == [] and {r.instance_id for r in held} == {f.gpu.instance_id for f in findings}
    assert not any(r.act for r in held)
