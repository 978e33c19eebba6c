"""The fleet policy: which groups gpufleet manages and how (a YAML document validated here).

Read from a local file (CLI, demo) or an SSM parameter (deployed stack). Validation errors name the
field path and the bad value, so `gpufleet validate-policy` output can be acted on directly.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from croniter import croniter
from pydantic import BaseModel, BeforeValidator, Field, ValidationError, model_validator

from gpufleet.domain import defaults
from gpufleet.domain.demand_sources import SourceName
from gpufleet.domain.errors import PolicyError, describe_validation_error, one_line
from gpufleet.domain.kinds import GroupKind, traits
from gpufleet.domain.models import Direction, Frozen, GroupRef, QueuedSource
from gpufleet.domain.quantity import is_quantity
from gpufleet.domain.values import LONE_SURROGATE, is_storable
from gpufleet.policy.capacity import SpotPolicy
from gpufleet.policy.guard import GuardPolicy
from gpufleet.policy.notify import NotificationPolicy

__all__ = ["FleetPolicy", "GroupSettings", "PolicyError", "parse_policy"]

_STEP_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


class Step(Frozen):
    """A scaling step: an absolute instance count or a percent of current capacity."""

    value: float
    percent: bool = False

    def size(self, current: int) -> int:
        """Instances to add or remove; a percent step always moves at least one instance."""
        if self.percent:
            return max(1, math.ceil(current * self.value / 100))
        return int(self.value)

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else str(int(self.value))


def _parse_step(raw: Any) -> Any:
    if isinstance(raw, Step | dict):
        return raw
    if isinstance(raw, bool):
        raise ValueError("expected an integer >= 1 or a percentage like '25%'")
    if isinstance(raw, int):
        if raw < 1:
            raise ValueError("an absolute step must be >= 1")
        return Step(value=raw)
    if isinstance(raw, str):
        m = _STEP_RE.match(raw)
        if m and 0 < float(m.group(1)) <= 1000:
            return Step(value=float(m.group(1)), percent=True)
        if raw.strip().isdigit() and int(raw) >= 1:
            return Step(value=int(raw))
    raise ValueError("expected an integer >= 1 or a percentage like '25%'")


StepField = Annotated[Step, BeforeValidator(_parse_step)]


class TargetBand(Frozen):
    """Reconcile keeps the group's average GPU utilization between low and high (percent)."""

    low: float = Field(default=defaults.DEFAULT_TARGET_LOW, ge=0, le=100)
    high: float = Field(default=defaults.DEFAULT_TARGET_HIGH, ge=0, le=100)
    enabled: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self


class IdleThreshold(Frozen):
    """An instance is a scale-in candidate only when every GPU on it is below both numbers."""

    gpu_utilization: float = Field(default=defaults.DEFAULT_IDLE_GPU_UTILIZATION, ge=0, le=100)
    memory_percent: float = Field(default=defaults.DEFAULT_IDLE_GPU_MEMORY_PERCENT, ge=0, le=100)


class Consolidation(StrEnum):
    """How a group holding more nodes than its work needs gets back to size. `off`: only nodes that go
    idle on their own are removed. `attrition`: the emptiest surplus nodes are closed to new work
    (cordoned, Slurm-drained) so they empty as their work ends, then removed; nothing is evicted."""

    OFF = "off"
    ATTRITION = "attrition"


CRON_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("weekday", 0, 7))


def cron_problem(cron: str) -> str | None:
    """What is wrong with a schedule's 5-field cron expression, the field named (None if valid)."""
    fields = cron.split()
    if len(fields) != len(CRON_FIELDS):
        return f"cron {cron!r} has {len(fields)} field(s); a schedule needs 5: minute hour day month weekday"
    for text, (name, low, high) in zip(fields, CRON_FIELDS, strict=True):
        for number in re.findall(r"\d+", text.split("/")[0]):
            if not low <= int(number) <= high:
                return f"cron {cron!r}: {name} {number} is out of range {low}-{high}"
    return None if croniter.is_valid(cron) else f"cron {cron!r} is not a valid cron expression"


