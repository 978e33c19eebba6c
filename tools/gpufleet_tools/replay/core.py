"""gpufleet in the replay: the scaler's reconcile tick, minute by minute, on the simulated group.

Nothing here decides. Each minute builds the `GroupObservation` the real scaler would read (desired =
nodes in the group, gpu_utilization = the group's average over the policy's lookback, per-instance
busiest-GPU utilization and memory only when the core asks for them, as `Scaler.reconcile` does), calls
`scaling.core.decide_reconcile` with the policy's own `GroupSettings`, and applies the `Decision` the
way the executor does: desired raised by launching nodes, the named victims terminated, and the cooldown
mark committed like `StateStore.commit` (raises capacity -> last_scale_out_at, else last_scale_in_at).

Signals: reconcile ticks only. The policy's alarms are CloudWatch alarms that step through the same
`_Ctx.step` with the same cooldowns; an alarm at the band's edge adds nothing a one-minute tick on the
same metric does not, so the replay relies on the target band (docs/replay.md says so).

Demand: the group's pending pods reach the core as the EKS reader hands them over (`Demand` on the
observation: each pod's GPUs, how long the oldest has waited, 8 GPUs per node), so the waiting work
drives scale-out, blocks scale-in and a node with a pod on it is never a victim - the same decision path
as the scaler's. The `utilization-only` experiment replays the rules alone, as for a group without a
demand source (what gpufleet did before it could see waiting work).

`Experiment` switches are what the replay evaluated beyond today's scaler, clearly labelled; the report
names them in the run's name. None of them changes a rule of the core: drain by attrition only cordons
nodes in the simulated scheduler, booting counted (booting nodes added to the capacity) only changes the
utilization fed in, and the proportional step only chooses the step size the core then bounds and cools
down.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from datetime import datetime, timedelta
from statistics import fmean

from gpufleet.domain.models import (
    Action,
    Decision,
    Demand,
    Frozen,
    GroupKind,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    SkipReason,
    WaitingWork,
)
from gpufleet.domain.policy import FleetPolicy, GroupSettings, Step
from gpufleet.scaling.core import decide_reconcile
from gpufleet_tools.replay.model import MILLI_PER_GPU, ReplayOptions, RunName
from gpufleet_tools.replay.simulate import Cluster, Node, default_termination

GROUP = GroupRef(kind=GroupKind.ASG, name="replay")
RECENTLY_BUSY = 50.0  # percent reported for a node whose last pod left within the lookback window
HELD_MEMORY = 50.0  # a GPU with a pod on it holds memory: at least this percent is reported as used


class Experiment(Frozen):
    """Variants the replay evaluated; none is what the scaler does today."""

    drain_by_attrition: bool = False  # cordon the least-loaded node when scale-in finds none idle
    proportional_step: bool = False  # scale-out step sized to bring utilization back under the band's high
    booting_counted: bool = False  # utilization over ready + booting nodes (capacity already on its way)
    utilization_only: bool = False  # no demand source: the pending pods are not shown to the core

    @property
    def label(self) -> str:
        names = ("utilization_only", "drain_by_attrition", "proportional_step", "booting_counted")
        return "+".join(name.replace("_", "-") for name in names if getattr(self, name))


def group_settings(policy: FleetPolicy) -> GroupSettings:
    """The settings the scaler would use for a tagged ASG named 'replay', dry-run off (the replay asks
    what would happen if it acted)."""
    tags = {policy.discovery.tag_key: policy.discovery.tag_value}
    settings = policy.settings_for(GROUP, tags)
    if settings is None:
        raise ValueError("the policy manages no group named 'replay' nor tagged groups: nothing to replay")
    return settings.model_copy(update={"dry_run": False})


def instance_observation(node: Node, t: int, lookback: int, demand: bool = True) -> InstanceObservation:
    """What the metrics reader would return for a node: busiest GPU's allocated share (the documented
    assumption: utilization = allocated share) and memory held by its pods; Pending while booting. With a
    demand source, a node with a pod on it is known to run GPU work (the EKS reader's bound pods)."""
    if node.ready_at > t:
        return InstanceObservation(instance_id=node.node_id, lifecycle_state="Pending")
    runs = demand and bool(node.pods)
    if node.pods:
        share = node.busiest_share()
        util, mem = share, max(share, HELD_MEMORY)
    elif t - node.emptied_at < lookback:
        util = mem = RECENTLY_BUSY
    else:
        util = mem = 0.0
    return InstanceObservation(
        instance_id=node.node_id, gpu_utilization=util, gpu_memory_percent=mem, runs_gpu_work=runs
    )


class GpufleetController:
    """The real decision core driving the simulated group once a minute."""

    def __init__(
        self, policy: FleetPolicy, options: ReplayOptions, max_nodes: int, experiment: Experiment | None = None
    ) -> None:
        self.experiment = experiment or Experiment()
        self.name = str(RunName.GPUFLEET) + (f" [{self.experiment.label}]" if self.experiment.label else "")
        self.settings = group_settings(policy)
        self.options = options
        self.max_nodes = max_nodes
        self.lookback = max(1, policy.metric_lookback_s // 60)
        self.samples: deque[tuple[int, float]] = deque()
        self.state = GroupState()
        self.decisions: dict[Action, int] = dict.fromkeys(Action, 0)
        self._listed: tuple[tuple[str, ...], int, tuple[bool, ...], tuple[InstanceObservation, ...]] = ((), 0, (), ())

    def now(self, t: int) -> datetime:
        return self.options.start + timedelta(minutes=t)

    def signal(self, cluster: Cluster) -> float | None:
        """The group's utilization as the scaler reads it, or (experiment) with booting nodes added to the
        capacity."""
        if not self.experiment.booting_counted:
            return cluster.utilization()
        work = cluster.used_milli
        capacity = cluster.ready_milli + len(cluster.booting) * self.options.node_milli
        if not cluster.ready and not work:
            return None
        return work / max(capacity, self.options.node_milli) * 100.0

    def average(self, cluster: Cluster, t: int) -> float | None:
        """Mean of the per-minute group averages over the lookback window (GpuMetricsReader's answer)."""
        value = self.signal(cluster)
        if value is not None:
            self.samples.append((t, value))
        while self.samples and self.samples[0][0] <= t - self.lookback:
            self.samples.popleft()
        return fmean(v for _, v in self.samples) if self.samples else None

    def settings_for_tick(self, cluster: Cluster, util: float | None, desired: int) -> GroupSettings:
        """The policy's settings, or (experiment) a scale-out step that brings the ready nodes' utilization
        back to the band's high in one change."""
        band = self.settings.target
        if not self.experiment.proportional_step or util is None or util <= band.high:
            return self.settings
        counted = len(cluster.ready) + (len(cluster.booting) if self.experiment.booting_counted else 0)
        wanted = math.ceil(max(counted, 1) * util / band.high) - desired
        if wanted <= self.settings.scale_out_step.size(desired):
            return self.settings
        return self.settings.model_copy(update={"scale_out_step": Step(value=wanted)})

    def listed(self, cluster: Cluster, t: int) -> tuple[InstanceObservation, ...]:
        """The group's instances as DescribeAutoScalingGroups lists them (Pending while booting, else
        InService; no metrics yet) and, with a demand source, which run a pod (the EKS reader's bound
        pods); rebuilt only when the nodes, their readiness or which of them run pods change."""
        demand = not self.experiment.utilization_only
        ids, booting = tuple(cluster.nodes), len(cluster.booting)
        running = tuple(demand and bool(n.pods) for n in cluster.nodes.values())
        if (ids, booting, running) != self._listed[:3]:
            listed = tuple(
                InstanceObservation.model_construct(
                    instance_id=n.node_id,
                    lifecycle_state="Pending" if n.ready_at > t else "InService",
                    runs_gpu_work=runs,
                )
                for n, runs in zip(cluster.nodes.values(), running, strict=True)
            )
            self._listed = (ids, booting, running, listed)
        return self._listed[3]

    def demand(self, cluster: Cluster) -> Demand | None:
        """The pending pods as the EKS reader hands them to the core: GPUs per pod (a share of one GPU as
        its fraction), how many alike, how long the oldest has waited; serving nodes without a pod as room
        (as the reader counts InService nodes without a GPU pod)."""
        if self.experiment.utilization_only:
            return None
        oldest: dict[float, int] = {}
        counts: Counter[float] = Counter()
        pods = cluster.pods
        for i in cluster.pending:
            gpus = pods[i].demand_milli / MILLI_PER_GPU
            counts[gpus] += 1
            arrival = pods[i].arrival
            if arrival < oldest.get(gpus, arrival + 1):
                oldest[gpus] = arrival
        start, per_node = self.options.start, float(self.options.gpus_per_node)
        waiting = tuple(
            WaitingWork.model_construct(name="pending", gpus=g, since=start + timedelta(minutes=oldest[g]), count=n)
            for g, n in counts.items()
        )
        return Demand.model_construct(
            source="replay",
            noun="pod",
            waiting=waiting,
            gpus_per_node=float(self.options.gpus_per_node),
            free_gpus=tuple(per_node for n in cluster.ready if not n.pods and not n.cordoned),
            knows_nodes=True,
            unreadable=None,
        )

    def tick(self, cluster: Cluster, t: int) -> None:
        util = self.average(cluster, t)
        now = self.now(t)
        obs = GroupObservation(
            ref=GROUP,
            min_size=self.options.min_nodes,
            max_size=self.max_nodes,
            desired=len(cluster.nodes),
            gpu_utilization=util,
            instances=self.listed(cluster, t),
            demand=self.demand(cluster),
        )
        settings = self.settings_for_tick(cluster, util, obs.desired)
        decision = self.decide(obs, settings, now)
        if decision.needs_instance_metrics:
            demand = not self.experiment.utilization_only
            instances = tuple(instance_observation(n, t, self.lookback, demand) for n in cluster.nodes.values())
            obs = obs.model_copy(update={"instances": instances, "instance_metrics_loaded": True})
            decision = self.decide(obs, settings, now)
        self.decisions[decision.action] += 1
        self.apply(decision, cluster, t)
        if self.experiment.drain_by_attrition:
            self.drain(decision, cluster, util)

    def decide(self, obs: GroupObservation, settings: GroupSettings, now: datetime) -> Decision:
        return decide_reconcile(obs, settings, self.state, now, event_id=f"replay-{now:%Y%m%d%H%M}")

    def apply(self, decision: Decision, cluster: Cluster, t: int) -> None:
        """What Executor.execute + FleetActuator.apply + StateStore.commit do with a decided change."""
        if not decision.changes_capacity:
            return
        if decision.victims:
            cluster.terminate(decision.victims, t)
        elif decision.desired > decision.current:
            cluster.launch(decision.desired - decision.current, t)
        else:  # lowered without named victims (above max): the ASG's termination policy picks
            cluster.terminate(default_termination(cluster, decision.current - decision.desired, t), t)
        cluster.actions += 1
        stamp: dict[str, object] = {
            "last_scale_out_at" if decision.raises_capacity else "last_scale_in_at": decision.at
        }
        if decision.raises_capacity:
            stamp["last_scale_out_added"] = decision.desired - decision.current
        self.state = self.state.model_copy(update={**stamp, "version": self.state.version + 1})

    def drain(self, decision: Decision, cluster: Cluster, util: float | None) -> None:
        """Experiment: when the core wanted to scale in but found no idle node, stop placing pods on the
        least-loaded nodes (as many as its scale-in step, no more than the nodes beyond what the band's
        high needs) so they empty by attrition and the core removes them as idle; hand them back to the
        scheduler as soon as utilization is no longer below the band's low."""
        draining = [n for n in cluster.ready if n.cordoned]
        band = self.settings.target
        if decision.action is Action.SCALE_OUT or util is None or util >= band.low:
            for node in draining:
                cluster.cordon(node, False)
            return
        busy = decision.skipped.get(SkipReason.BUSY, 0) + decision.skipped.get(SkipReason.RUNS_GPU_WORK, 0)
        if not (decision.action is Action.HOLD and busy > 0):
            return
        needed = math.ceil(cluster.used_milli / (self.options.node_milli * band.high / 100))
        surplus = len(cluster.ready) - max(needed, self.options.min_nodes)
        want = min(self.settings.scale_in_step.size(decision.current), surplus) - len(draining)
        open_nodes = sorted((n for n in cluster.ready if not n.cordoned), key=lambda n: (n.used, -n.launched_at))
        for node in open_nodes[: max(want, 0)]:
            cluster.cordon(node)
