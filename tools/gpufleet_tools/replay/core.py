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
observation: each pod's GPUs, how long the oldest has waited, 8 GPUs per node; a gang's pods as one
`WaitingWork` carrying `gang=<job id>`, as kubernetes/queued.py hands a Volcano PodGroup or a Kueue Workload
over), so the waiting work
drives scale-out, blocks scale-in and a node with a pod on it is never a victim - the same decision path
as the scaler's. The `utilization-only` experiment replays the rules alone, as for a group without a
demand source (what gpufleet did before it could see waiting work).

Partial launches (`ReplayOptions.shortage`, shortage.py): the observation shows them as AWS does:
desired counts the instances asked for and not launched yet, `instances` lists only those launched.

Consolidation by attrition runs as the scaler runs it: each node says what its pods hold (GPUs) and
whether it is cordoned, the core's `MarkPlan` (scaling/consolidate.py) closes and reopens nodes, and the
simulated scheduler places no pod on a cordoned node. Every node the replay cordons is gpufleet's.

`Experiment` switches are what the replay evaluated beyond today's scaler, clearly labelled; the report
names them in the run's name. None of them changes a rule of the core: consolidation off replays the
policy without it (what gpufleet did before), booting counted (booting nodes added to the capacity) only
changes the utilization fed in, and the proportional step only chooses the step size the core then bounds
and cools down.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from datetime import datetime, timedelta
from statistics import fmean

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import (
    Action,
    Decision,
    Demand,
    Frozen,
    GroupObservation,
    GroupRef,
    GroupState,
    InstanceObservation,
    MarkChannel,
    NodeMark,
    TriggerKind,
    WaitingWork,
)
from gpufleet.policy.fleet import Consolidation, FleetPolicy, GroupSettings, Step
from gpufleet.scaling.core import decide_reconcile
from gpufleet_tools.replay import shortage
from gpufleet_tools.replay.model import MILLI_PER_GPU, ReplayOptions, RunName
from gpufleet_tools.replay.nodes import Node
from gpufleet_tools.replay.simulate import Cluster, default_termination

GROUP = GroupRef(kind=GroupKind.ASG, name="replay")
RECENTLY_BUSY = 50.0  # percent reported for a node whose last pod left within the lookback window
HELD_MEMORY = 50.0  # a GPU with a pod on it holds memory: at least this percent is reported as used


class Experiment(Frozen):
    """Variants the replay evaluated; none is what the scaler does today."""

    consolidation_off: bool = False  # the policy with `consolidate: off` (before consolidation by attrition)
    proportional_step: bool = False  # scale-out step sized to bring utilization back under the band's high
    booting_counted: bool = False  # utilization over ready + booting nodes (capacity already on its way)
    utilization_only: bool = False  # no demand source: the pending pods are not shown to the core

    @property
    def label(self) -> str:
        names = ("utilization_only", "consolidation_off", "proportional_step", "booting_counted")
        return "+".join(name.replace("_", "-") for name in names if getattr(self, name))


def group_settings(policy: FleetPolicy) -> GroupSettings:
    """The settings the scaler would use for a tagged ASG named 'replay', dry-run off (the replay asks
    what would happen if it acted)."""
    tags = {policy.discovery.tag_key: policy.discovery.tag_value}
    settings = policy.settings_for(GROUP, tags)
    if settings is None:
        raise ValueError("the policy manages no group named 'replay' nor tagged groups: nothing to replay")
    return settings.model_copy(update={"dry_run": False})


def instance_observation(
    node: Node, t: int, lookback: int, listed: InstanceObservation | None = None
) -> InstanceObservation:
    """What the metrics reader adds to a node as listed (`listed`: the EKS reader's view, `listed()`;
    None: the node alone): the busiest GPU's allocated share (the documented assumption: utilization =
    allocated share) and memory held by its pods; nothing while it boots."""
    base = listed or InstanceObservation(
        instance_id=node.node_id, lifecycle_state="Pending" if node.ready_at > t else "InService"
    )
    if node.ready_at > t:
        return base
    if node.pods:
        share = node.busiest_share()
        util, mem = share, max(share, HELD_MEMORY)
    elif t - node.emptied_at < lookback:
        util = mem = RECENTLY_BUSY
    else:
        util = mem = 0.0
    return base.model_copy(update={"gpu_utilization": util, "gpu_memory_percent": mem})