def _timezone_problem(name: str) -> str | None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return f"timezone {name!r} is not an IANA time zone (e.g. Europe/Berlin, America/New_York, UTC)"
    return None


class ScheduleWindow(Frozen):
    """From each cron firing (in `timezone`) for `duration_minutes`: these bounds apply."""

    name: str = Field(min_length=1)
    cron: str
    timezone: str = "UTC"
    duration_minutes: int = Field(ge=1, le=7 * 24 * 60)
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)
    desired: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Self:
        problems = [p for p in (cron_problem(self.cron), _timezone_problem(self.timezone)) if p]
        if problems:
            raise ValueError("; ".join(problems))
        if self.min is None and self.max is None and self.desired is None:
            raise ValueError("a window sets at least one of min, max, desired")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        if self.desired is not None:
            if self.min is not None and self.desired < self.min:
                raise ValueError(f"desired ({self.desired}) is below min ({self.min})")
            if self.max is not None and self.desired > self.max:
                raise ValueError(f"desired ({self.desired}) is above max ({self.max})")
        return self


class Owner(StrEnum):
    GPUFLEET = "gpufleet"  # gpufleet sizes the group
    EXTERNAL = "external"  # Cluster Autoscaler or native scaling policies size it: gpufleet advises only


class KubernetesDemand(Frozen):
    """Pods waiting for GPUs in an EKS cluster (Unschedulable, matched to the group by nodeSelector,
    required node affinity, taints and GPUs per instance): a managed node group's cluster, or the one a
    self-managed ASG's nodes join (`cluster`, else its kubernetes.io/cluster/NAME or eks:cluster-name tag)."""

    name: ClassVar[SourceName] = SourceName.KUBERNETES
    # A self-managed ASG's cluster, where its tags do not say it (or say several); unset: from its tags.
    cluster: str | None = Field(default=None, min_length=1, max_length=100, pattern=r"^[0-9A-Za-z][A-Za-z0-9_-]*$")

    # Extended resources that are (shares of) GPUs -> how many of them make one GPU.
    gpu_resources: dict[str, float] = Field(default_factory=lambda: {"nvidia.com/gpu": 1.0}, min_length=1)
    # Pods below this priority ask for no node (overprovisioning placeholders run this way).
    expendable_priority: int = defaults.DEFAULT_EXPENDABLE_PRIORITY
    # For AMIs that reserve otherwise than the EKS AMI: resource -> allocatable quantity on a fresh node
    # ({"cpu": "3500m", "memory": "13Gi", "ephemeral-storage": "90Gi"}); replaces the computed value.
    allocatable: dict[str, str] | None = Field(default=None, max_length=64)
    # Queueing systems whose jobs count before they are pods (Kueue Workloads, Volcano PodGroups; docs/
    # queued-jobs.md). Each is read only where its CRDs are installed; [] reads pods alone.
    queued: tuple[QueuedSource, ...] = (QueuedSource.KUEUE, QueuedSource.VOLCANO)

    @model_validator(mode="after")
    def _units(self) -> Self:
        bad = [name for name, units in self.gpu_resources.items() if not 0 < units <= 1000]
        if bad:
            raise ValueError(f"gpu_resources units per GPU must be in (0, 1000]: {', '.join(bad)}")
        wrong = [k for k, v in (self.allocatable or {}).items() if not is_quantity(v)]
        if wrong:
            raise ValueError(f"allocatable must be Kubernetes quantities (4, 3500m, 16Gi): {', '.join(wrong)}")
        return self


