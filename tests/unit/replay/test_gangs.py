"""Gangs in the replay (start together or not at all, die together), injected partial launches (desired
above the instances launched, as AWS shows it), the partially billed gang node-minutes, and how gpufleet's
real core and the Cluster Autoscaler model answer a launch that came in part."""

from __future__ import annotations

import random
from datetime import datetime
from typing import Any

from gpufleet.domain import defaults
from gpufleet.domain.models import Decision, GroupObservation, TriggerKind
from gpufleet.policy.fleet import GroupSettings, parse_policy
from gpufleet_tools.replay import shortage
from gpufleet_tools.replay.baselines import ClusterAutoscaler
from gpufleet_tools.replay.core import Experiment, GpufleetController
from gpufleet_tools.replay.model import CapacityShortage, Pod, ReplayOptions
from gpufleet_tools.replay.policy import Workload, recommended_policy
from gpufleet_tools.replay.report import compare, report_json, report_md
from gpufleet_tools.replay.simulate import Cluster, run
from gpufleet_tools.replay.traces import training_trace

OPTS = ReplayOptions(gpus_per_node=8, boot_minutes=5)
ALWAYS_SHORT = CapacityShortage(share=1.0, window_minutes=30, nodes=1)  # every 30-min slot starts 1 node
POLICY = parse_policy("defaults: {target: {low: 60, high: 90}, scale_in_step: '50%', scale_in_cooldown_s: 300}")


def _gang(name: str, members: int, arrival: int = 0, duration: int | None = 60) -> list[Pod]:
    return [Pod(name=f"{name}-{m}", arrival=arrival, duration=duration, gpus=8, gang=name) for m in range(members)]


