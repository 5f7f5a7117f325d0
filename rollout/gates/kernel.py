"""The Xid gate's reading: Xid lines of the kernel log logged since the node's change began.

"Since" is measured on the node's own monotonic clock, never against the workstation's: the
kernel stamps each line with seconds since boot (`dmesg`, `journalctl -k -o short-monotonic`),
and the change's start is the node's /proc/uptime read when the change began, with its boot
id. After a reboot (a new boot id) every line of the current boot is new; `journalctl -k` and
`dmesg` show only the current boot. A line without a timestamp counts as new: a gate that
cannot tell must not pass a node it knows logged an Xid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollout.facts.kernel import XIDS_IGNORED_BY_PLUGIN, XidEvent, parse_xids

# The boot id, the uptime, then the Xid lines of both readers (a line in both counts once).
BASELINE_SCRIPT = "cat /proc/sys/kernel/random/boot_id; cut -d' ' -f1 /proc/uptime"
XID_SCRIPT = (
    BASELINE_SCRIPT + "; { journalctl -k -o short-monotonic --no-pager -q 2>/dev/null; "
    "dmesg 2>/dev/null; } | grep -F 'NVRM: Xid' || true"
)
# Application errors the device plugin ignores, and the catalog's "ignore" events (63: a row
# remap event, 92: excessive single-bit errors, both corrected): none says the GPU is unwell.
IGNORED_XIDS = XIDS_IGNORED_BY_PLUGIN | {63, 92}
_STAMP = re.compile(r"^\[\s*(\d+(?:\.\d+)?)\]")


@dataclass(frozen=True)
class KernelClock:
    """Where the node's kernel clock stood: its boot and its seconds since boot."""

    boot_id: str
    uptime_s: float

    def to_data(self) -> dict[str, object]:
        return {"boot_id": self.boot_id, "uptime_s": self.uptime_s}

    @classmethod
    def from_data(cls, data: dict[str, object]) -> KernelClock | None:
        boot_id, uptime = data.get("boot_id"), data.get("uptime_s")
        if not isinstance(boot_id, str) or not isinstance(uptime, int | float):
            return None
        return cls(boot_id, float(uptime))


class KernelReadingError(ValueError):
    """The node's output did not start with a boot id and an uptime."""


def parse_clock(lines: list[str]) -> KernelClock:
    if len(lines) < 2:
        raise KernelReadingError("expected the boot id and /proc/uptime, found too few lines")
    try:
        return KernelClock(lines[0].strip(), float(lines[1].strip()))
    except ValueError as exc:
        raise KernelReadingError(f"unreadable /proc/uptime: {lines[1]!r}") from exc


@dataclass(frozen=True)
class XidReading:
    """The node's clock now, and its Xid lines that matter, each with its kernel timestamp."""

    clock: KernelClock
    xids: tuple[tuple[float | None, XidEvent], ...]

    def since(self, began: KernelClock | None) -> list[XidEvent]:
        """The Xids logged after `began` (every one when the node rebooted since, or when
        nothing recorded the start)."""
        if began is None or began.boot_id != self.clock.boot_id:
            return [event for _, event in self.xids]
        return [e for stamp, e in self.xids if stamp is None or stamp >= began.uptime_s]


def parse_xid_reading(text: str) -> XidReading:
    """XID_SCRIPT's output -> the clock and the Xid lines the gate does not ignore, once each."""
    lines = text.splitlines()
    clock = parse_clock(lines)
    seen: set[tuple[float | None, str]] = set()
    found: list[tuple[float | None, XidEvent]] = []
    for raw in lines[2:]:
        stamp_match = _STAMP.match(raw.strip())
        stamp = float(stamp_match.group(1)) if stamp_match else None
        for event in parse_xids(raw):
            if event.xid in IGNORED_XIDS or (stamp, event.line) in seen:
                continue
            seen.add((stamp, event.line))
            found.append((stamp, event))
    return XidReading(clock, tuple(found))
