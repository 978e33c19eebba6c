"""The notifications section of the fleet policy: grouping, flap damping and routes."""

from __future__ import annotations

import fnmatch

from pydantic import Field, model_validator

from gpufleet.domain import defaults
from gpufleet.domain.models import Frozen
from gpufleet.domain.notification import NotificationKind, Severity


class Grouping(Frozen):
    """Alertmanager-style timing: wait before the first post, pace updates, repeat while firing."""

    group_wait_s: int = Field(default=defaults.NOTIFY_GROUP_WAIT_S, ge=0, le=900)
    group_interval_s: int = Field(default=defaults.NOTIFY_GROUP_INTERVAL_S, ge=0, le=86400)
    repeat_interval_s: int = Field(default=defaults.NOTIFY_REPEAT_INTERVAL_S, ge=60, le=7 * 86400)


class FlapDamping(Frozen):
    """More than `max_flips` firing<->resolved changes within `window_s`: one summary, not N posts."""

    max_flips: int = Field(default=defaults.NOTIFY_FLAP_MAX_FLIPS, ge=1, le=100)
    window_s: int = Field(default=defaults.NOTIFY_FLAP_WINDOW_S, ge=60, le=86400)


class RouteMatch(Frozen):
    severities: tuple[Severity, ...] = ()
    groups: tuple[str, ...] = ()  # globs over group keys, e.g. "asg:train-*"
    kinds: tuple[NotificationKind, ...] = ()

    def matches(self, severity: Severity, group: str, kind: NotificationKind) -> bool:
        return (
            (not self.severities or severity in self.severities)
            and (not self.groups or any(fnmatch.fnmatchcase(group, g) for g in self.groups))
            and (not self.kinds or kind in self.kinds)
        )


class Route(Frozen):
    match: RouteMatch = RouteMatch()
    slack: bool = True
    slack_channel: str | None = None  # bot-token mode only; webhooks post where they were created
    sns: bool = True


class NotificationPolicy(Frozen):
    grouping: Grouping = Grouping()
    flap: FlapDamping = FlapDamping()
    routes: tuple[Route, ...] = ()  # first match wins
    default_route: Route = Route()
    notify_holds: bool = False  # also tell about decisions that changed nothing (noisy; for debugging)

    @model_validator(mode="after")
    def _paced(self) -> NotificationPolicy:
        if self.grouping.repeat_interval_s < self.grouping.group_interval_s:
            raise ValueError("grouping.repeat_interval_s must be >= grouping.group_interval_s")
        return self

    def route_for(self, severity: Severity, group: str, kind: NotificationKind) -> Route:
        for route in self.routes:
            if route.match.matches(severity, group, kind):
                return route
        return self.default_route
