"""Which build this is: the commit a build came from, recorded in the package as build.json
when the build knows it (setup.py's build hooks from a checkout, the Containerfile from its
ROLLOUT_COMMIT), else read from git when rollout runs from a checkout.

setup.py loads this file by its path, before rollout is installed: it imports only the
standard library.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

BUILD_FILE = "build.json"
_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")


@dataclass(frozen=True)
class BuildCommit:
    """The commit a build came from; `dirty` when its checkout had uncommitted changes
    (None: not known)."""

    commit: str
    dirty: bool | None = None

    def to_json(self) -> dict[str, str | bool]:
        return {"commit": self.commit} | ({} if self.dirty is None else {"dirty": self.dirty})


def read_build_file(path: Path) -> BuildCommit | None:
    """The commit a build recorded; None when there is no such file or it names no commit."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    commit = data.get("commit") if isinstance(data, dict) else None
    if not isinstance(commit, str) or not _COMMIT.match(commit):
        return None
    dirty = data.get("dirty")
    return BuildCommit(commit, dirty if isinstance(dirty, bool) else None)


def read_git_commit(checkout: Path) -> BuildCommit | None:
    """HEAD and whether the work tree differs, when `checkout` is a git checkout."""
    if not (checkout / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(checkout), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        status = subprocess.run(
            ["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = head.stdout.strip()
    if head.returncode != 0 or not _COMMIT.match(commit):
        return None
    return BuildCommit(commit, bool(status.stdout.strip()) if status.returncode == 0 else None)


def record_build(package: Path, built: Path) -> Path | None:
    """Write build.json into `built` (the package as a build lays it out) naming the commit of
    the checkout `package` lies in; None, and nothing written, when `package` already
    carries a build.json (the build copies that one) or is not in a git checkout."""
    if read_build_file(package / BUILD_FILE) is not None:
        return None
    found = read_git_commit(package.parent)
    if found is None:
        return None
    built.mkdir(parents=True, exist_ok=True)
    path = built / BUILD_FILE
    path.write_text(json.dumps(found.to_json()) + "\n")
    return path
