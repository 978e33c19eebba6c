"""Typed observations and decisions shared by the pure cores and the adapters.

Every capability speaks in these: a group is a `GroupRef`, what was read about it a `GroupObservation`,
what the controller remembers a `GroupState`, and what it decided a `Decision` with a typed `Trigger`,
an `Action`, an `Outcome` and a reason a person can read.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from gpufleet.domain.kinds import GroupKind, kind_of_prefix, traits


class Frozen(BaseModel):
    """The one base of every internal model: immutable, unknown fields rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Direction(StrEnum):
    OUT = "out"
    IN = "in"


class AlarmState(StrEnum):
    OK = "OK"
    ALARM = "ALARM"
    INSUFFICIENT_DATA = "INSUFFICIENT_DATA"


class CapacityType(StrEnum):
    """How a group buys its instances (decides, e.g., whether an on-demand fallback can help)."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"
    CAPACITY_BLOCK = "capacity-block"
    UNKNOWN = "unknown"


class GroupRef(Frozen):
    """One group: its kind and name, and for kinds named inside a cluster (an EKS managed node group, a
    HyperPod instance group) its cluster. How it is keyed and which metric dimensions are its own come
    from its kind's row in the traits table (`domain.kinds`)."""

    kind: GroupKind
    name: str
    cluster: str | None = None

    @property
    def key(self) -> str:
        row = traits(self.kind)
        return f"{row.key_prefix}:{self.cluster}/{self.name}" if row.in_cluster else f"{row.key_prefix}:{self.name}"

    @classmethod
    def parse_key(cls, key: str) -> GroupRef:
        """Inverse of `key`; also accepts a bare name as an ASG."""
        prefix, sep, rest = key.partition(":")
        kind = kind_of_prefix(prefix) if sep else GroupKind.ASG
        if not sep:
            return cls(kind=GroupKind.ASG, name=key)
        if kind is not None and not traits(kind).in_cluster and rest:
            return cls(kind=kind, name=rest)
        cluster, slash, name = rest.partition("/")
        if kind is not None and traits(kind).in_cluster and slash and cluster and name:
            return cls(kind=kind, cluster=cluster, name=name)
        raise ValueError(
            f"not a group key: {key!r} (expected 'asg:NAME', 'eks:CLUSTER/NODEGROUP' or 'hyperpod:CLUSTER/GROUP')"
        )

    def __str__(self) -> str:
        return self.key

    @property
    def metric_dimensions(self) -> dict[str, str]:
        """The dimensions of this group's own GPU metrics, as the publisher sends them."""
        row = traits(self.kind)
        if not self.name or (row.cluster_dimension is not None and not self.cluster):
            raise ValueError("a group is an ASG name, a (cluster, node group) or a (cluster, instance group) pair")
        if row.cluster_dimension is None:
            return {row.name_dimension: self.name}
        return {row.cluster_dimension: self.cluster or "", row.name_dimension: self.name}


class MetricRef(Frozen):
    """One metric an alarm reads (math-expression children included)."""

    namespace: str | None = None
    name: str | None = None
    dimensions: dict[str, str] = Field(default_factory=dict)
    # The statistic the alarm reads it with ("Average", "Maximum", "p99", "TM(10%:90%)"); None: not said.
    # Only an Average is held down by the sample bound (scaling/metric_trust.py).
    stat: str | None = None


# CloudWatch's static-threshold comparisons: does `value` breach `threshold`?
_COMPARE = {
    "GreaterThanThreshold": lambda v, t: v > t,
    "GreaterThanOrEqualToThreshold": lambda v, t: v >= t,
    "LessThanThreshold": lambda v, t: v < t,
    "LessThanOrEqualToThreshold": lambda v, t: v <= t,
}


