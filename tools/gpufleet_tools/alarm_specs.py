"""The scaling alarms a managed group needs (pure): a scale-out alarm on its GPU utilization above the
band and a scale-in alarm below it, named with the stack's prefix (so the EventBridge rule delivers them),
on the group's own metric dimensions (so the scaler finds the group) and tagged with their direction.
Optionally a scale-out alarm on the group's GPU memory. `gpufleet alarms` prints them as CloudFormation or
puts them with PutMetricAlarm; metric names come from the node schema, the one source of truth.
"""

from __future__ import annotations

from typing import Any

from gpufleet.domain import defaults
from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import Direction, Frozen, GroupRef
from gpufleet_node import schema


class AlarmSpec(Frozen):
    name: str
    metric: str
    dimensions: dict[str, str]
    threshold: float
    above: bool
    evaluation_periods: int
    direction: Direction
    group: str


DEFAULT_HIGH, DEFAULT_LOW = 85.0, 20.0  # percent GPU utilization: scale out above, in below


def _slug(ref: GroupRef) -> str:
    return ref.name if ref.kind is GroupKind.ASG else f"{ref.cluster}-{ref.name}"


def scaling_alarms(
    ref: GroupRef,
    prefix: str,
    high: float = DEFAULT_HIGH,
    low: float = DEFAULT_LOW,
    memory_high: float | None = None,
    stem: str | None = None,
) -> list[AlarmSpec]:
    """High (2 of 2 minutes) and low (4 of 4: scale in slower than out) utilization; memory if asked.
    Named `<prefix><stem>-gpu-high|low`, the stem the group's name (cluster-nodegroup for EKS) unless given."""
    stem = stem or _slug(ref)

    def spec(suffix: str, metric: str, threshold: float, direction: Direction, periods: int) -> AlarmSpec:
        return AlarmSpec(
            name=f"{prefix}{stem}-{suffix}",
            metric=metric,
            dimensions=ref.metric_dimensions,
            threshold=threshold,
            above=direction is Direction.OUT,
            evaluation_periods=periods,
            direction=direction,
            group=ref.key,
        )

    utilization = schema.GPU_UTILIZATION.name
    specs = [spec("gpu-high", utilization, high, Direction.OUT, 2), spec("gpu-low", utilization, low, Direction.IN, 4)]
    if memory_high is not None:
        specs.append(spec("gpu-memory-high", schema.GPU_MEMORY_USED_PERCENT.name, memory_high, Direction.OUT, 2))
    return specs


def band_problem(high: float, low: float, memory_high: float | None = None) -> str | None:
    """Why thresholds cannot work, or None. A scale-out threshold at or below the scale-in one leaves no
    band between them: utilization there fires both, and the group scales out and in by turns."""
    for flag, value in (("--high", high), ("--low", low), ("--memory-high", memory_high)):
        if value is not None and not 0 <= value <= 100:
            return f"{flag} {value:g} is not a percentage: pass a value from 0 to 100"
    if high > low:
        return None
    defaults_ = f"(defaults: --high {DEFAULT_HIGH:g} --low {DEFAULT_LOW:g})"
    if high == low:
        return (
            f"--high {high:g} equals --low {low:g}: with no band between them the group scales out and in by "
            f"turns; pass --high above --low {defaults_}"
        )
    return (
        f"--high {high:g} is below --low {low:g}: from {high:g} % to {low:g} % both alarms fire, scaling out "
        f"and in at once; pass --high above --low {defaults_}"
    )


def put_metric_alarm_args(spec: AlarmSpec) -> dict[str, Any]:
    """Keyword arguments for CloudWatch PutMetricAlarm."""
    return {
        "AlarmName": spec.name,
        "AlarmDescription": f"gpufleet: scale {spec.direction} {spec.group}",
        "Namespace": schema.NAMESPACE,
        "MetricName": spec.metric,
        "Dimensions": [{"Name": k, "Value": v} for k, v in spec.dimensions.items()],
        "Statistic": "Average",
        "Period": 60,
        "EvaluationPeriods": spec.evaluation_periods,
        "Threshold": spec.threshold,
        "ComparisonOperator": "GreaterThanThreshold" if spec.above else "LessThanThreshold",
        "TreatMissingData": "missing",
        "Tags": [{"Key": defaults.TAG_ALARM_DIRECTION, "Value": str(spec.direction)}],
    }


def cloudformation(specs: list[AlarmSpec]) -> dict[str, Any]:
    """A `Resources:` block of AWS::CloudWatch::Alarm, one per spec (logical ids from the names)."""
    resources = {}
    for spec in specs:
        args = put_metric_alarm_args(spec)
        logical = "".join(part.capitalize() for part in spec.name.replace("_", "-").split("-") if part.isalnum())
        resources[logical or "GpuAlarm"] = {"Type": "AWS::CloudWatch::Alarm", "Properties": args}
    return {"Resources": resources}
