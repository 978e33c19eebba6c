"""The GPU-aware custom termination policy's rule (pure): which of the instances EC2 Auto Scaling wants
to remove are ready to go. Scale-in that gpufleet does not make - native policies, scheduled actions,
AZ rebalancing, instance refresh, maximum instance lifetime - goes through this answer.

Same victim rules as the scaler (`choose_scale_in_victims`): only instances whose GPUs are all idle, the
idlest first, never one scale-in protected, not InService or without GPU metrics. Per requested
(Availability Zone, market) at most its capacity, so the group stays as balanced as Auto Scaling asked.
Fewer or none is a valid answer: Auto Scaling asks again a little later (for an instance refresh, for an
hour), so a busy node's job finishes first.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpufleet.domain.models import Frozen, InstanceObservation, SkipReason
from gpufleet.events.model import TerminationCandidate, TerminationRequest
from gpufleet.policy.fleet import IdleThreshold
from gpufleet.scaling.core import choose_scale_in_victims


class TerminationAnswer(Frozen):
    instance_ids: tuple[str, ...]
    requested: int
    reason: str
    skipped: dict[SkipReason, int] = {}


def _bucket(c: TerminationCandidate) -> tuple[str | None, str | None]:
    return c.availability_zone, c.market


def choose_terminations(
    request: TerminationRequest, observed: Mapping[str, InstanceObservation], idle: IdleThreshold
) -> TerminationAnswer:
    """The instances ready to terminate, per requested (AZ, market) bucket. A candidate gpufleet did not
    observe (not in the group any more, or no metrics read) counts as without metrics: never chosen."""
    chosen: list[str] = []
    skipped: dict[SkipReason, int] = {}
    for want in request.capacity:
        key = (want.availability_zone, want.market)
        pool = [
            observed.get(c.instance_id) or InstanceObservation(instance_id=c.instance_id)
            for c in request.instances
            if c.instance_id not in chosen and all(k is None or k == w for k, w in zip(_bucket(c), key, strict=True))
        ]
        choice = choose_scale_in_victims(pool, want.capacity, idle)
        chosen += choice.victims
        for why, n in choice.skipped.items():
            skipped[why] = max(skipped.get(why, 0), n)
    requested = sum(c.capacity for c in request.capacity)
    passed = ", ".join(f"{n} {why}" for why, n in skipped.items())
    if chosen:
        reason = f"{request.cause}: {len(chosen)} of {requested} ready ({', '.join(chosen)}: all GPUs idle)"
    else:
        reason = f"{request.cause}: none of {requested} ready; Auto Scaling asks again later"
    return TerminationAnswer(
        instance_ids=tuple(chosen),
        requested=requested,
        reason=reason + (f"; passed over {passed}" if passed else ""),
        skipped=skipped,
    )