class AlarmCondition(Frozen):
    """A metric alarm's static threshold and comparison, as DescribeAlarms says them: what the scaler
    weighs the members' own mean against when the group series an alarm read cannot be believed."""

    threshold: float
    comparison: str

    def breached(self, value: float) -> bool | None:
        """Whether `value` is on the alarm's side of its threshold; None: not a static comparison
        (anomaly detection bands)."""
        compare = _COMPARE.get(self.comparison)
        return None if compare is None else bool(compare(value, self.threshold))


# ---- what caused a decision ----


class TriggerKind(StrEnum):
    ALARM = "alarm"
    # The reconcile rule keeping average GPU utilization inside the policy's `target: {low, high}` band.
    # Not "target tracking": that is EC2 Auto Scaling's own policy type, which gpufleet is not.
    UTILIZATION_BAND = "utilization-band"
    SCHEDULE = "schedule"
    BOUNDS = "bounds"
    OOM_GUARD = "oom-guard"
    SPOT_FALLBACK = "spot-fallback"
    REQUEST = "request"
    TERMINATION_REQUEST = "termination-request"  # EC2 Auto Scaling asked the custom termination policy
    INTERRUPTION = "interruption"  # a spot interruption warning or rebalance recommendation
    DEMAND = "demand"  # work waiting for GPUs: unschedulable pods, a queue's backlog, a scheduler's metric
    # A gang's nodes that came partly: what came (idle) and what never launched, given back after a timeout.
    GANG_PARTIAL = "gang-partial"

    @classmethod
    def _missing_(cls, value: object) -> TriggerKind | None:
        """Audit records written before the rename say 'target-tracking': still readable."""
        return cls.UTILIZATION_BAND if value == "target-tracking" else None


class Trigger(Frozen):
    """What a decision answered: an alarm (by name), a schedule window, the utilization band, another
    controller's request... Rendered `kind:name` for people and the audit trail."""

    kind: TriggerKind
    name: str = ""

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, value: Any) -> Any:
        """Audit records written before triggers were typed hold 'alarm:NAME' strings."""
        if isinstance(value, str):
            kind, _, name = value.partition(":")
            return {"kind": kind, "name": name}
        return value

    @model_serializer
    def _as_text(self) -> str:
        """Serialized as 'kind:name' (logs, the audit trail, JSON results), parsed back by `_from_text`."""
        return str(self)

    def __str__(self) -> str:
        return f"{self.kind}:{self.name}" if self.name else str(self.kind)


# ---- observations (read from AWS by adapters, passed into the pure cores) ----


class NodeMark(StrEnum):
    """Whether a node is closed to new work: not at all, by gpufleet (draining by attrition), or by someone
    else (cordoned or Slurm-drained by an operator or another tool: gpufleet never reopens it)."""

    NONE = "none"
    GPUFLEET = "gpufleet"
    OTHER = "other"


class MarkChannel(StrEnum):
    """How a group's nodes are closed to new work: Kubernetes cordon (EKS node groups, self-managed
    node groups with a Kubernetes source) or Slurm drain (HyperPod, applied by the controller-side
    publisher)."""

    KUBERNETES = "kubernetes"
    SLURM = "slurm"


class InstanceObservation(Frozen):
    instance_id: str
    lifecycle_state: str = "InService"
    protected_from_scale_in: bool = False
    instance_type: str | None = None
    healthy: bool = True  # Auto Scaling's health status (a reclaimed spot instance turns Unhealthy first)
    gpu_utilization: float | None = None  # busiest GPU on the instance, percent
    gpu_memory_percent: float | None = None  # fullest GPU on the instance, percent
    runs_work: bool = False  # work is bound to it (any pod but a DaemonSet's; a Slurm job): never a victim
    gpus_held: float | None = None  # GPUs the work bound to it asks for, when the source says (consolidation)
    mark: NodeMark = NodeMark.NONE  # closed to new work, and by whom
    empties_by: datetime | None = None  # when its work is expected to end, when the source says (Slurm limits)
    node_name: str | None = None  # its Kubernetes node or Slurm node name, when the source says
    work_since: datetime | None = None  # when its longest-running work started (pods' startTime), when known
    marked_at: datetime | None = None  # when gpufleet asked for its mark (mark GPUFLEET), when the channel says

    @property
    def in_service(self) -> bool:
        return self.lifecycle_state == "InService"


