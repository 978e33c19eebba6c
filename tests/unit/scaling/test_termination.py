"""The custom termination policy's rule: idle GPU instances only, per requested AZ and market."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpufleet.domain.models import InstanceObservation
from gpufleet.events.model import CapacityToTerminate, TerminationCandidate, TerminationRequest
from gpufleet.policy.fleet import IdleThreshold
from gpufleet.scaling.termination import choose_terminations

IDLE = IdleThreshold(gpu_utilization=5, memory_percent=10)


def request(capacity: list[tuple[str, int, str]], candidates: list[tuple[str, str, str]]) -> TerminationRequest:
    return TerminationRequest(
        event_id="t",
        asg_name="train",
        capacity=tuple(CapacityToTerminate(availability_zone=az, capacity=n, market=m) for az, n, m in capacity),
        instances=tuple(TerminationCandidate(instance_id=i, availability_zone=az, market=m) for i, az, m in candidates),
        cause="SCALE_IN",
    )


def obs(iid: str, util: float | None, mem: float | None, **kw: object) -> InstanceObservation:
    return InstanceObservation(instance_id=iid, gpu_utilization=util, gpu_memory_percent=mem, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"a": (0, 1), "b": (90, 70), "c": (1, 2)}, ("a", "c")),  # idlest first, busy never
        ({"a": (50, 1), "b": (90, 70), "c": (1, 60)}, ()),  # memory held counts as busy
        ({"a": (0, 0), "b": (0, 1), "c": (0, 2)}, ("a", "b")),  # never more than asked
        ({"a": (None, None), "b": (0, 1)}, ("b",)),  # no metrics: unknown is busy
        ({}, ()),  # nothing observed
    ],
)
def test_only_idle_instances_idlest_first(
    metrics: dict[str, tuple[float | None, float | None]], expected: tuple[str, ...]
) -> None:
    r = request([("az1", 2, "spot")], [(i, "az1", "spot") for i in "abc"])
    observed = {i: obs(i, u, m) for i, (u, m) in metrics.items()}
    assert choose_terminations(r, observed, IDLE).instance_ids == expected


def test_each_az_and_market_gets_at_most_its_own_capacity() -> None:
    r = request(
        [("az1", 1, "on-demand"), ("az1", 1, "spot"), ("az2", 2, "on-demand")],
        [("od1", "az1", "on-demand"), ("od2", "az1", "on-demand"), ("sp1", "az1", "spot"), ("od3", "az2", "on-demand")],
    )
    observed = {i: obs(i, 0, 1) for i in ("od1", "od2", "sp1", "od3")}
    answer = choose_terminations(r, observed, IDLE)
    assert answer.instance_ids == ("od1", "sp1", "od3")  # one per az1 bucket, az2's only candidate
    assert answer.requested == 4 and "3 of 4 ready" in answer.reason


def test_a_protected_or_pending_instance_is_never_chosen() -> None:
    r = request([("az1", 2, "spot")], [("p", "az1", "spot"), ("q", "az1", "spot")])
    observed = {"p": obs("p", 0, 0, protected_from_scale_in=True), "q": obs("q", 0, 0, lifecycle_state="Pending")}
    answer = choose_terminations(r, observed, IDLE)
    assert answer.instance_ids == () and "scale-in protected" in answer.reason and "not InService" in answer.reason


@given(
    st.dictionaries(
        st.sampled_from(list("abcdefgh")),
        st.tuples(st.none() | st.floats(0, 100), st.none() | st.floats(0, 100)),
    ),
    st.integers(0, 10),
)
def test_never_more_than_asked_and_never_a_busy_gpu(
    metrics: dict[str, tuple[float | None, float | None]], n: int
) -> None:
    r = request([("az1", n, "spot")], [(i, "az1", "spot") for i in "abcdefgh"])
    observed = {i: obs(i, u, m) for i, (u, m) in metrics.items()}
    chosen = choose_terminations(r, observed, IDLE).instance_ids
    assert len(chosen) <= n and len(set(chosen)) == len(chosen)
    for i in chosen:
        u, m = metrics[i]
        assert u is not None and m is not None and u <= 5 and m <= 10
