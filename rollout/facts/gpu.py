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
