"""Where the real containerd binaries fetched by scripts/fetch-containerd live."""

from __future__ import annotations

import os
from pathlib import Path

from rollout.errors import RolloutError

FETCH_COMMAND = "scripts/fetch-containerd"


class BinariesMissing(RolloutError):
    """A containerd binary of a wanted series is not in the cache."""


def cache_dir() -> Path:
    """The cache shared with scripts/fetch-containerd (ROLLOUT_CACHE, else XDG cache)."""
    root = os.environ.get("ROLLOUT_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "rollout"


def find_containerd(series: str) -> Path:
    """The containerd binary of one series ("1.6", "1.7", "2.1"), or BinariesMissing."""
    path = cache_dir() / "containerd" / series / "usr" / "bin" / "containerd"
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise BinariesMissing(
            f"containerd {series} not found at {path}; run {FETCH_COMMAND} to fetch it"
        )
    return path


def find_deb(series: str) -> Path:
    """The Debian package file of one series, for installing into lab nodes."""
    debs = cache_dir() / "containerd" / "debs"
    prefix = {"1.6": "containerd_1.6.", "1.7": "containerd_1.7.", "2.1": "containerd_2.1."}.get(
        series
    )
    if prefix is None:
        raise BinariesMissing(f"unknown containerd series {series!r}; known: 1.6, 1.7, 2.1")
    found = sorted(debs.glob(prefix + "*.deb")) if debs.is_dir() else []
    if not found:
        raise BinariesMissing(f"no {prefix}*.deb in {debs}; run {FETCH_COMMAND} to fetch it")
    return found[-1]
