"""gpufleet in the replay: the real core decides, the replay applies like the executor, and the labelled
experiments only cordon, change the signal fed in, or choose the step size."""

from __future__ import annotations

from gpufleet.domain.models import Action
from gpufleet.policy.fleet import parse_policy
from gpufleet_tools.replay.core import Experiment, GpufleetController, instance_observation
from gpufleet_tools.replay.model import MILLI_PER_GPU, Pod, ReplayOptions
from gpufleet_tools.replay.simulate import Cluster, run

OPTS = ReplayOptions(gpus_per_node=4, boot_minutes=3)
POLICY = parse_policy(
    """
metric_lookback_s: 300
defaults:
  target: {low: 40, high: 80}
  scale_out_step: 1
  scale_out_cooldown_s: 300
  scale_in_step: 1
  scale_in_cooldown_s: 600
"""
)


def _cluster(pods: list[Pod], nodes: int) -> Cluster:
    cluster = Cluster(pods, OPTS)
    cluster.launch(nodes, -10, booted=True)
    cluster.advance(0)
    return cluster


def test_scale_out_follows_the_band_and_the_cooldown_marks_like_the_executor() -> None:
    pods = [Pod(name=f"p{i}", arrival=0, duration=None) for i in range(8)]
    cluster = _cluster(pods, 2)  # 100 %, nothing pending: only a group without a demand source scales out
    g = GpufleetController(POLICY, OPTS, 10, Experiment(utilization_only=True))
    g.tick(cluster, 0)
    assert len(cluster.nodes) == 3 and len(cluster.booting) == 1
    assert g.state.last_scale_out_at == OPTS.start and g.state.version == 1 and cluster.actions == 1
    for t in range(1, 5):
        g.tick(cluster, t)
    assert len(cluster.nodes) == 3  # scale-out cooldown (300 s)
    g.tick(cluster, 5)
    assert len(cluster.nodes) == 4


def test_scale_in_removes_only_nodes_idle_for_the_lookback_and_never_disrupts() -> None:
    pods = [Pod(name="a", arrival=0, duration=None), Pod(name="b", arrival=0, duration=20)]
    cases = (
        (Experiment(utilization_only=True), [(0, 1), (10, 1)]),
        (Experiment(consolidation_off=True), [(0, 2)]),
        (Experiment(), [(1, 2)]),  # attrition: closed first, removed the next minute
    )
    for experiment, expected in cases:
        cluster = _cluster(pods, 4)  # spread: a and b on two nodes; 2 of 16 GPUs = 12.5 %
        g = GpufleetController(POLICY, OPTS, 10, experiment)
        removed: list[tuple[int, int]] = []
        for t in range(0, 60):
            cluster.advance(t)
            before = len(cluster.nodes)
            g.tick(cluster, t)
            if len(cluster.nodes) < before:
                removed.append((t, before - len(cluster.nodes)))
        # Utilization only: one idle node per scale-in cooldown (600 s). With the pods known, nothing
        # waiting: both idle nodes at once (with attrition a minute later: closed first); b's node once b is
        # done and the lookback has passed.
        assert removed[:2] == [*expected, (25, 1)][:2], experiment
        assert cluster.disrupted == 0
        assert len(cluster.nodes) == 1 and cluster.node_of[0] is not None  # a's node stays


def test_a_node_whose_last_pod_just_left_is_still_busy_for_the_lookback() -> None:
    pods = [Pod(name="a", arrival=0, duration=3)]
    cluster = _cluster(pods, 1)
    (node,) = cluster.nodes.values()
    cluster.advance(3)
    assert not node.pods
    assert instance_observation(node, 5, 5).gpu_utilization == 50.0
    assert instance_observation(node, 8, 5).gpu_utilization == 0.0
    booting = cluster.launch(1, 8)[0]
    assert instance_observation(booting, 9, 5).lifecycle_state == "Pending"


def test_gpufleet_never_disrupts_a_pod_on_a_random_workload() -> None:
    pods = [Pod(name=f"p{i}", arrival=(i * 7) % 400, duration=5 + (i * 13) % 90, gpus=1 + i % 3) for i in range(200)]
    pods.sort(key=lambda p: p.arrival)
    for experiment in (
        Experiment(consolidation_off=True),
        Experiment(proportional_step=True, booting_counted=True),
        Experiment(),  # the replay's group consolidates by attrition unless told not to
    ):
        out = run(pods, 500, GpufleetController(POLICY, OPTS, 30, experiment), OPTS, initial_nodes=1)
        assert out.result.pods_disrupted == 0 and out.result.lost_gpu_hours == 0
    assert out.result.nodes_drained > 0  # consolidation ran: nodes were cordoned, and none was disrupted


def test_pending_pods_reach_the_core_as_demand_and_one_step_covers_them() -> None:
    """12 one-GPU pods on 2 four-GPU nodes: utilization reads 100 % whatever waits; the demand says 4 wait,
    so one scale-out adds exactly the node they need, and a tick later nothing more (it is booting)."""
    pods = [Pod(name=f"p{i}", arrival=0, duration=None) for i in range(12)]
    plain = GpufleetController(POLICY, OPTS, 10, Experiment(utilization_only=True))
    g = GpufleetController(POLICY, OPTS, 10)
    cluster = _cluster(pods, 2)
    assert plain.signal(cluster) == 100.0  # utilization cannot say how much is missing
    assert plain.demand(cluster) is None and plain.name == "gpufleet [utilization-only]"
    demand = g.demand(cluster)
    assert demand is not None and [(w.gpus, w.count) for w in demand.waiting] == [(1.0, 4)]
    g.tick(cluster, 0)
    assert len(cluster.nodes) == 3
    g.tick(cluster, 1)
    assert len(cluster.nodes) == 3 and g.decisions[Action.HOLD] == 1


def test_proportional_step_sizes_the_step_to_the_gap() -> None:
    g = GpufleetController(POLICY, OPTS, 100, Experiment(proportional_step=True, utilization_only=True))
    pods = [Pod(name=f"p{i}", arrival=0, duration=None) for i in range(40)]
    cluster = _cluster(pods, 2)  # 8 GPUs for 40: utilization 100 %, the band's high 80 %
    g.tick(cluster, 0)
    assert len(cluster.nodes) == 2 + 1  # ceil(2 x 100 / 80) - 2: utilization alone sees one node's worth


def test_consolidation_by_attrition_cordons_the_least_loaded_node_until_it_empties() -> None:
    pods = [Pod(name="long", arrival=0, duration=None), Pod(name="short", arrival=0, duration=30, milli=500)]
    pods += [Pod(name="late", arrival=5, duration=None)]
    cluster = _cluster(pods, 2)  # spread: one pod per node, 19 %: the core wants to scale in, none is idle
    g = GpufleetController(POLICY, OPTS, 10)
    g.tick(cluster, 0)
    cordoned = [n for n in cluster.nodes.values() if n.cordoned]
    assert len(cordoned) == 1 and list(cordoned[0].pods) == [1]  # the least loaded: the half-GPU pod
    cluster.advance(5)
    assert cluster.node_of[2] is not cordoned[0]  # new work avoids the draining node
    for t in range(6, 60):
        cluster.advance(t)
        g.tick(cluster, t)
    assert len(cluster.nodes) == 1 and cluster.disrupted == 0
    assert cluster.used_milli == 2 * MILLI_PER_GPU
