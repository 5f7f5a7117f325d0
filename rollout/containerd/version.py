"""containerd releases and config versions: what each one means for merging and for CRI.

A containerd release decides how imported files merge (MergeMode); a config file's own
`version` key decides where CRI settings live (CRI plugin ids per config version).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rollout.containerd.errors import UnsupportedVersion, VersionUnknown
from rollout.inputs.wholenumber import whole_number

CRI_V2 = "io.containerd.grpc.v1.cri"
CRI_RUNTIME = "io.containerd.cri.v1.runtime"
CRI_IMAGES = "io.containerd.cri.v1.images"
# config version -> the CRI plugin that holds the runtime handlers (version 3 splits CRI)
RUNTIME_PLUGIN = {2: CRI_V2, 3: CRI_RUNTIME}
RUNTIME_PLUGIN_IDS = tuple(RUNTIME_PLUGIN.values())

# "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3" (Debian),
# "containerd github.com/containerd/containerd/v2 2.1.9+unknown " (Debian sid),
# "containerd containerd.io 1.7.27 05044ec0a9a7..." (upstream/Docker packages), "v1.7.2".
_VERSION_RE = re.compile(r"(?:^|\s)v?(\d+)\.(\d+)\.(\d+)(?=[~+\-\s]|$)")


class MergeMode(Enum):
    """How a later file's `[plugins."X"]` table combines with the earlier ones."""

    REPLACE_PLUGIN_TABLES = "replace"  # 1.x: the whole table X of the later file wins
    DEEP_MERGE = "deep-merge"  # 2.x: keys of the later file win, the rest survive


@dataclass(frozen=True)
class ContainerdVersion:
    """A containerd release as `containerd --version` reports it."""

    major: int
    minor: int
    patch: int
    raw: str = ""

    @property
    def series(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def merge_mode(self) -> MergeMode:
        # The replace loop in mergeConfig was removed in v2.0.0 ("Allow sections of Plugins
        # to be merged"); measured: 1.6.20 and 1.7.24 replace, 2.1.9 deep-merges.
        return MergeMode.REPLACE_PLUGIN_TABLES if self.major < 2 else MergeMode.DEEP_MERGE

    @property
    def max_config_version(self) -> int:
        return dump_config_version(self.major)

    @classmethod
    def from_output(cls, text: str) -> ContainerdVersion:
        """Parse the output of `containerd --version`."""
        line = text.strip().splitlines()[0] if text.strip() else ""
        if "containerd" not in line:
            raise VersionUnknown(f"not containerd --version output: {text.strip()[:120]!r}")
        match = _VERSION_RE.search(line.split("containerd", 1)[1])
        if match is None:
            raise VersionUnknown(f"no version number in containerd --version output: {line!r}")
        major, minor, patch = (int(g) for g in match.groups())
        version = cls(major, minor, patch, raw=line)
        version.check_supported()
        return version

    @classmethod
    def from_series(cls, series: str) -> ContainerdVersion:
        """A version from "1.7" or "1.7.24", for tests and offline planning."""
        parts = series.split(".")
        read = [whole_number(p) for p in parts]
        if not 2 <= len(parts) <= 3 or None in read:
            raise VersionUnknown(f"not a containerd version: {series!r}")
        numbers = [n for n in read if n is not None] + [0] * (3 - len(parts))
        version = cls(numbers[0], numbers[1], numbers[2], raw=series)
        version.check_supported()
        return version

    def check_supported(self) -> None:
        """Raise UnsupportedVersion for releases no measured model fits: the 1.x model (measured
        on 1.6 and 1.7) covers 1.6-1.7, the 2.x model (measured on 2.1) covers 2.x."""
        if (self.major, self.minor) < (1, 6) or self.major > 2:
            raise UnsupportedVersion(
                f"containerd {self.major}.{self.minor}.{self.patch} is not supported: rollout "
                "models the config merge of 1.6-1.7 and 2.x only (measured on 1.6, 1.7 and 2.1)"
            )

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


def dump_config_version(major: int) -> int:
    """The config version a containerd release writes (`config dump`) and reads at most:
    2 on 1.x, 3 on 2.x."""
    return 2 if major < 2 else 3


def runtime_plugin_of(major: int) -> str:
    """The CRI plugin that holds the runtime handlers in a release's own dump."""
    return RUNTIME_PLUGIN[dump_config_version(major)]


def parse_version(text: str) -> ContainerdVersion:
    """Parse `containerd --version` output into a ContainerdVersion."""
    return ContainerdVersion.from_output(text)


def read_config_version(doc: Mapping[str, Any], where: str = "config") -> int:
    """The config's own `version` key: 2 or 3; absent (or 0) means 1, as containerd reads it."""
    value = doc.get("version", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise VersionUnknown(f"{where}: `version` must be an integer, got {value!r}", path=where)
    if value == 0:
        return 1
    if value not in (1, 2, 3):
        raise VersionUnknown(
            f"{where}: unknown config version {value} (known: 1, 2, 3)", path=where
        )
    return value


def cri_plugin_ids(config_version: int) -> tuple[str, ...]:
    """The CRI plugin ids that hold CRI settings in a config of this version."""
    if config_version == 2:
        return (CRI_V2,)
    if config_version == 3:
        return (CRI_RUNTIME, CRI_IMAGES, CRI_V2)
    raise UnsupportedVersion(
        f"config version {config_version} is not supported: migrate it with "
        "`containerd config migrate` (version 1 uses short plugin names)"
    )
