"""The capacity section of the fleet policy (YAML key `spot`): fallback groups, backoff, prices."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from gpufleet.domain.models import Frozen


class Fallback(Frozen):
    group: str  # "asg:NAME" or "eks:CLUSTER/NODEGROUP": the on-demand group to raise
    wait_minutes: int = Field(default=5, ge=0, le=120)  # spot failures for this long before falling back


class SpotSettings(Frozen):
    group: str  # the spot group this applies to
    fallback: Fallback | None = None


# A price is a finite amount: YAML's .nan or .inf would make every cost in a notification meaningless.
Price = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class PriceTable(Frozen):
    """$ per instance-hour, for the cost estimate in notifications (your prices; not fetched)."""

    on_demand: dict[str, Price] = Field(default_factory=dict)
    spot: dict[str, Price] = Field(default_factory=dict)


class WarningAction(StrEnum):
    NOTIFY = "notify"  # tell the group's capacity incident what runs on the node
    PRELAUNCH = "prelaunch"  # and launch its replacement now (given back when the node is gone)


class InterruptionPolicy(Frozen):
    """What a spot interruption warning (2 minutes) and a rebalance recommendation (earlier, frequent,
    not always followed by an interruption) do; Auto Scaling replaces the node after it goes anyway."""

    on_interruption: WarningAction = WarningAction.NOTIFY
    on_rebalance: WarningAction = WarningAction.NOTIFY


class SpotPolicy(Frozen):
    groups: tuple[SpotSettings, ...] = ()
    prices: PriceTable = PriceTable()
    backoff_initial_s: int = Field(default=300, ge=10)
    backoff_max_s: int = Field(default=1800, ge=10)
    backoff_reset_s: int = Field(default=3 * 3600, ge=60)
    interruptions: InterruptionPolicy = InterruptionPolicy()
    unavailable_ttl_s: int = Field(default=180, ge=10)  # Karpenter keeps insufficient-capacity offerings 3 min

    def settings_for(self, group: str) -> SpotSettings | None:
        return next((g for g in self.groups if g.group == group), None)
