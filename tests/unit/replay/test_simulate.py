"""The simulated group's invariants: capacity never negative or over-booked, every pod accounted for,
disrupted pods re-queued and their lost GPU-hours counted, placement as kube-scheduler scores it."""

from __future__ import annotations

import random

from gpufleet_tools.replay.model import MILLI_PER_GPU, Placement, Pod, ReplayOptions
from gpufleet_tools.replay.simulate import Cluster, default_termination, run

OPTS = ReplayOptions(gpus_per_node=4, boot_minutes=3)


def _pods(rng: random.Random, n: int, horizon: int) -> list[Pod]:
    pods = []
    for i in range(n):
        share = rng.random() < 0.2
        pods.append(
            Pod(
                name=f"p{i}",
                arrival=rng.randrange(horizon),
                duration=rng.choice([None, rng.randint(1, 90)]),
                gpus=1 if share else rng.choice([1, 1, 2, 4]),
                milli=rng.choice([250, 500]) if share else MILLI_PER_GPU,
            )
        )
    return sorted(pods, key=lambda p: p.arrival)


class ChaosMonkey:
    """Launches and terminates nodes at random (busy or not) and checks the invariants every minute."""

    name = "chaos"

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.completed: set[int] = set()

    def tick(self, cluster: Cluster, t: int) -> None:
        check_invariants(cluster, t)
        if self.rng.random() < 0.1:
            cluster.launch(self.rng.randint(1, 3), t)
        if cluster.nodes and self.rng.random() < 0.08:
            cluster.terminate([self.rng.choice(list(cluster.nodes))], t)


def check_invariants(cluster: Cluster, t: int) -> None:
    running = {i for n in cluster.nodes.values() for i in n.pods}
    pending = set(cluster.pending)
    assert not running & pending
    assert len(cluster.pending) == len(pending)  # no pod queued twice
    arrived = {i for i, p in enumerate(cluster.pods) if p.arrival <= t}
    assert running | pending <= arrived
    for i in arrived - running - pending:  # the rest finished: ran their full duration since their last start
        assert cluster.pods[i].duration is not None
    for node in cluster.nodes.values():
        assert all(0 <= free <= MILLI_PER_GPU for free in node.free)  # never negative, never over-freed
        assert node.free_whole == sum(1 for free in node.free if free == MILLI_PER_GPU)
        assert node.used == sum(cluster.pods[i].demand_milli for i in node.pods)
        assert node.used == len(node.free) * MILLI_PER_GPU - sum(node.free)
        assert not node.pods or node.ready_at <= t  # nothing runs on a booting node
    assert cluster.used_milli == sum(n.used for n in cluster.nodes.values())
    assert cluster.pending_milli == sum(cluster.pods[i].demand_milli for i in cluster.pending)


def test_invariants_hold_under_random_launches_and_terminations() -> None:
    for seed in range(5):
        rng = random.Random(seed)
        pods = _pods(rng, 150, 600)
        monkey = ChaosMonkey(rng)
        outcome = run(pods, 600, monkey, OPTS, initial_nodes=2)
        assert outcome.result.pods_disrupted > 0
        assert outcome.result.lost_gpu_hours > 0
        assert min(outcome.timeline.nodes) >= 0
        assert outcome.result.node_hours == round(sum(outcome.timeline.nodes) / 60, 2)


def test_a_removed_node_disrupts_its_pods_which_are_requeued_and_restart() -> None:
    pods = [Pod(name="a", arrival=0, duration=100, gpus=2), Pod(name="b", arrival=0, duration=100, gpus=1)]
    cluster = Cluster(pods, OPTS)
    (node,) = cluster.launch(1, 0, booted=True)
    cluster.advance(0)
    assert set(node.pods) == {0, 1}
    cluster.advance(30)
    assert cluster.terminate([node.node_id], 30) == 2
    assert cluster.pending == [0, 1] and cluster.pending_milli == 3000
    assert cluster.disrupted == 2
    assert cluster.lost_milli_minutes == 30 * 3000  # 30 minutes of 3 GPUs
    (other,) = cluster.launch(1, 30)
    cluster.advance(32)
    assert cluster.pending == [0, 1]  # still booting
    cluster.advance(33)
    assert set(other.pods) == {0, 1} and cluster.started_at == [33, 33]
    cluster.advance(130)  # the old end (100) no longer applies: they run 100 minutes from the restart
    assert set(other.pods) == {0, 1}
    cluster.advance(133)
    assert not other.pods


def test_spread_picks_the_least_allocated_node_and_pack_the_most() -> None:
    pods = [Pod(name=f"p{i}", arrival=0, duration=None) for i in range(4)]
    for placement, expected in ((Placement.SPREAD, [1, 1, 1, 1]), (Placement.PACK, [4, 0, 0, 0])):
        cluster = Cluster(pods, OPTS.model_copy(update={"placement": placement}))
        nodes = cluster.launch(4, 0, booted=True)
        cluster.advance(0)
        assert [len(n.pods) for n in nodes] == expected


def test_a_pod_that_does_not_fit_does_not_block_the_ones_behind_it() -> None:
    pods = [Pod(name="big", arrival=0, duration=None, gpus=4), Pod(name="small", arrival=0, duration=None, gpus=1)]
    cluster = Cluster(pods, OPTS)
    (node,) = cluster.launch(1, 0, booted=True)
    node.free[0] = 0  # something else holds one GPU
    node.free_whole = 3
    node.used = MILLI_PER_GPU
    cluster.advance(0)
    assert cluster.pending == [0] and list(node.pods) == [1]


def test_shares_of_one_gpu_are_packed_best_fit() -> None:
    pods = [Pod(name=f"s{i}", arrival=0, duration=None, milli=m) for i, m in enumerate((500, 250, 500, 250))]
    cluster = Cluster(pods, OPTS)
    (node,) = cluster.launch(1, 0, booted=True)
    cluster.advance(0)
    assert sorted(node.free) == [0, 500, MILLI_PER_GPU, MILLI_PER_GPU]
    assert node.free_whole == 2 and node.busiest_share() == 100.0


def test_cordoned_nodes_take_no_new_pods_and_keep_what_runs() -> None:
    pods = [Pod(name="a", arrival=0, duration=None), Pod(name="b", arrival=5, duration=None)]
    cluster = Cluster(pods, OPTS)
    (node,) = cluster.launch(1, 0, booted=True)
    cluster.advance(0)
    cluster.cordon(node)
    cluster.advance(5)
    assert list(node.pods) == [0] and cluster.pending == [1]
    cluster.cordon(node, False)
    cluster.advance(6)
    assert sorted(node.pods) == [0, 1]


def test_the_default_termination_policy_balances_zones_and_ignores_pods() -> None:
    pods = [Pod(name=f"p{i}", arrival=0, duration=None) for i in range(3)]
    cluster = Cluster(pods, OPTS.model_copy(update={"placement": Placement.PACK}))
    nodes = cluster.launch(4, 0, booted=True)  # zones 0, 1, 2, 0
    cluster.advance(0)
    assert [n.zone for n in nodes] == [0, 1, 2, 0]
    chosen = default_termination(cluster, 2, 30, random.Random(1))
    zones = [cluster.nodes[c].zone for c in chosen]
    assert zones[0] == 0  # the zone with the most instances first
    assert len(set(chosen)) == 2
    busy = [n.node_id for n in nodes if n.pods]
    assert any(default_termination(cluster, 1, 30, random.Random(s))[0] in busy for s in range(20))  # blind