class QueueDemand(Frozen):
    """An SQS queue of jobs for a plain ASG: each visible message is one job of `gpus_per_message` GPUs."""

    name: ClassVar[SourceName] = SourceName.SQS
    queue_url: str = Field(pattern=r"^https?://\S+$")
    gpus_per_message: float = Field(default=1.0, gt=0, le=1024)
    in_flight: bool = False  # kept for old policies: in-flight messages now always count as running work
    # A FIFO queue runs one message of a message group at a time, and SQS counts no groups: the most
    # message groups with work at once, so no more runners are asked than can start (docs/scaler.md).
    message_groups: int | None = Field(default=None, ge=1, le=defaults.MAX_BACKLOG_ITEMS)

    @property
    def fifo(self) -> bool:
        """A FIFO queue: SQS makes every FIFO queue's name end in .fifo, and no standard queue's name may
        hold a dot, so the URL says it (no attribute to read)."""
        return self.queue_url.rstrip("/").endswith(".fifo")

    @model_validator(mode="after")
    def _groups_of_fifo_only(self) -> Self:
        if self.message_groups is not None and not self.fifo:
            raise ValueError(
                "message_groups is for a FIFO queue (its name ends in .fifo); a standard queue runs any message"
            )
        return self


class MetricDemand(Frozen):
    """A CloudWatch metric a scheduler publishes: GPUs requested by waiting jobs (latest datum, Maximum),
    on the group's dimension unless `dimensions` says otherwise (the Slurm publisher: ami/slurm-pending-gpus)."""

    name: ClassVar[SourceName] = SourceName.METRIC
    namespace: str = Field(min_length=1, max_length=255)
    metric_name: str = Field(min_length=1, max_length=255)
    dimensions: dict[str, str] | None = None


# One demand source's settings, told apart by `name` (the policy's key for it): what `DemandSource.source`
# holds. The policy keeps one optional key per source beside gpus_per_node and order, so the YAML and
# validate-policy's messages stay as users know them; validation makes exactly one of them set.
SourceSpec = KubernetesDemand | QueueDemand | MetricDemand


class DemandSource(Frozen):
    """Where a group's waiting work is read each tick: exactly one source (its key is its `SourceName`)."""

    kubernetes: KubernetesDemand | None = None
    sqs: QueueDemand | None = None
    metric: MetricDemand | None = None
    gpus_per_node: float | None = Field(default=None, gt=0, le=1024)  # ASGs: GPUs per instance (EKS: its type's)
    # Groups that read one source (a queue, a metric, a cluster's pods) split it: the lowest order first,
    # then a spot group before its fallback, then by name. Unset: after every group that sets one.
    order: int | None = Field(default=None, ge=0, le=1000)

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        given = [name for name in SourceName if getattr(self, name) is not None]
        if len(given) != 1:
            names = ", ".join(SourceName)
            raise ValueError(f"demand needs exactly one of {names} (got {', '.join(given) or 'none'})")
        return self

    @property
    def source(self) -> SourceSpec:
        """The one source set (validation sees to it); its `name` says which it is."""
        found = self.kubernetes or self.sqs or self.metric
        if found is None:  # only a model built without validation (model_construct) gets here
            raise ValueError("demand needs exactly one of its sources")
        return found


class GroupSettings(Frozen):
    """How one group is scaled. Unset min/max mean the group's own bounds."""

    owner: Owner = Owner.GPUFLEET
    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)
    scale_out_step: StepField = Step(value=1)
    scale_in_step: StepField = Step(value=1)
    scale_out_cooldown_s: int = Field(default=defaults.DEFAULT_SCALE_OUT_COOLDOWN_S, ge=0)
    scale_in_cooldown_s: int = Field(default=defaults.DEFAULT_SCALE_IN_COOLDOWN_S, ge=0)
    warmup_s: int = Field(default=defaults.DEFAULT_WARMUP_S, ge=0, le=3600)  # booting nodes count this long
    target: TargetBand = TargetBand()
    idle: IdleThreshold = IdleThreshold()
    schedules: tuple[ScheduleWindow, ...] = ()
    dry_run: bool = False
    demand: DemandSource | None = None  # waiting work drives scale-out, scale from and to zero
    # A new node that reports no GPUs this long after launch is an incident and no longer capacity.
    gpu_ready_timeout_s: int = Field(default=defaults.DEFAULT_GPU_READY_TIMEOUT_S, ge=60, le=6 * 3600)
    consolidate: Consolidation = Consolidation.OFF  # needs a demand source that says what each node holds
    drain_max_share: float = Field(default=defaults.DEFAULT_DRAIN_MAX_SHARE_PCT, gt=0, le=100)  # percent

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self


