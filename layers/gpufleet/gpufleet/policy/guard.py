"""The guard's section of the fleet policy: memory-risk thresholds and GPU-health actions."""

from __future__ import annotations

from pydantic import Field, model_validator

from gpufleet.domain.models import Frozen
from gpufleet_node import schema


class OomSettings(Frozen):
    warning_percent: float = Field(default=90.0, gt=0, le=100)
    critical_percent: float = Field(default=97.0, gt=0, le=100)
    warning_minutes: float = Field(default=30.0, gt=0)  # full within this: WARNING
    critical_minutes: float = Field(default=5.0, gt=0)  # full within this: CRITICAL
    window_minutes: int = Field(default=15, ge=3, le=180)
    min_points: int = Field(default=5, ge=3)
    jump_percent: float = Field(default=10.0, gt=0, le=100)  # a minute-to-minute change this big restarts the trend
    # Group-wide pressure: this share of a group's GPUs at WARNING or worse asks the scaler for a scale-out.
    scale_out_on_pressure: bool = False
    pressure_share: float = Field(default=0.5, gt=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> OomSettings:
        if self.critical_percent < self.warning_percent:
            raise ValueError("critical_percent must be >= warning_percent")
        if self.critical_minutes > self.warning_minutes:
            raise ValueError("critical_minutes must be <= warning_minutes")
        return self


class HealthSettings(Frozen):
    """XID codes counted as critical are the publisher's `critical_xids` (default schema.CRITICAL_XIDS)."""

    xid: bool = True
    ecc_double_bit: bool = True
    remapped_rows: bool = True
    gpu_lost: bool = True
    replace_unhealthy: bool = False  # mark the instance Unhealthy in its ASG so it is replaced
    max_replacements_per_hour: int = Field(default=1, ge=0, le=100)
    min_healthy_percent: float = Field(default=75.0, ge=0, le=100)
    lookback_minutes: int = Field(default=5, ge=1, le=60)


class GuardPolicy(Frozen):
    memory: OomSettings = OomSettings()
    health: HealthSettings = HealthSettings()
    # Nodes that publish GPU metrics outside every managed group are screened too, told only (never
    # replaced, never scaled): two series per such node per run (docs/oom-guard.md says what it costs).
    unmanaged_nodes: bool = True
    critical_xids: tuple[int, ...] = schema.CRITICAL_XIDS  # documented here; counted by the publisher