class QueuedSource(StrEnum):
    """A queueing system whose jobs count before they are pods (`demand.kubernetes.queued`; kubernetes/queued.py)."""

    KUEUE = "kueue"
    VOLCANO = "volcano"


class WaitingWork(Frozen):
    """Work that waits for GPUs: a pod, a job or a queued message (or `count` alike), and what each asks for."""

    name: str
    gpus: float = Field(gt=0)  # per item
    since: datetime | None = None  # when the longest-waiting of them started waiting, when the source says
    count: int = Field(default=1, ge=1)
    whole_node: bool = False  # needs a node of its own (required anti-affinity to its kind, a hostPort): one per node
    # The gang it belongs to (a Kueue Workload, a Volcano PodGroup: kubernetes/queued.py): all of a gang's work
    # gets its nodes in one change, or none of it does. Empty: work on its own.
    gang: str = ""


class UnfitWork(Frozen):
    """Waiting work no group can ever take (too big for every node shape, or a constraint no shape meets):
    it asks for nothing, and is told once per set with the numbers."""

    key: str  # stable identity of the set (namespace, owner, request): one notice per key
    count: int = Field(ge=1)
    text: str  # "3 pods of serving/infer (cpu 4, memory 16Gi, 1 GPU) fit no group: eks:ml/gpu-infer's ..."


class NodeNotice(Frozen):
    """A node the demand path must tell about (one notice per key): a node that never became GPU-ready."""

    key: str
    instance_id: str
    text: str


class Demand(Frozen):
    """What waits for a group, read from its demand source this tick, in the group's node shape so the
    core can pack it. `unreadable` says why the source could not be read: the group then falls back to its
    utilization rules, as if it had no source."""

    source: str  # for people: "cluster ml", "queue train-jobs", "metric Slurm/PendingGPUs"
    noun: str = "pod"  # what one item is called in a reason: pod, job, message
    waiting: tuple[WaitingWork, ...] = ()
    gpus_per_node: float = Field(default=1.0, gt=0)
    free_gpus: tuple[float, ...] = ()  # room on the group's serving nodes, per node, that waiting work may use
    knows_nodes: bool = False  # the source set each instance's runs_work (Kubernetes: pods bound to nodes)
    # The EKS cluster whose pods were read (Kubernetes): where the last look before a removal reads them again.
    cluster: str | None = None
    unreadable: str | None = None
    unfit: tuple[UnfitWork, ...] = ()  # work of this source that no group fits (told, never asked for)
    # Nodes that running work holds (SQS: in-flight messages), which the source cannot name: never released.
    held_nodes: int = Field(default=0, ge=0)
    # The source cannot say which nodes run work (a node name EC2 does not map, a throttled lookup): no node
    # of the group may be removed. Room for waiting work is a separate fact and is not taken away by it.
    scale_in_closed: str | None = None
    # Nodes launched but not able to serve GPUs yet (no GPUs reported): on the way, not room, not victims.
    not_ready: tuple[str, ...] = ()
    never_ready: tuple[NodeNotice, ...] = ()  # past the GPU-ready timeout: told, and counted as nothing
    # Queued jobs seen and not counted (waiting for quota, an admission check, ...), and queueing systems
    # that could not be read: told once each, never asked for (kubernetes/queued.py).
    queue_notes: tuple[UnfitWork, ...] = ()

    @property
    def known(self) -> bool:
        return self.unreadable is None

    @property
    def closed_for_scale_in(self) -> str | None:
        """Why no node of the group may be removed now: the source could not be read, or cannot say
        which nodes run work (fail closed). None when scale-in may go ahead."""
        if self.unreadable is not None:
            return f"{self.source} cannot be read ({self.unreadable})"
        return self.scale_in_closed