_SETTING_FIELDS = frozenset(GroupSettings.model_fields)


class GroupRule(GroupSettings):
    """Selects groups (exact name, glob, or tags) and overrides the defaults for them."""

    name: str | None = None
    cluster: str | None = None
    kind: GroupKind | None = None
    tags: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _selector(self) -> Self:
        if self.name is None and not self.tags:
            raise ValueError("a group rule selects by name or by tags (or both)")
        if self.kind is not None and traits(self.kind).in_cluster and self.name and not self.cluster:
            article = "an" if str(self.kind)[:1] in "aeiou" else "a"
            raise ValueError(f"{article} {self.kind} rule with a name also needs its cluster")
        return self

    @property
    def is_explicit(self) -> bool:
        """Names one concrete group, which is then managed even if discovery doesn't find it."""
        return bool(self.name and not _is_glob(self.name) and self.kind is not None)

    def explicit_ref(self) -> GroupRef | None:
        if not self.is_explicit or self.name is None or self.kind is None:
            return None
        return GroupRef(kind=self.kind, name=self.name, cluster=self.cluster)

    def matches(self, ref: GroupRef, tags: dict[str, str]) -> bool:
        if self.kind is not None and ref.kind is not self.kind:
            return False
        if self.cluster is not None and ref.cluster != self.cluster:
            return False
        if self.name is not None and not fnmatch.fnmatchcase(ref.name, self.name):
            return False
        return all(tags.get(k) == v for k, v in self.tags.items())


class AlarmMapping(Frozen):
    """For alarms that carry neither gpufleet tags nor group dimensions."""

    alarm: str = Field(min_length=1, description="alarm name or glob")
    group: str | None = None
    direction: Direction | None = None

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.group is None and self.direction is None:
            raise ValueError("an alarm mapping sets group, direction or both")
        if self.group is not None:
            GroupRef.parse_key(self.group)
        return self

    def group_ref(self) -> GroupRef | None:
        return GroupRef.parse_key(self.group) if self.group else None


class Discovery(Frozen):
    enabled: bool = True
    tag_key: str = defaults.TAG_MANAGED
    tag_value: str = defaults.TAG_MANAGED_VALUE
    asg: bool = True
    eks: bool = True


class FleetPolicy(Frozen):
    version: int = Field(default=1, ge=1, le=1)
    dry_run: bool = False
    alarm_prefix: str = defaults.DEFAULT_ALARM_PREFIX
    metric_lookback_s: int = Field(default=defaults.DEFAULT_METRIC_LOOKBACK_S, ge=60, le=3600)
    # Samples the nodes' publisher puts into a GPU series per GPU-second (the forged-series bound,
    # scaling/metric_trust.py): 1 at its defaults, 2 when the nodes set `high_resolution: true`.
    node_samples_per_gpu_s: float = Field(default=defaults.NODE_SAMPLES_PER_GPU_S, gt=0, le=10)
    # The nodes' publisher `window_s` (10, 30, 60, 120, 300): a window longer than a minute lands whole in
    # one minute of a series, which the per-minute bound must allow.
    node_window_s: Literal[10, 30, 60, 120, 300] = 60  # defaults.NODE_PUBLISH_WINDOW_S
    audit_ttl_days: int = Field(default=defaults.DEFAULT_AUDIT_TTL_DAYS, ge=1, le=400)
    discovery: Discovery = Discovery()
    defaults: GroupSettings = GroupSettings()
    groups: tuple[GroupRule, ...] = ()
    alarms: tuple[AlarmMapping, ...] = ()
    notifications: NotificationPolicy = NotificationPolicy()
    guard: GuardPolicy = GuardPolicy()  # the OOM guard and GPU health checks
    spot: SpotPolicy = SpotPolicy()  # failed launches: backoff, fallback groups, prices

    def settings_for(self, ref: GroupRef, tags: dict[str, str]) -> GroupSettings | None:
        """The first matching rule over the defaults; None if the group is not selected at all."""
        for rule in self.groups:
            if rule.matches(ref, tags):
                # The rule's own validated objects (Step, TargetBand...) for the fields it sets.
                overrides = {name: getattr(rule, name) for name in rule.model_fields_set & _SETTING_FIELDS}
                return self.defaults.model_copy(update=overrides)
        if self._discovered(tags):
            return self.defaults
        return None

    def _discovered(self, tags: dict[str, str]) -> bool:
        d = self.discovery
        return d.enabled and tags.get(d.tag_key) == d.tag_value

    def explicit_groups(self) -> list[GroupRef]:
        return [ref for rule in self.groups if (ref := rule.explicit_ref()) is not None]

    def alarm_mapping(self, alarm_name: str) -> AlarmMapping | None:
        for mapping in self.alarms:
            if fnmatch.fnmatchcase(alarm_name, mapping.alarm):
                return mapping
        return None


