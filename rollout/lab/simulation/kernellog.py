"""The node's kernel-log stand-in: Xid lines the simulated device plugin acts on.

A lab node has no GPU and no NVRM messages; `rollout lab break unhealthy-device` appends a
real-format Xid line to /var/log/rollout-lab/kern.log on the node, which the node's `dmesg`
stand-in prints. The device plugin marks the GPU on that PCI bus unhealthy, except for the
Xids it ignores (FACTS.md).
"""

from __future__ import annotations

import re
from pathlib import Path

# Relative to the node's root filesystem.
KERNEL_LOG_PATH = Path("var/log/rollout-lab/kern.log")
# k8s-device-plugin's default skipped Xids: application errors, not the GPU's.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})\): (\d+)")


def bus_of_gpu(index: int) -> str:
    """The PCI bus the stand-in nvidia-smi reports for GPU `index` (domain:bus:device)."""
    return "0000:%02X:00" % (7 + 8 * index)


def parse_critical_xids(text: str, gpu_indices: list[int]) -> dict[int, int]:
    """GPU index -> the first critical Xid logged for it."""
    by_bus = {bus_of_gpu(i): i for i in gpu_indices}
    found: dict[int, int] = {}
    for match in _XID_LINE.finditer(text):
        index = by_bus.get(match.group(1).upper())
        xid = int(match.group(2))
        if index is not None and xid not in IGNORED_XIDS:
            found.setdefault(index, xid)
    return found


def read_critical_xids(root: Path | None, gpu_indices: list[int]) -> dict[int, int]:
    """Critical Xids in a node's kernel-log stand-in; none when it has no root or no log."""
    if root is None:
        return {}
    try:
        text = (root / KERNEL_LOG_PATH).read_text(errors="replace")
    except OSError:
        return {}
    return parse_critical_xids(text, gpu_indices)