class GroupObservation(Frozen):
    ref: GroupRef
    min_size: int
    max_size: int
    desired: int
    asg_name: str | None = None  # the ASG that holds the instances (the node group's own ASG for EKS)
    instances: tuple[InstanceObservation, ...] = ()
    instance_metrics_loaded: bool = False
    gpu_utilization: float | None = None  # group average over the lookback window
    tags: dict[str, str] = Field(default_factory=dict)
    asg_tags: dict[str, str] = Field(default_factory=dict)  # the backing ASG's own tags (EKS tags it, not us)
    capacity_type: CapacityType = CapacityType.UNKNOWN
    instance_types: tuple[str, ...] = ()  # what the group may launch, when its configuration says
    launch_template: tuple[str, str] | None = None  # (id or name, version) of a plain launch-template group
    demand: Demand | None = None  # what waits for this group, where it has a demand source
    # The adapter cannot say which nodes run work (a HyperPod group whose Slurm idle report cannot be
    # read, an ASG whose desired counts weight units): no node of the group may be removed, whatever its
    # source says. None: scale-in may go ahead.
    scale_in_closed: str | None = None
    # Why no demand source may size the group (an ASG whose desired counts weight units, not instances):
    # its demand is not read, and the reason is told. None: demand sizes it as usual.
    demand_refused: str | None = None
    # A group whose count cannot be lowered without the provider choosing the nodes (HyperPod: a lower
    # InstanceCount lets HyperPod pick, busy ones included): it shrinks only by removing idle victims by
    # id, so the core never lowers its count with a bare SET_DESIRED.
    shrinks_by_victims_only: bool = False
    # How its nodes are closed to new work (consolidation by attrition); None: they cannot be.
    marks: MarkChannel | None = None
    # The Kubernetes cluster its nodes join, where a source read it (a self-managed ASG's, from its tags or rule).
    cluster: str | None = None

    @property
    def in_service(self) -> int:
        return sum(1 for i in self.instances if i.in_service)


# ---- decisions ----


class Action(StrEnum):
    SCALE_OUT = "scale-out"
    SCALE_IN = "scale-in"
    SET_DESIRED = "set-desired"  # bring desired back inside bounds (e.g. a schedule window)
    HOLD = "hold"


class Outcome(StrEnum):
    DECIDED = "decided"
    APPLIED = "applied"
    DRY_RUN = "dry-run"
    NOT_NEEDED = "not-needed"
    SKIPPED_LEASE = "skipped-lease"
    FAILED = "failed"

    @property
    def acted(self) -> bool:
        """The change happened, or would have (dry-run): what on-call is told as done."""
        return self in (Outcome.APPLIED, Outcome.DRY_RUN)


class SkipReason(StrEnum):
    """Why an instance was passed over for scale-in (counted per reason in the EMF metrics)."""

    BUSY = "busy"
    PROTECTED = "scale-in protected"
    NO_METRICS = "without GPU metrics"
    NOT_IN_SERVICE = "not InService"
    RUNS_WORK = "running work"  # any pod bound to it but a DaemonSet's (kubernetes.pods), or a Slurm job
    NOT_DRAINED = "not drained yet"  # consolidation by attrition: closed to new work first, removed next tick

    @classmethod
    def _missing_(cls, value: object) -> SkipReason | None:
        """An intent or outbox an older gpufleet persisted says it as it did then."""
        return cls.RUNS_WORK if value == "running a GPU pod or job" else None


class Bounds(Frozen):
    min: int
    max: int
    floor: int | None = None  # a scheduled window's desired: never below this while it is open
    window: str | None = None