def _is_glob(name: str) -> bool:
    return any(ch in name for ch in "*?[")


# Bounds on what a policy document may be, so a hostile or broken one is a policy error like any other
# (the last good policy then holds) instead of a RecursionError or minutes of CPU: a real policy is a few
# KB, nested a handful of levels, with an alias or two.
MAX_POLICY_BYTES = 256 * 1024
MAX_POLICY_DEPTH = 32
MAX_POLICY_ALIASES = 64


class _TooComplex(yaml.YAMLError):
    pass


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing documents nested deeper than MAX_POLICY_DEPTH or with more than
    MAX_POLICY_ALIASES aliases (an alias bomb expands exponentially when the schema walks it)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_POLICY_ALIASES:
                raise _TooComplex(f"more than {MAX_POLICY_ALIASES} aliases")
        self._depth += 1
        try:
            if self._depth > MAX_POLICY_DEPTH:
                raise _TooComplex(f"nested deeper than {MAX_POLICY_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_scalar(self, node: yaml.ScalarNode | yaml.MappingNode) -> str:
        """Text as written, except that escaped UTF-16 surrogate pairs ("\\uD83D\\uDD25", which JSON
        writers emit for characters beyond U+FFFF) become the one character they stand for, as in JSON."""
        text = super().construct_scalar(node)
        if not is_storable(text):
            try:
                return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
            except UnicodeDecodeError:  # a lone surrogate: refused with its path once the document is loaded
                pass
        return text


def _checked(tag: str) -> Callable[[yaml.SafeLoader, yaml.Node], Any]:
    """PyYAML's constructor for a scalar tag, raising ConstructorError (a YAMLError, so a PolicyError) for
    text it cannot read (`!!int x`, the date 2026-02-30) instead of a bare ValueError or KeyError."""
    construct = yaml.SafeLoader.yaml_constructors[tag]
    kind = tag.rsplit(":", 1)[-1]

    def checked(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
        try:
            return construct(loader, node)
        except (ValueError, KeyError, AttributeError, TypeError, OverflowError):
            problem = f"{node.value!r:.60} is not a valid {kind}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None

    return checked


for _tag in ("int", "float", "bool", "timestamp"):
    _BoundedLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _checked(f"tag:yaml.org,2002:{_tag}"))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error on one line: where (line, column) and what, without its multi-line source excerpt."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        what = "; ".join(part for part in (exc.context, exc.problem, exc.note) if part)
        if mark is not None:
            return one_line(f"line {mark.line + 1}, column {mark.column + 1}: {what}")
        return one_line(what)
    return one_line(str(exc))


def _load_yaml(text: str, source: str) -> object:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise PolicyError([f"{source}: {size:,} bytes, more than a policy may be ({MAX_POLICY_BYTES:,})"])
    try:
        return yaml.load(text, Loader=_BoundedLoader)
    except _TooComplex as exc:
        raise PolicyError([f"{source}: not a policy document: {exc}"]) from None
    except yaml.YAMLError as exc:
        raise PolicyError([f"{source}: not valid YAML: {_yaml_problem(exc)}"]) from None
    except RecursionError:  # a bound above should catch it first; never let it escape as a crash
        raise PolicyError([f"{source}: not a policy document: nested too deeply"]) from None
    except (ValueError, KeyError, AttributeError, TypeError, OverflowError) as exc:  # as above, for constructors
        raise PolicyError([f"{source}: not valid YAML: {one_line(str(exc), limit=200)}"]) from None


def _path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = one_line(str(part), limit=40)  # a key is input: it may be huge or hold line breaks
            out += f".{name}" if out else name
    return out or "(document)"


def _lone_surrogates(doc: object) -> list[str]:
    """Where the loaded document holds a lone surrogate (a YAML escape like "\\uD800" makes one), key or
    value: text DynamoDB, JSON and Slack cannot carry, refused here by path rather than failing a write
    or a post later. Walked with a stack and each container once, as aliases may share or nest them."""
    problems: list[str] = []
    seen: set[int] = set()
    stack: list[tuple[object, tuple[str | int, ...]]] = [(doc, ())]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, str):
            if not is_storable(value):
                problems.append(f"{_path(loc)}: {LONE_SURROGATE}")
            continue
        if not isinstance(value, dict | list | set) or id(value) in seen:
            continue
        seen.add(id(value))
        pairs = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
        keys = value if isinstance(value, dict | set) else ()
        problems += [f"{_path(loc)}: key {k!r:.40}: {LONE_SURROGATE}" for k in keys if _unstorable(k)]
        children = [(v, (*loc, k)) for k, v in pairs if not _unstorable(k)]
        stack.extend(reversed(children))
    return problems


