"""The kernel-log fact: the NVIDIA driver's Xid lines, as `journalctl -k` or `dmesg` prints them.

Both are read (a container's journal may hold no kernel messages while `dmesg` does, and the
reverse), and a line printed by both counts once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollout.fact import ShellFact

# `NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.`
_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+)(?:,\s*(?P<rest>.*))?$")
MAX_XID_LINES = 200

# NVIDIA's Xid catalog (FACTS.md): what the Xid means and the immediate action.
XID_MEANINGS: dict[int, str] = {
    48: "ECC double-bit error (follow the ECC workflow)",
    63: "row remap event (ignore)",
    64: "row remap failure (reset the GPU)",
    74: "NVLink error (follow the NVLink workflow)",
    79: "GPU has fallen off the bus (restart the node)",
    92: "excessive single-bit ECC errors (ignore)",
    94: "contained ECC error (restart the application)",
    95: "uncontained ECC error (reset the GPU)",
    119: "GSP error (reset the GPU)",
    120: "GSP error (reset the GPU)",
}
# Xids the device plugin ignores: they never mark a GPU unhealthy.
XIDS_IGNORED_BY_PLUGIN = frozenset({13, 31, 43, 45, 68, 109})


@dataclass(frozen=True)
class XidEvent:
    """One Xid line of the kernel log."""

    xid: int
    pci: str
    line: str

    @property
    def meaning(self) -> str:
        return XID_MEANINGS.get(self.xid, "not in rollout's Xid table (see NVIDIA's Xid catalog)")


# k8s-device-plugin: `XidCriticalError: Xid=79 on Device=GPU-..., marking device as unhealthy.`
_PLUGIN_XID = re.compile(r"XidCriticalError: Xid=(?P<xid>\d+) on Device=(?P<device>[^,;\s]+)")


def parse_plugin_xids(text: str) -> tuple[XidEvent, ...]:
    """The device plugin's log -> the Xids it marked a device unhealthy for, once each."""
    seen: set[str] = set()
    events = []
    for raw in text.splitlines():
        match = _PLUGIN_XID.search(raw)
        if match and (line := raw.strip()) not in seen:
            seen.add(line)
            events.append(XidEvent(int(match["xid"]), match["device"], line))
    return tuple(events[-MAX_XID_LINES:])


def parse_xids(text: str) -> tuple[XidEvent, ...]:
    """Kernel-log text -> its Xid lines, once each, in order (the last MAX_XID_LINES)."""
    seen: set[str] = set()
    events: list[XidEvent] = []
    for raw in text.splitlines():
        match = _XID.search(raw)
        if not match:
            continue
        line = raw[match.start() :].strip()
        if line in seen:
            continue
        seen.add(line)
        events.append(XidEvent(int(match["xid"]), match["pci"], line))
    return tuple(events[-MAX_XID_LINES:])


class KernelXidFact(ShellFact[tuple[XidEvent, ...]]):
    """`journalctl -k` and `dmesg` -> the Xid lines; optional (no log reader: no Xids known)."""

    optional = True
    sentence = "read the kernel log"
    script = "journalctl -k --no-pager -q -o short-iso 2>/dev/null; dmesg 2>/dev/null; true"
    parser = staticmethod(parse_xids)
