"""The custom termination policy's glue: EC2 Auto Scaling asks which instances may go; read the group and
its instances' GPU metrics, answer with `scaling.termination.choose_terminations`, audit the answer.

Due within 2 seconds (EC2 Auto Scaling's limit for this function): one DescribeAutoScalingGroups and one
GetMetricData on quick clients. Whatever cannot be read answers "none ready": Auto Scaling waits a little
and asks again (for a scale-in as long as the group is above its desired capacity, for an instance
refresh for an hour), so a failure delays a termination and never kills a busy node.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from gpufleet.aws.clients import AWS_FAILURES
from gpufleet.aws.groups.asg import asg_ref
from gpufleet.aws.groups.nodegroup import owning_group
from gpufleet.aws.metrics import GpuMetricsReader
from gpufleet.domain.models import Action, Decision, Outcome, Trigger, TriggerKind
from gpufleet.events import EventKind, parse_for
from gpufleet.events.model import TerminationRequest
from gpufleet.policy.fleet import FleetPolicy
from gpufleet.scaling.execution import ControlContext
from gpufleet.scaling.service import with_instance_metrics
from gpufleet.scaling.termination import TerminationAnswer, choose_terminations

ACCEPTS = (EventKind.TERMINATION_REQUEST,)


@dataclass
class TerminationPolicy:
    ctx: ControlContext
    metrics: GpuMetricsReader

    def handle(self, event: Any, now: datetime) -> dict[str, list[str]]:
        """`{"InstanceIDs": [...]}` as EC2 Auto Scaling expects; InvalidEvent for anything else."""
        [request] = parse_for(event, "termination_policy", ACCEPTS)
        assert isinstance(request, TerminationRequest)
        policy = self.ctx.load_policy()
        answer, group, dry = self._answer(request, policy, now)
        allowed = list(request_instances(request) if dry else answer.instance_ids)
        self._audit(request, answer, group, allowed, dry, policy, now)
        return {"InstanceIDs": allowed}

    def _answer(
        self, request: TerminationRequest, policy: FleetPolicy, now: datetime
    ) -> tuple[TerminationAnswer, str, bool]:
        ref = asg_ref(request.asg_name)
        try:
            obs = self.ctx.fleet.observe_one(ref)
            if obs is None:
                return _none(request, f"group {request.asg_name} not found"), ref.key, False
            owner = owning_group(obs)
            group = owner.key
            settings = policy.settings_for(owner, obs.asg_tags) or policy.defaults
            [obs] = with_instance_metrics(self.metrics, [obs], now, policy, self.ctx.fleet)
        except AWS_FAILURES as exc:
            self.ctx.logger.warning("termination request unanswerable", extra={"error": str(exc)})
            return _none(request, f"could not read the group or its GPU metrics ({type(exc).__name__})"), ref.key, False
        observed = {i.instance_id: i for i in obs.instances}
        dry = self.ctx.dry(policy) or settings.dry_run
        return choose_terminations(request, observed, settings.idle), group, dry

    def _audit(
        self,
        request: TerminationRequest,
        answer: TerminationAnswer,
        group: str,
        allowed: list[str],
        dry: bool,
        policy: FleetPolicy,
        now: datetime,
    ) -> None:
        reason = answer.reason
        if dry:
            reason = f"dry-run: would allow {list(answer.instance_ids)}; allowed Auto Scaling's own choice ({reason})"
        decision = Decision(
            group=group,
            action=Action.SCALE_IN if allowed else Action.HOLD,
            current=answer.requested,
            desired=answer.requested - len(allowed),
            victims=tuple(allowed),
            reason=reason,
            trigger=Trigger(kind=TriggerKind.TERMINATION_REQUEST, name=request.cause),
            event_id=f"{request.event_id}:{now:%Y%m%dT%H%M%S}",
            at=now,
            dry_run=dry,
            outcome=Outcome.DRY_RUN if dry else Outcome.DECIDED,
            skipped=answer.skipped,
        )
        self.ctx.executor.record([decision], policy, tell=False)  # Auto Scaling acts (and its activity says so)
        self.ctx.emf.add_metric(name="TerminationsAllowed", unit=MetricUnit.Count, value=len(allowed))
        self.ctx.emf.add_metric(
            name="TerminationsRefused", unit=MetricUnit.Count, value=max(0, answer.requested - len(allowed))
        )


def request_instances(request: TerminationRequest) -> list[str]:
    return [c.instance_id for c in request.instances]


def _none(request: TerminationRequest, why: str) -> TerminationAnswer:
    requested = sum(c.capacity for c in request.capacity)
    return TerminationAnswer(
        instance_ids=(), requested=requested, reason=f"{request.cause}: none of {requested} ready: {why}"
    )
