"""EMULATED: slurmctld's node states as `sinfo` prints them and `scontrol update` changes them, for the
HyperPod tests and scenes (moto runs no Slurm). Each line it prints or call it records is [emulated].

What it follows (SchedMD/slurm):
- `sinfo -N -h -o '%N|%T|%E'`: one line per node and partition; `%T` is node_state_string() lower-cased
  (src/common/slurm_protocol_defs.c): with the drain flag, a node with a job (allocated, mixed) or
  completing prints `draining`, any other `drained` (a down node with the drain flag too); `%E` is the
  reason whole, `none` when it has none (src/sinfo/print.c _print_reason);
- `scontrol update NodeName=N State=DRAIN Reason=R`: sets the drain flag and the reason (scontrol(1):
  existing jobs run to completion); `State=DRAIN` without a reason is refused, as scontrol refuses it;
- `State=RESUME`: clears the drain flag and the reason (a down node would become idle: not emulated, a
  down node here stays down and is only undrained).
Not emulated: not-responding and power suffixes, reservations, reboot, FAIL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


class ScontrolRefused(RuntimeError):
    """What scontrol answers a bad update with (a non-zero exit there) [emulated]."""


@dataclass
class SlurmNodeState:
    base: str = "idle"  # idle | allocated | mixed | down
    drain: bool = False
    reason: str = ""

    @property
    def long_state(self) -> str:
        """`%T` as node_state_string() prints it."""
        if self.drain:
            return "draining" if self.base in ("allocated", "mixed") else "drained"
        return self.base


@dataclass
class EmulatedSlurm:
    """Nodes by Slurm name, each in partitions; `calls` records every scontrol argv it was given."""

    nodes: dict[str, SlurmNodeState] = field(default_factory=dict)
    partitions: dict[str, tuple[str, ...]] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)

    def add(self, name: str, base: str = "idle", partitions: Sequence[str] = ("gpu",)) -> None:
        self.nodes[name] = SlurmNodeState(base=base)
        self.partitions[name] = tuple(partitions)

    def set_base(self, name: str, base: str) -> None:
        """A job started (allocated) or ended (idle) on the node."""
        self.nodes[name].base = base

    def drain_by_someone(self, name: str, reason: str) -> None:
        """An operator's own drain (or a health check's): gpufleet must never resume it."""
        self.nodes[name].drain, self.nodes[name].reason = True, reason

    def sinfo(self) -> list[str]:
        """`sinfo -N -h -o '%N|%T|%E'` [emulated]."""
        return [
            f"{name}|{node.long_state}|{node.reason or 'none'}"
            for name, node in sorted(self.nodes.items())
            for _ in self.partitions.get(name, ("gpu",))
        ]

    def scontrol(self, argv: Sequence[str]) -> None:
        """`scontrol update NodeName=N State=DRAIN|RESUME [Reason=R]` [emulated]; recorded in `calls`."""
        self.calls.append(list(argv))
        args = dict(a.split("=", 1) for a in argv[2:] if "=" in a)
        if list(argv[:2]) != ["scontrol", "update"] or "NodeName" not in args:
            raise ScontrolRefused(f"not emulated: {' '.join(argv)}")
        node = self.nodes.get(args["NodeName"])
        if node is None:
            raise ScontrolRefused(f"Invalid node name specified: {args['NodeName']} [emulated]")
        state = args.get("State", "").upper()
        if state == "DRAIN":
            if not args.get("Reason"):
                raise ScontrolRefused("You must specify a reason when DOWNING or DRAINING a node. Request denied")
            node.drain, node.reason = True, args["Reason"]
        elif state == "RESUME":
            node.drain, node.reason = False, ""
        else:
            raise ScontrolRefused(f"State={state} not emulated")
