"""What a replay reads and what it reports: pods, options, per-run results and timelines.

Times are whole minutes from the trace start: the scaler reconciles once a minute, so nothing finer
changes a decision, and integers keep the 31-day loop cheap.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field

from gpufleet.domain import defaults
from gpufleet.domain.models import Frozen

MILLI_PER_GPU = 1000
# g5.48xlarge (8x A10G), us-east-1 on-demand, Linux: the replay's default node price (sources in docs/replay.md).
DEFAULT_NODE_PRICE = 16.288
DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday, so schedule windows in a policy make sense


class TraceFormat(StrEnum):
    DLRM_V2025 = "alibaba-gpu-v2025-dlrm"
    PODS_V2023 = "alibaba-gpu-v2023-pods"
    SYNTHETIC = "synthetic-bursty"


class Placement(StrEnum):
    """kube-scheduler's NodeResourcesFit scoring: LeastAllocated (the default) spreads, MostAllocated packs."""

    SPREAD = "spread"
    PACK = "pack"


class RunName(StrEnum):
    GPUFLEET = "gpufleet"
    ORACLE = "oracle"
    STATIC_PEAK = "static-peak"
    ASG_TARGET_TRACKING = "asg-target-tracking"
    CLUSTER_AUTOSCALER = "cluster-autoscaler"


class Pod(Frozen):
    """One pod (or DLRM instance): `gpus` whole GPUs on one node, or a `milli` share of one GPU.

    `duration` is how long it runs once started (None: past the end of the trace); a disrupted pod
    starts again and needs all of it again."""

    name: str
    arrival: int = Field(ge=0)
    duration: int | None = Field(default=None, ge=1)
    gpus: int = Field(default=1, ge=1)
    milli: int = Field(default=MILLI_PER_GPU, ge=1, le=MILLI_PER_GPU)
    # The gang (job) it belongs to: a gang's pods start together or not at all, as Volcano's and Kueue's
    # gang scheduling place them. Empty: a pod on its own.
    gang: str = ""

    @property
    def whole(self) -> bool:
        return self.milli >= MILLI_PER_GPU

    @property
    def demand_milli(self) -> int:
        """GPU demand in thousandths of a GPU."""
        return self.gpus * MILLI_PER_GPU if self.whole else self.milli


class Trace(Frozen):
    """A workload: its pods (sorted by arrival) and the minutes it covers."""

    format: TraceFormat
    source: str
    pods: tuple[Pod, ...]
    horizon: int = Field(ge=1)
    skipped: int = 0  # rows without a GPU request (CPU-only pods, DLRM CPU nodes)


class CapacityShortage(Frozen):
    """Injected EC2 capacity shortage, the same for every run of a replay (seeded, never drawn per run).

    Time is cut into slots of `window_minutes`; each slot is short with probability `share` (drawn from
    `seed` and the slot's number, so the same slots are short whatever the controller does). In a short
    slot at most `nodes` new instances start, all launches together; an ASG asked for more keeps its
    desired capacity and retries every minute, so the missing instances start when capacity returns
    (unless desired is lowered first). What the core reads is what AWS shows: desired counts the missing
    instances, the instance list only those launched."""

    share: float = Field(default=0.25, ge=0, le=1)
    window_minutes: int = Field(default=60, ge=1)
    nodes: int = Field(default=1, ge=0)
    seed: int = 13

    @property
    def label(self) -> str:
        return f"{self.share:.0%} of {self.window_minutes}-min slots start at most {self.nodes} node(s)"


class ReplayOptions(Frozen):
    """One replay's fixed world: node shape, boot delay, price, scheduler placement, group bounds."""

    gpus_per_node: int = Field(default=8, ge=1, le=64)
    boot_minutes: int = Field(default=defaults.DEFAULT_WARMUP_S // 60, ge=0, le=120)  # the warm-up default
    node_price: float = Field(default=DEFAULT_NODE_PRICE, gt=0)
    placement: Placement = Placement.SPREAD
    min_nodes: int = Field(default=1, ge=0)
    max_nodes: int | None = Field(default=None, ge=1)
    start: datetime = DEFAULT_START
    tt_target: float = Field(default=70.0, gt=0, lt=100)  # asg-target-tracking's target value (GPU %)
    seed: int = 13
    shortage: CapacityShortage | None = None  # injected partial launches; None: every launch is whole

    @property
    def node_milli(self) -> int:
        return self.gpus_per_node * MILLI_PER_GPU


class ReplayRequest(Frozen):
    """What `gpufleet replay` was asked for: exactly one of a trace and a group's CloudWatch history, the
    policy (a file, else the recommended one for the workload), the simulated world, and where to write."""

    trace: str | None = None  # a trace CSV, or `synthetic:bursty`
    from_cloudwatch: str | None = None  # asg:NAME or eks:CLUSTER/NODEGROUP
    days: int = Field(default=7, ge=1)
    policy: str | None = None
    workload: Literal["serving", "batch"] | None = None
    experiments: bool = False
    progress: bool = True
    endpoint: str | None = None
    out: str = "replay-out"
    options: ReplayOptions = ReplayOptions()


class NeverFit(Frozen):
    """Pods that ask for more GPUs than one node has: no policy can place them, so no run replays them
    (the oracle does not count them as demand it serves either). Counted and shown, never dropped silently."""

    gpus_per_node: int = Field(ge=1)
    pods: int = Field(default=0, ge=0)
    gpu_hours: float = Field(default=0.0, ge=0)  # what they would have run from arrival, within the trace

    @property
    def line(self) -> str:
        """The sentence the table and `gpufleet replay` show ('' when every pod fits)."""
        if not self.pods:
            return ""
        noun = "GPU" if self.gpus_per_node == 1 else "GPUs"
        return (
            f"{self.pods:,} pods never fit a node of {self.gpus_per_node} {noun} ({self.gpu_hours:,.1f} GPU-hours): "
            "not replayed in any run, the oracle included."
        )


class RunResult(Frozen):
    """One policy's totals over the whole trace: exactly the keys `report.json` promises.

    `nodes_drained` / `nodes_undrained`: nodes the policy marked to drain (no new pods) and handed back
    before they emptied (0 for policies that never drain). `not_ranked`: why this run is shown but not
    compared (it could not start at the given bounds), else None."""

    name: str
    node_hours: float
    gpu_hours_provisioned: float
    gpu_hours_used: float
    pending_gpu_minutes: float
    pods_disrupted: int
    lost_gpu_hours: float
    scaling_actions: int
    cost_usd: float
    nodes_drained: int = 0
    nodes_undrained: int = 0
    not_ranked: str | None = None
    # Gangs (pods sharing `Pod.gang`): node-minutes billed for nodes launched for a gang while it could not
    # start with fewer nodes than it needs (gangs.py says how nodes are counted), gangs that started, and
    # their mean wait from arrival to start (None: no gang started).
    gang_partial_node_minutes: float = 0.0
    gangs_started: int = 0
    gang_wait_minutes: float | None = None


class Timeline(Frozen):
    """Per-minute samples of one run, for the plot: nodes billed, GPUs allocated, GPUs pending."""

    nodes: tuple[int, ...]
    used_gpus: tuple[float, ...]
    pending_gpus: tuple[float, ...]


class RunOutcome(Frozen):
    result: RunResult
    timeline: Timeline