class GpufleetController:
    """The real decision core driving the simulated group once a minute."""

    def __init__(
        self, policy: FleetPolicy, options: ReplayOptions, max_nodes: int, experiment: Experiment | None = None
    ) -> None:
        self.experiment = experiment or Experiment()
        self.name = str(RunName.GPUFLEET) + (f" [{self.experiment.label}]" if self.experiment.label else "")
        # The replayed group is an EKS group with a Kubernetes source, so it consolidates by attrition (what
        # docs/consolidation.md recommends there) unless the experiment replays it without (or without a source).
        off = self.experiment.consolidation_off or self.experiment.utilization_only  # no source: no marks
        way = Consolidation.OFF if off else Consolidation.ATTRITION
        self.settings = group_settings(policy).model_copy(update={"consolidate": way})
        self.options = options
        self.max_nodes = max_nodes
        self.lookback = max(1, policy.metric_lookback_s // 60)
        self.samples: deque[tuple[int, float]] = deque()
        self.state = GroupState()
        self.decisions: dict[Action, int] = dict.fromkeys(Action, 0)
        self._per_node: dict[str, tuple[tuple[bool, int, bool, int], InstanceObservation]] = {}

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
        InService; no metrics yet) and, with a demand source, what the EKS reader says of each node: the
        GPUs its pods hold, since when its oldest pod runs, whether it is cordoned. A node's entry is made
        again only when its readiness, GPUs held, cordon or pod count change (a 31-day replay asks this
        44,640 times)."""
        demand = not self.experiment.utilization_only
        start, cache, out = self.options.start, self._per_node, []
        for n in cluster.nodes.values():
            key = (n.ready_at > t, n.used if demand else 0, n.cordoned, len(n.pods))
            hit = cache.get(n.node_id)
            if hit is None or hit[0] != key:
                since = min((cluster.started_at[i] for i in n.pods), default=None) if demand else None
                inst = InstanceObservation.model_construct(
                    instance_id=n.node_id,
                    node_name=n.node_id,
                    lifecycle_state="Pending" if key[0] else "InService",
                    runs_work=demand and n.used > 0,
                    gpus_held=n.used / MILLI_PER_GPU if demand else None,
                    mark=NodeMark.GPUFLEET if n.cordoned else NodeMark.NONE,
                    work_since=None if since is None else start + timedelta(minutes=since),
                )
                hit = cache[n.node_id] = (key, inst)
            out.append(hit[1])
        if len(cache) > 2 * len(cluster.nodes) + 64:  # forget removed nodes now and then
            self._per_node = {k: v for k, v in cache.items() if k in cluster.nodes}
        return tuple(out)

    def demand(self, cluster: Cluster) -> Demand | None:
        """The pending pods as the EKS reader hands them to the core: GPUs per pod (a share of one GPU as
        its fraction), how many alike, how long the oldest has waited; serving nodes without a pod as room
        (as the reader counts InService nodes without a GPU pod)."""
        if self.experiment.utilization_only:
            return None
        oldest: dict[tuple[float, str], int] = {}
        counts: Counter[tuple[float, str]] = Counter()
        pods = cluster.pods
        for i in cluster.pending:
            key = (pods[i].demand_milli / MILLI_PER_GPU, pods[i].gang)
            counts[key] += 1
            arrival = pods[i].arrival
            if arrival < oldest.get(key, arrival + 1):
                oldest[key] = arrival
        start, per_node = self.options.start, float(self.options.gpus_per_node)
        waiting = tuple(
            WaitingWork.model_construct(
                name=gang or "pending",
                gpus=g,
                since=start + timedelta(minutes=oldest[g, gang]),
                count=n,
                whole_node=False,
                gang=gang,
            )
            for (g, gang), n in counts.items()
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
            desired=cluster.desired,
            gpu_utilization=util,
            instances=self.listed(cluster, t),
            demand=self.demand(cluster),
            marks=None if self.experiment.utilization_only else MarkChannel.KUBERNETES,
        )
        settings = self.settings_for_tick(cluster, util, obs.desired)
        decision = self.decide(obs, settings, now)
        if decision.needs_instance_metrics:
            nodes = cluster.nodes.values()
            instances = tuple(
                instance_observation(n, t, self.lookback, i) for n, i in zip(nodes, obs.instances, strict=True)
            )
            obs = obs.model_copy(update={"instances": instances, "instance_metrics_loaded": True})
            decision = self.decide(obs, settings, now)
        self.decisions[decision.action] += 1
        self.apply(decision, cluster, t)

    def decide(self, obs: GroupObservation, settings: GroupSettings, now: datetime) -> Decision:
        return decide_reconcile(obs, settings, self.state, now, event_id=f"replay-{now:%Y%m%d%H%M}")

    def apply(self, decision: Decision, cluster: Cluster, t: int) -> None:
        """What Executor.execute + FleetActuator.apply + StateStore.commit do with a decided change: nodes
        reopened first, the capacity change (desired lowered below the victims cancels launches still owed,
        as a gang's partial launch given back does), then nodes closed (node marks alone start no cooldown)."""
        for node_id in decision.undrain:
            cluster.cordon(cluster.nodes[node_id], False)
        for node_id in decision.drain:
            cluster.cordon(cluster.nodes[node_id])
        if not decision.changes_capacity:
            return
        lower = decision.current - decision.desired - len(decision.victims)
        if decision.victims:
            cluster.terminate(decision.victims, t)
        elif decision.desired > decision.current:
            shortage.raise_desired(cluster, decision.desired - decision.current, t)
        if lower > 0:  # desired lowered past the victims: launches still owed go first, then the ASG picks
            rest = lower - shortage.cancel(cluster, lower)
            cluster.terminate(default_termination(cluster, rest, t), t)
        cluster.actions += 1
        stamp: dict[str, object] = {
            "last_scale_out_at" if decision.raises_capacity else "last_scale_in_at": decision.at
        }
        if decision.trigger.kind is TriggerKind.GANG_PARTIAL:  # gangs rest from now (StateStore.commit)
            stamp["gang_gave_back_at"] = decision.at
        if decision.raises_capacity:
            stamp["last_scale_out_added"] = decision.desired - decision.current
        self.state = self.state.model_copy(update={**stamp, "version": self.state.version + 1})