def _unstorable(key: object) -> bool:
    return isinstance(key, str) and not is_storable(key)


def parse_policy(text: str, source: str = "policy") -> FleetPolicy:
    """Parse and validate a YAML (or JSON) fleet policy; raise PolicyError naming every problem."""
    doc = _load_yaml(text, source)
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise PolicyError([f"(document): expected a mapping at the top level (got {doc!r:.80})"])
    unstorable = _lone_surrogates(doc)
    if unstorable:
        raise PolicyError(unstorable)
    try:
        return FleetPolicy.model_validate(doc)
    except ValidationError as err:
        problems = describe_validation_error(err)
        raise PolicyError([_explained(p, e, doc) for p, e in zip(problems, err.errors(), strict=True)]) from None


def _policy_keys(model: type[BaseModel] = FleetPolicy, seen: set[str] | None = None) -> set[str]:
    """Every key the policy schema knows, at any depth (for "did you mean")."""
    seen = set() if seen is None else seen
    for name, info in model.model_fields.items():
        seen.add(name)
        for arg in (info.annotation, *get_args(info.annotation)):
            inner = get_args(arg) or (arg,)
            for t in inner:
                if isinstance(t, type) and issubclass(t, BaseModel) and t.__name__ not in seen:
                    seen.add(t.__name__)
                    _policy_keys(t, seen)
    return {k for k in seen if not k[:1].isupper()}


def _explained(problem: str, error: Any, doc: dict[str, Any]) -> str:
    """A schema problem, with the rule's name after `groups[i]` and a suggestion for an unknown key."""
    loc = error["loc"]
    if len(loc) >= 2 and loc[0] == "groups" and isinstance(loc[1], int):
        rules = doc.get("groups")
        rule = rules[loc[1]] if isinstance(rules, list) and loc[1] < len(rules) else None
        name = rule.get("name") if isinstance(rule, dict) else None
        if isinstance(name, str):
            problem = problem.replace(f"groups[{loc[1]}]", f"groups[{loc[1]}] ({name[:40]})", 1)
    if error["type"] == "extra_forbidden" and loc and isinstance(loc[-1], str):
        close = difflib.get_close_matches(loc[-1], sorted(_policy_keys()), n=1, cutoff=0.75)
        if close:
            problem += f"; did you mean {close[0]!r}?"
    return problem
