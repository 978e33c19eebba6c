"""The busy table (`gpufleet-node busy`'s marks) read and kept as scale-in protection. Glue: the rules
are `domain.busy`'s.

Every read is a consistent Scan (the table holds one item per busy node and one per node the scaler
protected: small), so a mark written before a job starts is seen by the next read, wherever it runs:
the tick that weighs a scale-in (`marked`), and the last look right before every removal (`standing`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet.aws.clients import chunks
from gpufleet.domain import defaults
from gpufleet.domain.busy import OWNED_PREFIX, BusyTable, ProtectionPlan, after_plan, plan_protection, read_table
from gpufleet.domain.models import GroupObservation
from gpufleet_node import schema


@dataclass(frozen=True)
class Kept:
    """One tick's keeping: the groups as it left them, its plan, and the ASGs (or leftovers) that refused."""

    groups: list[GroupObservation]
    plan: ProtectionPlan
    failed: tuple[str, ...] = ()


class MarksUnreadable(RuntimeError):
    """The busy table could not be read: no node of an ASG-backed group may be removed on this read."""


def auto_scaling_instances(autoscaling: Any, ids: Sequence[str]) -> dict[str, Mapping[str, Any]]:
    """DescribeAutoScalingInstances for any number of ids, 50 a call: id -> the instance as Auto Scaling
    says it now (its group, lifecycle, protection); an id no group holds is absent."""
    seen: dict[str, Mapping[str, Any]] = {}
    for batch in chunks(list(ids), defaults.DESCRIBE_ASG_INSTANCES_MAX_IDS):
        page = autoscaling.describe_auto_scaling_instances(InstanceIds=list(batch))
        seen.update({i["InstanceId"]: i for i in page.get("AutoScalingInstances", [])})
    return seen


def _flat(item: dict[str, Any]) -> dict[str, str]:
    return {k: str(v.get("S", "")) for k, v in item.items() if isinstance(v, dict)}


@dataclass
class BusyMarks:
    """The busy table: its marks read, and the protection the scaler keeps for them."""

    dynamodb: Any
    autoscaling: Any
    table: str = schema.BUSY_TABLE
    logger: Any = None
    _told_foreign: set[str] = field(default_factory=set, init=False, repr=False)

    def read(self) -> BusyTable:
        """Every item, read consistently; raises MarksUnreadable when the table cannot be read."""
        items: list[dict[str, str]] = []
        args: dict[str, Any] = {"TableName": self.table, "ConsistentRead": True}
        try:
            while True:
                page = self.dynamodb.scan(**args)
                items += [_flat(i) for i in page.get("Items", [])]
                if not page.get("LastEvaluatedKey"):
                    break
                args["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        except Exception as exc:  # ClientError, a missing table, the endpoint unreachable
            raise MarksUnreadable(f"the busy table {self.table} cannot be read ({type(exc).__name__}: {exc})") from None
        table = read_table(items)
        self._tell_foreign(table)
        return table

    def marked(self, victims: Sequence[str]) -> dict[str, str]:
        """The victims a node's own mark says hold a job now (id -> why), read fresh; raises when unreadable."""
        marks = self.read().marked
        return {v: f"holds a job now (busy mark by {marks[v]})" for v in victims if v in marks}

    def keep(
        self, groups: Sequence[GroupObservation], now: datetime, prepare: Callable[[GroupObservation], None]
    ) -> Kept:
        """Protection brought in line with the marks (`domain.busy`), ASG by ASG: one that refuses (not
        tagged managed, throttled, an instance gone between the read and the call) is said in `failed`
        and changes no other. `prepare`: what the group's kind does before its nodes are acted on (a node
        group's backing ASG adopted). Raises MarksUnreadable (nothing changed)."""
        table = self.read()
        plan = plan_protection(groups, table, now)
        by_asg = {obs.asg_name: obs for obs in groups if obs.asg_name}
        done: list[str] = []
        failed: list[str] = []
        for asg in plan.asgs():
            try:
                prepare(by_asg[asg])
                done += self._change(asg, plan.protect.get(asg, ()), plan.clear.get(asg, ()))
            except Exception as exc:  # ClientError, a throttle: this ASG waits for the next tick
                failed.append(f"{asg}: {type(exc).__name__}: {exc}")
        try:
            for iid in plan.forget:
                self._delete(OWNED_PREFIX + iid)
            for iid in self._left_every_asg(plan.gone):
                self._delete(table.marked[iid])
        except Exception as exc:  # leftovers only: tried again next tick
            failed.append(f"the busy table's leftovers: {type(exc).__name__}: {exc}")
        return Kept([after_plan(obs, plan, done) for obs in groups], plan, tuple(failed))

    def _change(self, asg: str, protect: Sequence[str], clear: Sequence[str]) -> list[str]:
        done = []
        for iid in protect:  # our record first: a crash before the call leaves a record the next tick mends
            self._put_owned(iid, asg)
        done += self._set(asg, protect, True)
        done += self._set(asg, clear, False)
        for iid in clear:
            self._delete(OWNED_PREFIX + iid)
        return done

    def _left_every_asg(self, ids: Sequence[str]) -> list[str]:
        """The instances no Auto Scaling group holds any more (terminated, or detached to none): a node in
        another group or a warm pool keeps its mark."""
        known = auto_scaling_instances(self.autoscaling, ids)
        return [iid for iid in ids if iid not in known]

    def _set(self, asg: str, ids: Sequence[str], protected: bool) -> list[str]:
        if not ids:
            return []
        for batch in chunks(list(ids), defaults.SET_PROTECTION_MAX_IDS):
            self.autoscaling.set_instance_protection(
                InstanceIds=list(batch), AutoScalingGroupName=asg, ProtectedFromScaleIn=protected
            )
        return list(ids)

    def _put_owned(self, instance_id: str, asg: str) -> None:
        item = {schema.BUSY_KEY: {"S": OWNED_PREFIX + instance_id}, "asg": {"S": asg}}
        self.dynamodb.put_item(TableName=self.table, Item=item)

    def _delete(self, key: str) -> None:
        self.dynamodb.delete_item(TableName=self.table, Key={schema.BUSY_KEY: {"S": key}})

    def _tell_foreign(self, table: BusyTable) -> None:
        """Keys no instance profile could have written (another principal with rights on the table): never
        marks; logged once per key."""
        new = [k for k in table.foreign if k not in self._told_foreign]
        if new and self.logger is not None:
            self._told_foreign.update(new)
            self.logger.warning(
                f"busy table {self.table}: {len(new)} item(s) not keyed by an instance's own aws:userid, "
                f"not taken as marks ({', '.join(new[:3])})"
            )
