"""The driver fact: whether `nvidia-smi` talks to the loaded driver, and what it said.

`nvidia-smi -L` prints one `GPU n: ... (UUID: GPU-...)` line per GPU; after a package upgrade
with the old module still loaded it prints `Failed to initialize NVML: Driver/library version
mismatch` and exits non-zero. The command always succeeds: the exit code is in its output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rollout.fact import ShellFact

_EXIT = re.compile(r"^rollout-exit=(\d+)$")
_UUID = re.compile(r"\b(GPU-[0-9a-fA-F-]+)")
MISMATCH = "Driver/library version mismatch"
MAX_OUTPUT_LINES = 20


@dataclass(frozen=True)
class DriverStatus:
    """What `nvidia-smi -L` said: its exit code, the GPU UUIDs, the last lines of output."""

    exit_code: int
    uuids: tuple[str, ...] = ()
    output: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def library_mismatch(self) -> bool:
        return any(MISMATCH in line for line in self.output)

    @property
    def missing(self) -> bool:
        """nvidia-smi is not installed (127) or the probe printed nothing at all."""
        return self.exit_code == 127


def split_exit_code(text: str) -> tuple[list[str], int]:
    """A script's output that ends `echo "rollout-exit=$?"` -> its non-blank lines before that,
    and the exit code (127 where the line is missing: the command did not run)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    if lines and (match := _EXIT.match(lines[-1].strip())):
        return lines[:-1], int(match[1])
    return lines, 127


def parse_driver_status(text: str) -> DriverStatus:
    """The fact's output (nvidia-smi's lines, then `rollout-exit=N`) -> DriverStatus."""
    lines, exit_code = split_exit_code(text)
    uuids = tuple(m[1] for line in lines if (m := _UUID.search(line)) and "MIG-" not in line)
    return DriverStatus(exit_code, uuids, tuple(lines[-MAX_OUTPUT_LINES:]))


class DriverStatusFact(ShellFact[DriverStatus]):
    """`nvidia-smi -L` with its exit code -> DriverStatus."""

    optional = True
    sentence = "run nvidia-smi -L"
    script = 'nvidia-smi -L 2>&1; echo "rollout-exit=$?"'
    parser = staticmethod(parse_driver_status)


_LOADED = re.compile(r"Kernel Module\s+(?:for \S+\s+)?(?P<version>\d+(?:\.\d+)+)")
_SEPARATOR = "---"


@dataclass(frozen=True)
class DriverKernel:
    """The running kernel, the nvidia module loaded now, and the one installed for the kernel.

    None where the node does not say (no /proc/driver/nvidia: no module loaded, or loaded from
    the GPU Operator's driver container, whose module the host's modinfo does not see).
    """

    kernel: str
    loaded: str | None = None
    installed: str | None = None

    @property
    def mismatch(self) -> bool:
        return (
            self.loaded is not None
            and self.installed is not None
            and (self.loaded != self.installed)
        )


def parse_driver_kernel(text: str) -> DriverKernel | None:
    """The fact's three sections -> DriverKernel; None when the output is not that."""
    parts: list[list[str]] = [[]]
    for line in text.splitlines():
        if line.strip() == _SEPARATOR:
            parts.append([])
        elif line.strip():
            parts[-1].append(line.strip())
    if len(parts) != 3 or not parts[0]:
        return None
    loaded = _LOADED.search("\n".join(parts[1]))
    installed = parts[2][0] if parts[2] else ""
    return DriverKernel(
        kernel=parts[0][0],
        loaded=loaded["version"] if loaded else None,
        installed=installed or None,
    )


class DriverKernelFact(ShellFact[DriverKernel | None]):
    """`uname -r`, /proc/driver/nvidia/version and `modinfo -F version nvidia` -> DriverKernel."""

    optional = True
    sentence = "read the kernel and nvidia module versions"
    script = (
        "uname -r; echo ---; cat /proc/driver/nvidia/version 2>/dev/null; echo ---; "
        "modinfo -F version nvidia 2>/dev/null; true"
    )
    parser = staticmethod(parse_driver_kernel)
