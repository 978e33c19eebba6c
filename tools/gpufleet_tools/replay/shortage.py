"""The ASG's side of a launch in the replay: desired capacity versus instances launched, under injected
EC2 capacity shortages (`CapacityShortage`, model.py).

As on AWS: raising desired by n when EC2 has room for only k < n starts k instances; the group keeps
desired at n and keeps trying to launch the rest (EC2 Auto Scaling retries an InsufficientInstanceCapacity
launch; its activity history shows the failures), here once a minute, so they start when capacity comes
back. Lowering desired first cancels instances not yet launched (newest first), then terminates.
Without a shortage every launch is whole and nothing here changes a run.
"""

from __future__ import annotations

from typing import Protocol

from gpufleet_tools.replay.model import CapacityShortage


class AsgCluster(Protocol):
    """What the ASG's side needs of the simulated group (simulate.Cluster), declared here so that this
    module, which the group imports, does not import it back."""

    asg: Asg

    def launch(self, count: int, t: int) -> object: ...  # the nodes started: not read here


class Asg:
    """Instances asked for but not launched (`asked`: the minute each was asked, oldest first) and the
    shortage's room, slot by slot."""

    __slots__ = ("_short", "_used", "asked", "shortage")

    def __init__(self, shortage: CapacityShortage | None) -> None:
        self.shortage = shortage
        self.asked: list[int] = []
        self._short: dict[int, bool] = {}
        self._used: dict[int, int] = {}  # short slot -> instances started in it

    @property
    def missing(self) -> int:
        return len(self.asked)

    def short(self, t: int) -> bool:
        """Whether minute t lies in a short slot (seeded per slot: the same for every run)."""
        s = self.shortage
        if s is None or s.share <= 0:
            return False
        slot = t // s.window_minutes
        if slot not in self._short:
            self._short[slot] = _unit(s.seed, slot) < s.share
        return self._short[slot]

    def room(self, t: int, wanted: int) -> int:
        """How many of `wanted` instances EC2 starts at minute t (and books them)."""
        if not wanted or not self.short(t):
            return wanted
        assert self.shortage is not None
        slot = t // self.shortage.window_minutes
        got = min(wanted, self.shortage.nodes - self._used.get(slot, 0))
        self._used[slot] = self._used.get(slot, 0) + got
        return got


def raise_desired(cluster: AsgCluster, count: int, t: int) -> int:
    """Desired + count: what EC2 has room for starts now, the rest waits in the group. Returns started."""
    started = cluster.asg.room(t, count)
    cluster.launch(started, t)
    cluster.asg.asked += [t] * (count - started)
    return started


def retry(cluster: AsgCluster, t: int) -> None:
    """The group retries its missing instances (oldest asked first) as far as capacity allows."""
    if cluster.asg.asked:
        got = cluster.asg.room(t, cluster.asg.missing)
        if got:
            del cluster.asg.asked[:got]
            cluster.launch(got, t)


def cancel(cluster: AsgCluster, count: int) -> int:
    """Desired lowered by up to `count` instances not yet launched (newest first). Returns how many."""
    gone = min(count, cluster.asg.missing)
    if gone:
        del cluster.asg.asked[-gone:]
    return gone


def _unit(seed: int, slot: int) -> float:
    """A number in [0, 1) drawn from (seed, slot) alone (splitmix64): the same on every machine and run,
    with no random generator to share between runs."""
    x = (seed * 0x9E3779B97F4A7C15 + slot * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) & (2**64 - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return (x ^ (x >> 31)) / 2**64
