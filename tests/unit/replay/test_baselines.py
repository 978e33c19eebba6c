"""Each baseline does what its owner documents (and the oracle is a lower bound)."""

from __future__ import annotations

import random

from gpufleet_tools.replay.baselines import AsgTargetTracking, ClusterAutoscaler, StaticPeak, demand_milli, oracle
from gpufleet_tools.replay.model import MILLI_PER_GPU, Placement, Pod, ReplayOptions
from gpufleet_tools.replay.simulate import Cluster, run

OPTS = ReplayOptions(gpus_per_node=4, boot_minutes=3)


def _busy_cluster(pods: list[Pod], nodes: int, options: ReplayOptions = OPTS) -> Cluster:
    cluster = Cluster(pods, options)
    cluster.launch(nodes, -10, booted=True)
    cluster.advance(0)
    return cluster


def test_oracle_holds_the_demand_packed_and_launches_a_boot_ahead() -> None:
    pods = [Pod(name="a", arrival=0, duration=10, gpus=3), Pod(name="b", arrival=20, duration=10, gpus=4)]
    pods += [Pod(name="c", arrival=20, duration=10, milli=500)]
    assert demand_milli(pods, 40)[:2] == [3000, 3000] and demand_milli(pods, 40)[20] == 4500
    out = oracle(pods, 40, OPTS.model_copy(update={"min_nodes": 0}))
    assert out.timeline.nodes[0] == 1 and out.timeline.nodes[12] == 0
    assert out.timeline.nodes[17] == 2  # launched 3 minutes before the 4.5 GPUs arrive (2 nodes of 4)
    assert out.result.pending_gpu_minutes == 0 and out.result.pods_disrupted == 0
    assert out.result.gpu_hours_used == round((3 * 10 + 4.5 * 10) / 60, 2)


def test_oracle_is_a_lower_bound_for_every_simulated_policy() -> None:
    rng = random.Random(3)
    pods = sorted(
        (
            Pod(name=f"p{i}", arrival=rng.randrange(300), duration=rng.randint(5, 60), gpus=rng.choice([1, 2]))
            for i in range(80)
        ),
        key=lambda p: p.arrival,
    )
    best = oracle(pods, 300, OPTS)
    peak, first = max(best.timeline.nodes), best.timeline.nodes[0]
    assert run(pods, 300, StaticPeak(), OPTS, initial_nodes=peak).result.node_hours >= best.result.node_hours
    for controller in (AsgTargetTracking(OPTS, 50, random.Random(1)), ClusterAutoscaler(OPTS, 50)):
        assert run(pods, 300, controller, OPTS, initial_nodes=first).result.node_hours >= best.result.node_hours


def test_static_peak_never_changes_the_fleet() -> None:
    pods = [Pod(name="a", arrival=5, duration=10)]
    out = run(pods, 60, StaticPeak(), OPTS, initial_nodes=3)
    assert set(out.timeline.nodes) == {3} and out.result.scaling_actions == 0


def test_target_tracking_scales_out_proportionally_after_three_high_minutes() -> None:
    pods = [Pod(name=f"p{i}", arrival=0, duration=None) for i in range(8)]  # 8 of 8 GPUs: 100 %
    cluster = _busy_cluster(pods, 2)
    tt = AsgTargetTracking(OPTS.model_copy(update={"tt_target": 50.0}), 20, random.Random(1))
    for t in range(2):
        tt.tick(cluster, t)
    assert len(cluster.nodes) == 2  # 2 datapoints above target: not yet
    tt.tick(cluster, 2)
    assert len(cluster.nodes) == 4  # ceil(2 x 100 / 50): proportional, in one step
    tt.tick(cluster, 3)
    assert len(cluster.nodes) == 4  # the new nodes are warming up: desired already covers them


def test_target_tracking_scales_in_after_fifteen_low_minutes_rounding_down_and_blind() -> None:
    pods = [Pod(name=f"p{i}", arrival=0, duration=None) for i in range(4)]
    options = OPTS.model_copy(update={"tt_target": 70.0, "placement": Placement.SPREAD})
    cluster = _busy_cluster(pods, 4)  # 4 of 16 GPUs: 25 %, one pod on each node
    tt = AsgTargetTracking(options, 20, random.Random(1))
    for t in range(14):
        tt.tick(cluster, t)
    assert len(cluster.nodes) == 4
    tt.tick(cluster, 14)
    assert len(cluster.nodes) == 2  # keep ceil(4 x 25 / 70) = 2: removes 2, not 3 (rounds the removal down)
    assert cluster.disrupted == 2  # the termination policy does not look at pods
    assert sorted(cluster.pending) == sorted(i for i in range(4) if cluster.node_of[i] is None)


def test_cluster_autoscaler_scales_up_for_pending_pods_counting_booting_nodes() -> None:
    pods = [Pod(name=f"p{i}", arrival=0, duration=None, gpus=g) for i, g in enumerate((4, 4, 2, 2, 1))]
    cluster = _busy_cluster(pods, 0)
    ca = ClusterAutoscaler(OPTS, 10)
    ca.tick(cluster, 0)
    assert len(cluster.booting) == 4  # first-fit decreasing: [4], [4], [2, 2], [1]
    ca.tick(cluster, 1)
    assert len(cluster.nodes) == 4  # the booting nodes already cover the pending pods


def test_cluster_autoscaler_removes_an_underused_node_after_ten_minutes_evicting_its_pod() -> None:
    pods = [Pod(name="big", arrival=0, duration=None, gpus=3), Pod(name="small", arrival=0, duration=None)]
    cluster = _busy_cluster(pods, 2)  # spread: 3 GPUs on one node, 1 on the other (25 % < 50 %)
    ca = ClusterAutoscaler(OPTS, 10)
    for t in range(10):
        ca.tick(cluster, t)
    assert len(cluster.nodes) == 2
    ca.tick(cluster, 10)
    assert len(cluster.nodes) == 1 and cluster.disrupted == 1 and cluster.pending == [1]
    cluster.advance(11)
    assert not cluster.pending  # rescheduled on the remaining node's free GPU


def test_cluster_autoscaler_keeps_a_node_whose_pods_fit_nowhere_else() -> None:
    pods = [Pod(name="a", arrival=0, duration=None, gpus=4), Pod(name="b", arrival=0, duration=None, gpus=1)]
    cluster = _busy_cluster(pods, 2)
    ca = ClusterAutoscaler(OPTS, 10)
    for t in range(30):
        ca.tick(cluster, t)
    assert len(cluster.nodes) == 2 and cluster.disrupted == 0


def test_cluster_autoscaler_waits_ten_minutes_after_a_scale_up() -> None:
    pods = [Pod(name="a", arrival=0, duration=None, gpus=4), Pod(name="b", arrival=0, duration=5, milli=100)]
    cluster = _busy_cluster(pods, 1)
    ca = ClusterAutoscaler(OPTS, 10)
    ca.tick(cluster, 0)  # b pends: scale up
    assert ca.last_add == 0
    for t in range(1, 30):
        cluster.advance(t)
        ca.tick(cluster, t)
        if t < 10 + 10:
            assert len(cluster.nodes) == 2  # delay after add, then 10 unneeded minutes
    assert len(cluster.nodes) == 1 and cluster.disrupted == 0  # the empty node goes, nothing evicted
    assert cluster.used_milli == 4 * MILLI_PER_GPU