class Decision(Frozen):
    group: str
    action: Action
    current: int
    desired: int
    victims: tuple[str, ...] = ()
    needs_instance_metrics: bool = False
    reason: str
    trigger: Trigger
    event_id: str
    at: datetime
    bounds: Bounds | None = None
    dry_run: bool = False
    outcome: Outcome = Outcome.DECIDED
    detail: str = ""
    skipped: dict[SkipReason, int] = Field(default_factory=dict)  # scale-in candidates passed over

    owed_to: str | None = None  # a spot group this change covers (the fallback ledger counts it)
    drain: tuple[str, ...] = ()  # nodes to close to new work (consolidation by attrition)
    undrain: tuple[str, ...] = ()  # nodes gpufleet closed, to open again (waiting work fits them, or surplus gone)
    # Nodes kept above the bound the decision brings the group to, because they run work (max lowered under
    # busy nodes): they go by name as their work ends; told once with the numbers.
    held_busy: int = Field(default=0, ge=0)

    @property
    def changes_capacity(self) -> bool:
        return self.action is not Action.HOLD and (self.desired != self.current or bool(self.victims))

    @property
    def changes_marks(self) -> bool:
        return bool(self.drain or self.undrain)

    @property
    def acts(self) -> bool:
        """Something to carry out under the lease: a capacity change, node marks, or both."""
        return self.changes_capacity or self.changes_marks

    @property
    def raises_capacity(self) -> bool:
        return self.action in (Action.SCALE_OUT, Action.SET_DESIRED) and self.desired > self.current

    @property
    def lowers_capacity(self) -> bool:
        """A count set lower: what the count rule (`domain.removal.held_floor`) and its fresh read guard."""
        return self.action is not Action.HOLD and self.desired < self.current


class ForeignChange(Frozen):
    """The group's desired capacity changed between two looks, and gpufleet did not change it."""

    at: datetime
    before: int
    after: int


class GroupState(Frozen):
    """What the controller remembers about a group between invocations (DynamoDB), including what
    makes a crash mid-change safe: the change begun (`intent`, persisted under the lease before any
    AWS call, finished by the next invocation instead of being decided again) and the changes done but
    not yet audited and told (`outbox`, flushed by whoever reads the state next)."""

    version: int = 0
    last_scale_out_at: datetime | None = None
    last_scale_out_added: int = 0  # nodes that scale-out asked for: on their way until they serve (warm-up)
    last_scale_in_at: datetime | None = None
    lease_owner: str | None = None
    lease_until: datetime | None = None
    intent: Decision | None = None
    intent_attempts: int = 0
    outbox: tuple[Decision, ...] = ()
    owed: dict[str, int] = Field(default_factory=dict)  # spot group -> fallback instances owed back to it
    seen_desired: int | None = None  # desired capacity at gpufleet's last look or its own last change
    foreign: tuple[ForeignChange, ...] = ()  # recent changes gpufleet did not make (newest last)
    stand_aside_until: datetime | None = None  # another actor keeps sizing the group: gpufleet only advises
    # When node marks (cordon, Slurm drain) last failed: for a while nothing drains, and no drained node's room
    # is counted for waiting work (a launch is asked instead). Cleared by marks that work.
    marks_failed_at: datetime | None = None
    # When gpufleet last gave back a gang's partial launch: gangs are not launched for again for a while
    # (defaults.GANG_REST_S), so a capacity shortage does not bill a partial gang every few minutes.
    gang_gave_back_at: datetime | None = None

    def leased_by_other(self, event_id: str, now: datetime) -> bool:
        """Someone else holds the lease (a retry of the same event may take over its own change)."""
        held = self.lease_until is not None and self.lease_until > now
        return held and not (self.lease_owner or "").startswith(f"{event_id}#")


class SeriesStats(Frozen):
    """One CloudWatch series over a lookback, summed from its periods: samples (SampleCount), their sum,
    the largest and smallest value. What `scaling.metric_trust` checks before a series drives scaling."""

    name: str  # for people: "group asg:infer GPUUtilization", "instance i-0abc GPUUtilization"
    samples: float = 0.0
    total: float | None = None
    maximum: float | None = None
    minimum: float | None = None
    busiest_minute: float = 0.0  # the most samples of any one period (GetMetricData's Period 60)

    @property
    def mean(self) -> float | None:
        """The sample-weighted mean (what the series' Average over the whole lookback is)."""
        return self.total / self.samples if self.total is not None and self.samples > 0 else None
