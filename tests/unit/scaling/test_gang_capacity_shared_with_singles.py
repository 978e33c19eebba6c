"""At max, a gang taken with pods on their own gets capacity for both, or is refused.

The defect it reproduced: at max, `gangs.plan` takes a gang counting an existing idle node as the gang's,
then lets pods on their own fill the rest of the room from the same packing. Room 2, one idle 8-GPU node, a
gang of 3 x 8 GPUs and one single 8-GPU pod: the plan launches 2 (3 nodes for 4 pods). The default scheduler
binds the single at once to the idle node (gpufleet cannot reserve it), the gang gets 2 of its 3 nodes and
never starts; desired == listed so no partial give-back fires, and with work waiting nothing is released: 2
idle p5 nodes are billed until something else ends. Correct: when capped, a taken gang's nodes must not lean
on free capacity that work launched for in the same plan also needs (either the capacity covers gang +
singles, or the gang is refused / the singles get only what is left after the gang's own new nodes). (Found
by the independent review of issue 32, queued jobs and gangs: reproduced on the first version, passing since
its fix.)"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpufleet.domain.models import WaitingWork
from gpufleet.scaling import gangs

NOW = datetime(2026, 11, 27, 9, 30, tzinfo=UTC)


def test_capacity_launched_covers_the_gang_and_the_singles_it_was_planned_with() -> None:
    gang = [
        WaitingWork(name=f"g[{i}]", gpus=8, since=NOW - timedelta(minutes=9), gang="volcano:ml/g") for i in range(3)
    ]
    single = WaitingWork(name="solo", gpus=8, since=NOW - timedelta(minutes=1))
    p = gangs.plan([*gang, single], gpus_per_node=8, free=[8.0], booting=0, room=2)
    capacity = 1 + p.new_nodes  # the idle node + the new ones
    gang_taken = not p.refused
    assert not (gang_taken and capacity < 4), (
        f"gang taken with {capacity} nodes for 4 whole-node pods: the single takes one, the gang cannot start"
    )
