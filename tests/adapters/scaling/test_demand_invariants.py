"""The demand model's invariants (issue 28, item 1), as hypothesis properties over random sources, answers,
failures and group sets. They hold for every source: Kubernetes, SQS, metric."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from aws_lambda_powertools import Logger
from botocore.exceptions import ClientError
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpufleet.domain.errors import ClusterUnreadable
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Demand,
    Direction,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    Trigger,
    TriggerKind,
    WaitingWork,
)
from gpufleet.kubernetes.pods import ClusterPods, WaitingPod
from gpufleet.policy.fleet import (
    DemandSource,
    GroupSettings,
    KubernetesDemand,
    MetricDemand,
    QueueDemand,
    TargetBand,
)
from gpufleet.scaling.core import decide_reconcile, decide_request
from gpufleet.scaling.demand import NodeShape, pack
from gpufleet.scaling.demand_share import Sharer, split_backlog
from gpufleet.scaling.demand_source import DemandReader
from tests.adapters.scaling.wiring import Pods, shapes
from tests.profiles import examples

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
QUIET = Logger(service="test", level="CRITICAL")
KINDS = ("kubernetes", "sqs", "metric")

instance = st.builds(
    InstanceObservation,
    instance_id=st.text("abcdef0123", min_size=4, max_size=6).map(lambda s: f"i-{s}"),
    lifecycle_state=st.sampled_from(["InService", "InService", "InService", "Pending", "Terminating"]),
    protected_from_scale_in=st.booleans(),
    gpu_utilization=st.one_of(st.none(), st.floats(0, 100)),
    gpu_memory_percent=st.one_of(st.none(), st.floats(0, 100)),
    runs_work=st.booleans(),
)
work = st.builds(
    WaitingWork,
    name=st.just("w"),
    gpus=st.one_of(st.floats(1e-300, 64), st.sampled_from([1.0, 2.0, 4.0, 8.0])),
    count=st.integers(1, 10**12),
    whole_node=st.booleans(),
)


@st.composite
def group(draw: Any, demand: Any) -> tuple[GroupObservation, GroupSettings]:
    insts = draw(st.lists(instance, max_size=8, unique_by=lambda i: i.instance_id))
    max_size = draw(st.integers(0, 40))
    desired = draw(st.integers(0, max_size))
    obs = GroupObservation(
        ref=GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name="g"),
        min_size=0,
        max_size=max_size,
        desired=desired,
        instances=tuple(insts),
        instance_metrics_loaded=draw(st.booleans()),
        gpu_utilization=draw(st.one_of(st.none(), st.floats(0, 100))),
        demand=draw(demand),
    )
    s = GroupSettings(
        min=draw(st.integers(0, 2)),
        target=TargetBand(enabled=draw(st.booleans())),
        scale_in_cooldown_s=0,
        scale_out_cooldown_s=0,
    )
    return obs, s


def demand(unknown: bool) -> Any:
    return st.builds(
        Demand,
        source=st.just("src"),
        waiting=st.lists(work, max_size=4).map(tuple),
        gpus_per_node=st.sampled_from([1.0, 4.0, 8.0]),
        free_gpus=st.lists(st.sampled_from([1.0, 4.0, 8.0]), max_size=6).map(tuple),
        knows_nodes=st.booleans(),
        held_nodes=st.integers(0, 10),
        unreadable=st.just("HTTP 503") if unknown else st.none(),
        scale_in_closed=st.none() if unknown else st.just("node name unmapped"),
    )


firing = st.lists(st.tuples(st.sampled_from(["a-in", "a-out"]), st.sampled_from(list(Direction))), max_size=2)


@given(group(st.one_of(demand(True), demand(False))), firing)
def test_a_source_that_cannot_say_never_lets_a_node_go(pair: Any, alarms: Any) -> None:
    """Unreadable or unmapped: whatever the band, alarms and metrics say, no decision removes a node."""
    obs, s = pair
    for d in (
        decide_reconcile(obs, s, GroupState(), NOW, event_id="t", firing_alarms=alarms),
        decide_request(
            obs,
            s,
            GroupState(),
            NOW,
            event_id="t",
            direction=Direction.IN,
            trigger=Trigger(kind=TriggerKind.OOM_GUARD),
            why="w",
        ),
    ):
        assert d.victims == ()
        assert not (d.action is Action.SCALE_IN and not d.needs_instance_metrics)


known = st.builds(
    Demand,
    source=st.just("src"),
    waiting=st.lists(work, max_size=4).map(tuple),
    gpus_per_node=st.sampled_from([1.0, 4.0, 8.0]),
    free_gpus=st.lists(st.sampled_from([1.0, 4.0, 8.0]), max_size=6).map(tuple),
    knows_nodes=st.booleans(),
    held_nodes=st.integers(0, 10),
)


@given(group(known), firing)
def test_decisions_stay_in_bounds_bounded_by_the_work_and_never_take_a_busy_node(pair: Any, alarms: Any) -> None:
    obs, s = pair
    d = decide_reconcile(obs, s, GroupState(), NOW, event_id="t", firing_alarms=alarms)
    assert d.bounds is not None and (d.desired == obs.desired or d.bounds.min <= d.desired <= d.bounds.max)
    by_id = {i.instance_id: i for i in obs.instances}
    for victim in d.victims:
        i = by_id[victim]
        assert i.in_service and not i.runs_work and not i.protected_from_scale_in
    if d.action is Action.SCALE_OUT and d.trigger.kind is TriggerKind.DEMAND:
        assert obs.demand is not None
        gpn = obs.demand.gpus_per_node
        need = sum(
            w.count if w.whole_node else -(-w.count // max(1, int((gpn + 1e-9) // max(w.gpus, 1e-3))))
            for w in obs.demand.waiting
            if w.gpus <= gpn
        )
        assert d.desired - obs.desired <= need
    if d.action is Action.SCALE_IN and obs.demand is not None and not obs.demand.waiting:
        assert d.desired >= min(obs.desired, obs.demand.held_nodes) or d.trigger.kind is not TriggerKind.DEMAND


@given(
    st.integers(1, 30),
    st.sampled_from([1.0, 4.0, 8.0]),
    st.booleans(),
    st.integers(0, 2),
)
def test_the_demand_path_releases_idle_nodes_whatever_the_bands_switch(
    n: int, gpn: float, band: bool, low: int
) -> None:
    assume(n > low)
    obs = GroupObservation(
        ref=GroupRef(kind=GroupKind.ASG, name="g"),
        min_size=0,
        max_size=40,
        desired=n,
        instances=tuple(
            InstanceObservation(instance_id=f"i-{i}", gpu_utilization=0, gpu_memory_percent=0) for i in range(n)
        ),
        instance_metrics_loaded=True,
        demand=Demand(source="queue q", noun="message", gpus_per_node=gpn),
    )
    s = GroupSettings(min=low, target=TargetBand(enabled=band))
    d = decide_reconcile(obs, s, GroupState(), NOW, event_id="t")
    assert (d.action, d.desired) == (Action.SCALE_IN, low)


@st.composite
def sharer(draw: Any) -> Sharer:
    in_service = draw(st.integers(0, 10))
    per_node = draw(st.sampled_from([0, 1, 2, 8]))
    return Sharer(
        key=draw(st.text("abcdefgh", min_size=1, max_size=3)),
        order=draw(st.one_of(st.none(), st.integers(0, 3))),
        fallback=draw(st.booleans()),
        per_node=per_node,
        nodes_per_unit=1 if per_node else draw(st.integers(1, 3)),
        ready=draw(st.integers(0, in_service)),
        in_service=in_service,
        protected=draw(st.integers(0, in_service)),  # marked or protected nodes (issue 42)
        coming=draw(st.integers(0, 5)),
        growth=draw(st.integers(0, 10)),
    )


@given(
    st.lists(sharer(), min_size=1, max_size=4, unique_by=lambda s: s.key),
    st.integers(0, 10**7),
    st.integers(0, 10**5),
)
def test_a_shared_backlog_counts_each_unit_once_and_running_work_never_waits(
    sharers: list[Sharer], visible: int, in_flight: int
) -> None:
    shares = split_backlog(sharers, visible, in_flight)
    assert set(shares) == {s.key for s in sharers}
    total = sum(s.waiting for s in shares.values())
    assert total <= visible  # in-flight work never adds to what waits
    room = sum(s.ready * s.per_node for s in sharers)
    assert total >= visible - room  # only room the groups' ready nodes have covers waiting units
    unmarked = split_backlog([s.model_copy(update={"protected": 0}) for s in sharers], visible, in_flight)
    for s in sharers:
        held = shares[s.key].held_nodes
        assert 0 <= held <= s.in_service
        # marks only ever let nodes go that nobody's work needs: never more held than where nobody marks
        assert held <= unmarked[s.key].held_nodes
        if not any(x.protected for x in sharers):  # fail closed: every node the units could be spread over
            assert held >= min(s.in_service, in_flight * s.nodes_per_unit)
    more = split_backlog(sharers, visible, in_flight + 1)
    assert all(more[k].held_nodes >= shares[k].held_nodes for k in shares)


def _ffd(sizes: list[float], gpn: float, free: list[float], booting: int) -> int:
    """The reference: first-fit decreasing one item at a time into real bins."""
    bins = [*free, *([gpn] * booting)]
    new = 0
    for size in sorted(sizes, reverse=True):
        if size > gpn + 1e-9:
            continue
        size = max(size, 1e-3)
        for i, room in enumerate(bins):
            if room + 1e-9 >= size:
                bins[i] -= size
                break
        else:
            bins.append(gpn - size)
            new += 1
    return new


@settings(max_examples=examples(300))
@given(
    st.lists(st.sampled_from([0.5, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0]), max_size=40),
    st.sampled_from([1.0, 4.0, 8.0]),
    st.lists(st.sampled_from([0.5, 1.0, 4.0, 8.0]), max_size=5),
    st.integers(0, 3),
)
def test_the_closed_form_pack_is_first_fit_decreasing(
    sizes: list[float], gpn: float, free: list[float], booting: int
) -> None:
    assume(all(f <= gpn for f in free))
    assert pack(Counter(sizes), gpn, free, booting).new_nodes == _ffd(sizes, gpn, free, booting)


# ---- isolation: random sources, random failures ----

FAILURES = [
    None,
    KeyError("Attributes"),
    OverflowError("int too large"),
    MemoryError(),
    ValueError("bad"),
    ClientError({"Error": {"Code": "Throttling", "Message": "x"}}, "Op"),
]


class Answers:
    """Every adapter of the reader, each failing with a chosen exception or answering sanely."""

    def __init__(self, fail: dict[str, BaseException | None]) -> None:
        self.fail = fail

    def get_queue_attributes(self, **kw: Any) -> dict[str, Any]:
        if self.fail["sqs"] is not None:
            raise self.fail["sqs"]
        return {"Attributes": {"ApproximateNumberOfMessages": "3", "ApproximateNumberOfMessagesNotVisible": "1"}}

    def get_metric_data(self, **kw: Any) -> dict[str, Any]:
        if self.fail["metric"] is not None:
            raise self.fail["metric"]
        return {"MetricDataResults": [{"Id": "m0", "Values": [4.0], "Timestamps": [NOW]}]}

    def pods(self, cluster: str, resources: Any, nodes: Any = None, **_: Any) -> ClusterPods:
        if self.fail["kubernetes"] is not None:
            error = self.fail["kubernetes"]
            raise ClusterUnreadable(cluster, "down") if isinstance(error, ClientError) else error
        return ClusterPods(cluster=cluster, waiting=(WaitingPod(namespace="a", name="p", gpus=1),))


SOURCES = {
    "kubernetes": DemandSource(kubernetes=KubernetesDemand()),
    "sqs": DemandSource(sqs=QueueDemand(queue_url="https://sqs.us-east-1.amazonaws.com/1/q"), gpus_per_node=8),
    "metric": DemandSource(metric=MetricDemand(namespace="S", metric_name="P"), gpus_per_node=8),
}


@given(
    st.fixed_dictionaries({k: st.sampled_from(FAILURES) for k in KINDS}),
    st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
)
def test_one_sources_failure_is_its_groups_alone_and_every_group_is_decided(
    fail: dict[str, BaseException | None], kinds: list[str]
) -> None:
    answers = Answers(fail)
    reader = DemandReader(
        sqs=answers,
        cloudwatch=answers,
        cluster_pods=Pods(answers.pods),
        groups=shapes(lambda c, n: NodeShape(gpus=8)),
        instances_of=lambda names: {},
        logger=QUIET,
    )
    pairs = []
    for i, kind in enumerate(kinds):
        ref = (
            GroupRef(kind=GroupKind.EKS_NODEGROUP, cluster="ml", name=f"g{i}")
            if kind == "kubernetes"
            else GroupRef(kind=GroupKind.ASG, name=f"g{i}")
        )
        obs = GroupObservation(
            ref=ref, min_size=0, max_size=10, desired=1, instances=(InstanceObservation(instance_id=f"i-{i}"),)
        )
        pairs.append((obs, GroupSettings(demand=SOURCES[kind])))
    out = reader.attach(pairs, NOW)
    assert [o.ref.key for o, _ in out] == [o.ref.key for o, _ in pairs]
    for (obs, s), kind in zip(out, kinds, strict=True):
        assert obs.demand is not None
        assert obs.demand.known == (fail[kind] is None)
        d = decide_reconcile(obs, s, GroupState(), NOW, event_id="t")
        assert d.victims == () or obs.demand.known
        assert 0 <= d.desired <= 10 and not math.isnan(float(d.desired))
