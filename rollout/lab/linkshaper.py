"""A slow link to one lab node: its traffic on the host's loopback throttled with tc.

The nodes share the host's network namespace and each listens on a loopback address of its
own, so "the link to a node" is the loopback traffic to and from that address. Slowing it
hangs an HTB qdisc at the root of `lo` (HTB sends traffic no filter classifies through its
direct queue, unshaped, so every other loopback user is untouched) and adds, per slowed node,
a class at the given rate with two u32 filters: packets to the node and packets from it.
Restoring the node removes its filters and class, and the last restored node removes the qdisc.

Labs running side by side share the one qdisc: a node's class and filter priority come from
its address, so they never collide, and each step tolerates the other lab having done it.
Only HTB and u32 are needed; the kernels this lab runs on carry them (netem is often absent).
"""

from __future__ import annotations

import ipaddress
import logging
import subprocess
from collections.abc import Sequence

from rollout.errors import RolloutError

log = logging.getLogger("rollout.lab.linkshaper")

DEVICE = "lo"
ROOT = "1:"


class ShapingFailed(RolloutError):
    """tc refused to slow or restore a node's link."""


def _tc(*words: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["tc", *words], capture_output=True, text=True, timeout=10, check=False)
    if check and result.returncode != 0:
        raise ShapingFailed(f"tc {' '.join(words)}: {result.stderr.strip() or result.returncode}")
    return result


def slot(address: str) -> int:
    """The node's HTB class minor and filter priority: its address's last 16 bits, never 0."""
    low = int(ipaddress.IPv4Address(address)) & 0xFFFF
    return low or 0xFFFF


def _has_root_qdisc() -> bool:
    shown = _tc("qdisc", "show", "dev", DEVICE).stdout
    return any(line.startswith(f"qdisc htb {ROOT} root") for line in shown.splitlines())


def _ensure_root_qdisc() -> None:
    if _has_root_qdisc():
        return
    added = _tc("qdisc", "add", "dev", DEVICE, "root", "handle", ROOT, "htb", check=False)
    if added.returncode != 0 and not _has_root_qdisc():  # not another lab winning the race
        raise ShapingFailed(f"cannot add an HTB qdisc to {DEVICE}: {added.stderr.strip()}")


def slow_down(address: str, rate_kbit: int) -> None:
    """Throttle all loopback traffic to and from `address` to `rate_kbit` kbit/s."""
    number = slot(address)
    classid = f"1:{number:x}"
    rate = f"{rate_kbit}kbit"
    words = ("class", "replace", "dev", DEVICE, "parent", ROOT, "classid", classid, "htb",
             "rate", rate, "ceil", rate)  # fmt: skip
    _ensure_root_qdisc()
    if _tc(*words, check=False).returncode != 0:  # another lab removed the qdisc just now
        _ensure_root_qdisc()
        _tc(*words)
    _tc("filter", "del", "dev", DEVICE, "parent", ROOT, "prio", str(number), check=False)
    for direction in ("dst", "src"):
        _tc("filter", "add", "dev", DEVICE, "parent", ROOT, "protocol", "ip", "prio",
            str(number), "u32", "match", "ip", direction, f"{address}/32",
            "flowid", classid)  # fmt: skip


def restore(address: str) -> None:
    """Give `address` its full speed back; remove the qdisc when no node is slowed any more."""
    number = slot(address)
    _tc("filter", "del", "dev", DEVICE, "parent", ROOT, "prio", str(number), check=False)
    removed = _tc("class", "del", "dev", DEVICE, "classid", f"1:{number:x}", check=False)
    if removed.returncode != 0 and slowed([address]):
        # the node stays slow: say so where the lab's control plane logs
        log.warning("%s: link not restored: %s", address, removed.stderr.strip())
    if _has_root_qdisc() and not _tc("class", "show", "dev", DEVICE).stdout.strip():
        _tc("qdisc", "del", "dev", DEVICE, "root", "handle", ROOT, check=False)


def slowed(addresses: Sequence[str]) -> list[str]:
    """Those of `addresses` whose link is slowed now (their class exists)."""
    shown = _tc("class", "show", "dev", DEVICE).stdout
    classes = {line.split()[2] for line in shown.splitlines() if line.startswith("class htb")}
    return [a for a in addresses if f"1:{slot(a):x}" in classes]
