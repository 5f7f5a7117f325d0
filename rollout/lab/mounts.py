"""The host's mount table (/proc/mounts), as the lab's node, image and cluster code read it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MOUNT_TABLE = Path("/proc/mounts")
# The kernel writes space, tab, newline and backslash in a field as a three-digit octal escape.
_ESCAPE = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of the mount table, its fields unescaped."""

    point: Path
    fstype: str
    options: tuple[str, ...]

    @classmethod
    def from_line(cls, line: str) -> Mount | None:
        """The mount a table line describes; None for a line too short to be one."""
        fields = [_unescape(field) for field in line.split()]
        if len(fields) < 4:
            return None
        return cls(point=Path(fields[1]), fstype=fields[2], options=tuple(fields[3].split(",")))


def read_mounts() -> list[Mount]:
    """The host's mounts, in the order they were mounted."""
    lines = MOUNT_TABLE.read_text().splitlines()
    return [mount for mount in map(Mount.from_line, lines) if mount is not None]


def is_mounted(path: Path) -> bool:
    """Whether something is mounted at `path` (resolved when it exists)."""
    target = path.resolve() if path.exists() else path
    return any(mount.point == target for mount in read_mounts())


def mount_points_below(directory: Path) -> list[Path]:
    """The mount points strictly below `directory` (resolved), in the order they were mounted."""
    top = directory.resolve()
    return [mount.point for mount in read_mounts() if top in mount.point.parents]


def _unescape(field: str) -> str:
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)
