"""The driver fact: whether `nvidia-smi` talks to the loaded driver, and what it said.

`nvidia-smi -L` prints one `GPU n: ... (UUID: GPU-...)` line per GPU; after a package upgrade
with the old module still loaded it prints `Failed to initialize NVML: Driver/library version
mismatch` and exits non-zero. The command always succeeds: the exit code is in its output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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


@dataclass(frozen=True)
class DriverStatusFact:
    """`nvidia-smi -L` with its exit code -> DriverStatus."""

    optional: bool = True

    @property
    def what(self) -> str:
        return "run nvidia-smi -L"

    def command(self) -> list[str]:
        return ["sh", "-c", 'nvidia-smi -L 2>&1; echo "rollout-exit=$?"']

    def parse(self, text: str, host: str) -> DriverStatus:
        return parse_driver_status(text)


def parse_driver_status(text: str) -> DriverStatus:
    """The fact's output (nvidia-smi's lines, then `rollout-exit=N`) -> DriverStatus."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    exit_code = 127
    if lines and (match := _EXIT.match(lines[-1].strip())):
        exit_code = int(match[1])
        lines.pop()
    uuids = tuple(m[1] for line in lines if (m := _UUID.search(line)) and "MIG-" not in line)
    return DriverStatus(exit_code, uuids, tuple(lines[-MAX_OUTPUT_LINES:]))
