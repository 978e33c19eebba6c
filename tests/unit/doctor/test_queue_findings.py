"""doctor on queue-driven groups (issue 28): a queue whose workers hold messages while nothing marks their
nodes busy (no instance protected from scale-in), and groups that read one source with no order between
them. Table rows on account views built by hand."""

from __future__ import annotations

import pytest

from gpufleet.domain.kinds import GroupKind
from gpufleet.domain.models import GroupObservation, GroupRef, InstanceObservation
from gpufleet.policy.fleet import parse_policy
from gpufleet_tools.doctor.core import AccountView, DemandView, Finding, Level, Presence, diagnose
from tests.unit.doctor.test_core import group

URL = "https://sqs.us-east-1.amazonaws.com/123456789012/train-jobs"
JOBS = GroupRef(kind=GroupKind.ASG, name="jobs")
SPOT = GroupRef(kind=GroupKind.ASG, name="jobs-spot")
OD = GroupRef(kind=GroupKind.ASG, name="jobs-od")


def nodes(ref: GroupRef, protected: int = 0, unprotected: int = 2) -> GroupObservation:
    instances = tuple(
        InstanceObservation(instance_id=f"i-{ref.name}-{n}", protected_from_scale_in=n < protected)
        for n in range(protected + unprotected)
    )
    return group(ref, 0, 8, instances=instances).model_copy(update={"desired": len(instances)})


def view(*groups: GroupObservation, in_flight: int | None = 3) -> AccountView:
    demand = tuple(
        DemandView(group=g.ref.key, source="queue train-jobs", found="...", in_flight=in_flight) for g in groups
    )
    return AccountView(groups=groups, demand=demand, slack_secret=Presence.PRESENT, topic=Presence.PRESENT)


def queue_rule(name: str, order: int | None = None, extra: str = "") -> str:
    o = f", order: {order}" if order is not None else ""
    return f'  - {{name: {name}, kind: asg, demand: {{sqs: {{queue_url: "{URL}"}}, gpus_per_node: 1{o}}}{extra}}}\n'


def warnings(policy: str, v: AccountView, needle: str) -> list[Finding]:
    return [f for f in diagnose(parse_policy(policy), v) if f.level is Level.WARNING and needle in f.text]


BUSY = "gpufleet-node busy -- COMMAND"


@pytest.mark.parametrize(
    ("protected", "in_flight", "warned"),
    [
        (0, 3, True),  # workers hold 3 jobs, nothing says which nodes: a busy one may go
        (1, 3, False),  # the workers mark their nodes
        (0, 0, False),  # nothing in flight: nothing to keep
        (0, None, False),  # the queue could not be read: its own finding says so
    ],
)
def test_a_queue_group_with_jobs_in_flight_and_no_protected_instance_is_told_how_to_mark_busy_nodes(
    protected: int, in_flight: int | None, warned: bool
) -> None:
    found = warnings("groups:\n" + queue_rule("jobs"), view(nodes(JOBS, protected), in_flight=in_flight), BUSY)
    assert bool(found) is warned
    if warned:
        assert (
            found[0].subject == "asg:jobs" and "3 message(s) of queue train-jobs are being worked on" in found[0].text
        )


def test_groups_on_one_queue_are_judged_together_and_an_empty_group_is_not_warned() -> None:
    policy = "groups:\n" + queue_rule("jobs-spot", 0) + queue_rule("jobs-od", 1)
    protected_elsewhere = view(nodes(SPOT, protected=1), nodes(OD))
    assert warnings(policy, protected_elsewhere, BUSY) == []
    none_protected = view(nodes(SPOT), nodes(OD, unprotected=0))
    assert [f.subject for f in warnings(policy, none_protected, BUSY)] == ["asg:jobs-spot"]


def test_an_external_group_is_not_doctors_to_protect() -> None:
    policy = "groups:\n" + queue_rule("jobs", extra=", owner: external")
    assert warnings(policy, view(nodes(JOBS)), BUSY) == []


SPOT_PAIR = "spot: {groups: [{group: asg:jobs-spot, fallback: {group: asg:jobs-od}}]}\n"
ORDER = "no `demand.order` between them"


@pytest.mark.parametrize(
    ("rules", "extra", "warned"),
    [
        (queue_rule("jobs-spot") + queue_rule("jobs-od"), "", True),  # two groups, one queue, nobody said who first
        (queue_rule("jobs-spot", 0) + queue_rule("jobs-od", 1), "", False),
        (queue_rule("jobs-spot", 0) + queue_rule("jobs-od"), "", False),  # unset comes after every set one
        (queue_rule("jobs-spot", 2) + queue_rule("jobs-od", 2), "", True),  # equal orders order nothing
        (queue_rule("jobs-spot") + queue_rule("jobs-od"), SPOT_PAIR, False),  # spot first, then its fallback
    ],
)
def test_two_rules_on_one_queue_without_an_order_are_warned(rules: str, extra: str, warned: bool) -> None:
    found = warnings("groups:\n" + rules + extra, view(nodes(SPOT, 1), nodes(OD, 1)), ORDER)
    assert bool(found) is warned
    if warned:
        assert found[0].subject == "asg:jobs-od, asg:jobs-spot"
        assert "queue train-jobs" in found[0].text and "asg:jobs-od first" in found[0].text


def test_one_metric_read_by_two_groups_needs_an_order_and_their_own_dimensions_do_not() -> None:
    shared = "{namespace: Slurm, metric_name: PendingGPUs, dimensions: {Partition: gpu}}"
    own = "{namespace: Slurm, metric_name: PendingGPUs}"
    rule = "  - {{name: {}, kind: asg, demand: {{metric: {}, gpus_per_node: 8}}}}\n"
    v = AccountView(groups=(nodes(SPOT, 1), nodes(OD, 1)), slack_secret=Presence.PRESENT, topic=Presence.PRESENT)
    both = "groups:\n" + rule.format("jobs-spot", shared) + rule.format("jobs-od", shared)
    [finding] = warnings(both, v, ORDER)
    assert "metric Slurm/PendingGPUs (Partition=gpu)" in finding.text
    apart = "groups:\n" + rule.format("jobs-spot", own) + rule.format("jobs-od", own)
    assert warnings(apart, v, ORDER) == []
