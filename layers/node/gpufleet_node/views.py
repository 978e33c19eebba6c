"""What the Prometheus endpoint shows: the publisher's latest sample of each GPU and who holds it.

Read on the endpoint's own thread at scrape time; nothing here calls NVML (the sampling loop already
did), so a scrape never slows sampling down. Python >= 3.9.
"""

from typing import Any, List, Sequence

from gpufleet_node.prometheus import GpuView


def gpu_views(publisher: Any, infos: Sequence[Any]) -> List[GpuView]:
    """One view per GPU sampled so far; `infos`: each GPU's UUID and model name (nvml.GpuInfo)."""
    usage = publisher.usage
    views = []
    for index, sample in sorted(dict(publisher.latest).items()):
        info = infos[index] if index < len(infos) else None
        holders = usage.current.get(index) if usage is not None else None
        views.append(
            GpuView(
                index,
                info.uuid if info else "unknown",
                info.name if info else "unknown",
                sample,
                publisher.last_xid.get(index, 0),
                holders=holders,
            )
        )
    return views
