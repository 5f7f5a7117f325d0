"""The GPU fact: the node's physical GPUs, as `nvidia-smi --query-gpu` reports them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollout.fact import CommandFact

_GPU_LINE = re.compile(
    r"^\s*(?P<uuid>GPU-[0-9a-fA-F-]+)\s*,\s*(?P<name>[^,]+?)\s*,\s*(?P<driver>[^,\s]+)"
    r"(?:\s*,\s*(?P<device>[^,\s]+))?\s*$"
)


@dataclass(frozen=True)
class GpuFacts:
    """The node's physical GPUs, as nvidia-smi reports them."""

    count: int
    product: str = ""
    uuids: tuple[str, ...] = ()
    driver_version: str = ""
    # each GPU's PCI device id (`0x20B010DE`), in nvidia-smi's order (its index); None where
    # they were not read (facts recorded without them). MIG layouts select GPU models by it.
    device_ids: tuple[str, ...] | None = None


def parse_gpu_query(text: str) -> GpuFacts:
    """`nvidia-smi --query-gpu=uuid,name,driver_version,pci.device_id --format=csv,noheader`
    -> GpuFacts (without the last column: no device ids)."""
    rows = [m for m in (_GPU_LINE.match(line) for line in text.splitlines()) if m]
    ids = tuple(m["device"] for m in rows if m["device"])
    return GpuFacts(
        count=len(rows),
        product=rows[0]["name"] if rows else "",
        uuids=tuple(m["uuid"] for m in rows),
        driver_version=rows[0]["driver"] if rows else "",
        device_ids=ids if rows and len(ids) == len(rows) else None,
    )


class GpuQueryFact(CommandFact[GpuFacts]):
    """`nvidia-smi --query-gpu=uuid,name,driver_version,pci.device_id` -> GpuFacts.

    Optional: a node without nvidia-smi (or without a loaded driver) has no GPUs to report.
    """

    optional = True
    sentence = "query the GPUs"
    argv = (
        "nvidia-smi",
        "--query-gpu=uuid,name,driver_version,pci.device_id",
        "--format=csv,noheader",
    )
    parser = staticmethod(parse_gpu_query)
