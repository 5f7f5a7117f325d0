"""The GPU fact: the node's physical GPUs, as `nvidia-smi --query-gpu` reports them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollout.fact import CommandFact

_GPU_LINE = re.compile(
    r"^\s*(?P<uuid>GPU-[0-9a-fA-F-]+)\s*,\s*(?P<name>[^,]+?)\s*,\s*(?P<driver>[^,\s]+)\s*$"
)


@dataclass(frozen=True)
class GpuFacts:
    """The node's physical GPUs, as nvidia-smi reports them."""

    count: int
    product: str = ""
    uuids: tuple[str, ...] = ()
    driver_version: str = ""


def parse_gpu_query(text: str) -> GpuFacts:
    """`nvidia-smi --query-gpu=uuid,name,driver_version --format=csv,noheader` -> GpuFacts."""
    rows = [m for m in (_GPU_LINE.match(line) for line in text.splitlines()) if m]
    return GpuFacts(
        count=len(rows),
        product=rows[0]["name"] if rows else "",
        uuids=tuple(m["uuid"] for m in rows),
        driver_version=rows[0]["driver"] if rows else "",
    )


class GpuQueryFact(CommandFact[GpuFacts]):
    """`nvidia-smi --query-gpu=uuid,name,driver_version` -> GpuFacts.

    Optional: a node without nvidia-smi (or without a loaded driver) has no GPUs to report.
    """

    optional = True
    sentence = "query the GPUs"
    argv = ("nvidia-smi", "--query-gpu=uuid,name,driver_version", "--format=csv,noheader")
    parser = staticmethod(parse_gpu_query)


def parse_gpu_device_ids(text: str) -> tuple[str, ...]:
    """`nvidia-smi --query-gpu=index,pci.device_id --format=csv,noheader` -> each GPU's PCI
    device id (`0x20B010DE`), in index order."""
    rows = (line.split(",") for line in text.splitlines())
    found = sorted(
        (int(r[0]), r[1].strip()) for r in rows if len(r) == 2 and r[0].strip().isdigit()
    )
    return tuple(device_id for _, device_id in found)


class GpuDeviceIdsFact(CommandFact[tuple[str, ...]]):
    """Each GPU's PCI device id, by index (MIG layouts select GPU models by it).

    Optional: a node without nvidia-smi has no GPUs to report.
    """

    optional = True
    sentence = "query the GPUs' PCI device ids"
    argv = ("nvidia-smi", "--query-gpu=index,pci.device_id", "--format=csv,noheader")
    parser = staticmethod(parse_gpu_device_ids)