class Recording(GpufleetController):
    """gpufleet's controller, keeping what the core saw and the decisions the replay applied."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[GroupObservation] = []
        self.applied: list[tuple[int, Decision]] = []

    def decide(self, obs: GroupObservation, settings: GroupSettings, now: datetime) -> Decision:
        self.seen.append(obs)
        return super().decide(obs, settings, now)

    def apply(self, decision: Decision, cluster: Cluster, t: int) -> None:
        self.applied.append((t, decision))
        super().apply(decision, cluster, t)


class RaiseOnce:
    """A controller that asks the ASG for `count` nodes at minute 0 and does nothing else."""

    name = "raise-once"

    def __init__(self, count: int) -> None:
        self.count = count

    def tick(self, cluster: Cluster, t: int) -> None:
        if t == 0:
            shortage.raise_desired(cluster, self.count, t)


def test_a_gang_starts_only_when_all_its_pods_fit_at_once() -> None:
    pods = [*_gang("job-1", 2, duration=None), Pod(name="small", arrival=0, duration=None, gpus=1)]
    cluster = Cluster(pods, OPTS)
    cluster.launch(1, -10, booted=True)
    cluster.advance(0)
    assert cluster.pending == [0, 1] and cluster.started_at[2] == 0  # one node: no member runs, the small pod does
    cluster.launch(2, 0, booted=True)
    cluster.advance(1)
    assert cluster.pending == [] and cluster.started_at[0] == cluster.started_at[1] == 1
    assert cluster.node_of[0] is not cluster.node_of[1] and cluster.gangs.started == {"job-1": 1}


def test_a_node_removed_under_one_member_stops_the_whole_gang() -> None:
    cluster = Cluster(_gang("job-1", 2, duration=None), OPTS)
    cluster.launch(2, -10, booted=True)
    cluster.advance(0)
    victim = cluster.node_of[0]
    assert victim is not None
    assert cluster.terminate([victim.node_id], 5) == 2  # both members disrupted, both wait again
    assert sorted(cluster.pending) == [0, 1] and cluster.used_milli == 0 and cluster.lost_milli_minutes == 2 * 5 * 8000


def test_a_short_launch_keeps_desired_and_the_missing_nodes_come_when_capacity_returns() -> None:
    cluster = Cluster([], OPTS.model_copy(update={"shortage": ALWAYS_SHORT}))
    assert shortage.raise_desired(cluster, 3, 0) == 1
    assert (len(cluster.nodes), cluster.desired, cluster.asg.missing) == (1, 3, 2)
    for t in range(1, 30):
        cluster.advance(t)
    assert len(cluster.nodes) == 1  # slot 0's one node is spent: the group keeps trying
    cluster.advance(30)
    assert (len(cluster.nodes), cluster.desired) == (2, 3)  # slot 1 starts one more
    assert shortage.cancel(cluster, 5) == 1 and cluster.desired == 2


def test_shortage_slots_are_seeded_and_the_same_for_every_run() -> None:
    a, b = shortage.Asg(CapacityShortage(share=0.5, seed=7)), shortage.Asg(CapacityShortage(share=0.5, seed=7))
    slots = [a.short(t * 60) for t in range(200)]
    assert slots == [b.short(t * 60) for t in range(200)] and 60 < sum(slots) < 140
    assert not any(shortage.Asg(CapacityShortage(share=0.0)).short(t) for t in range(0, 6000, 60))
    assert not any(shortage.Asg(None).short(t) for t in range(0, 6000, 60))


def test_partially_billed_gang_node_minutes_count_booted_nodes_while_the_gang_cannot_start() -> None:
    options = OPTS.model_copy(update={"shortage": ALWAYS_SHORT})
    r = run(_gang("job-1", 2, duration=30), 90, RaiseOnce(2), options, initial_nodes=0).result
    # node 1 launched at 0 (booted at 5), node 2 at 30 (slot 1; booted at 35): the gang starts at 35,
    # and node 1 was billed for it, booted, from minute 5 to 34.
    assert (r.gangs_started, r.gang_wait_minutes, r.gang_partial_node_minutes) == (1, 35.0, 30.0)
    whole = run(_gang("job-1", 2, duration=30), 90, RaiseOnce(2), OPTS, initial_nodes=0).result
    assert (whole.gang_wait_minutes, whole.gang_partial_node_minutes) == (5.0, 0.0)  # the boot is not counted


def test_gpufleet_hands_each_gang_to_the_core_with_its_job_id_and_shows_missing_nodes_as_aws_does() -> None:
    pods = [*_gang("job-1", 2), Pod(name="one", arrival=0, duration=None, gpus=1)]
    cluster = Cluster(pods, OPTS.model_copy(update={"shortage": ALWAYS_SHORT}))
    g = Recording(POLICY, cluster.options, 10)
    demand = g.demand(cluster)
    assert demand is not None and demand.waiting == ()
    cluster.pending = [0, 1, 2]  # all three wait (as at minute 0, before any node)
    demand = g.demand(cluster)
    assert demand is not None
    assert {(w.gang, w.gpus, w.count) for w in demand.waiting} == {("job-1", 8.0, 2), ("", 1.0, 1)}
    cluster.pending = []
    cluster.launch(1, -10, booted=True)
    cluster.advance(0)  # the 1-GPU pod runs on the node up; the gang waits
    g.tick(cluster, 0)  # the core asks for the gang's 2 nodes in one change; EC2 starts 1
    assert (cluster.desired, len(cluster.nodes)) == (3, 2)
    g.seen.clear()
    cluster.advance(1)
    g.tick(cluster, 1)
    assert g.seen[0].desired == 3 and len(g.seen[0].instances) == 2


def test_gpufleet_gives_back_a_partial_gang_launch_after_the_core_s_timeout() -> None:
    options = OPTS.model_copy(update={"shortage": ALWAYS_SHORT})
    cluster = Cluster(_gang("job-1", 3), options)
    cluster.launch(1, -10, booted=True)  # the group's min node, busy with nothing
    g = Recording(POLICY, options, 10, Experiment(consolidation_off=True))
    timeout = defaults.GANG_LAUNCH_TIMEOUT_S // 60
    for t in range(timeout + 2):
        cluster.advance(t)
        g.tick(cluster, t)
    gave_back = [t for t, d in g.applied if d.trigger.kind is TriggerKind.GANG_PARTIAL]
    assert gave_back and gave_back[0] >= timeout  # not before the core's timeout
    assert cluster.asg.missing == 0 and cluster.desired == len(cluster.nodes)  # the launches owed were cancelled
    assert g.state.gang_gave_back_at is not None  # gangs rest, as StateStore.commit records it


def test_cluster_autoscaler_keeps_what_came_gives_up_after_15_minutes_and_backs_off() -> None:
    options = OPTS.model_copy(update={"shortage": CapacityShortage(share=1.0, window_minutes=120, nodes=1)})
    cluster = Cluster(_gang("job-1", 4), options)
    ca = ClusterAutoscaler(options, 10)
    for t in range(15):
        cluster.advance(t)
        ca.tick(cluster, t)
    assert (len(cluster.nodes), cluster.desired) == (1, 4)  # raised by 4 (not atomic), 1 came
    cluster.advance(15)
    ca.tick(cluster, 15)
    assert (len(cluster.nodes), cluster.desired, ca.backoff_until) == (1, 1, 20)  # gave up: 5 min backoff
    for t in range(16, 36):
        cluster.advance(t)
        ca.tick(cluster, t)
    # at 20 it asked for 3 (the kept node holds one member), at 35 gave up again: backoff doubles to 10 min
    assert ca.failures == 2 and ca.backoff_until == 45 and len(cluster.nodes) == 1


def test_the_training_trace_s_multi_node_jobs_are_gangs() -> None:
    trace = training_trace(random.Random(13), days=1)
    gangs: dict[str, list[Pod]] = {}
    for p in trace.pods:
        if p.gang:
            gangs.setdefault(p.gang, []).append(p)
    assert gangs and all(len(m) in (2, 4) and len({(p.arrival, p.duration) for p in m}) == 1 for m in gangs.values())
    assert all(p.gpus <= 8 for p in trace.pods if not p.gang)


def test_the_report_shows_the_gang_table_and_states_the_injected_shortage() -> None:
    trace = training_trace(random.Random(13), days=1)
    options = ReplayOptions(shortage=CapacityShortage())
    c = compare(trace, recommended_policy(Workload.BATCH), options, random.Random(13))
    md = report_md(c)
    assert "Injected capacity shortage: 25% of 60-min slots start at most 1 node(s) (seed 13)" in md
    assert "| partially billed gang node-min | gangs started |" in md
    runs = {r["name"]: r for r in report_json(c)["runs"]}  # type: ignore[attr-defined]
    assert runs["gpufleet"]["gangs_started"] > 0 and runs["cluster-autoscaler"]["gangs_started"] > 0
    assert runs["oracle"]["gang_partial_node_minutes"] == 0.0
