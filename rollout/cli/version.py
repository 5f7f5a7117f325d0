"""`rollout version`: which build this is: the version, the commit it was built from (when the
build recorded it, or the checkout it runs from tells), and the Python running it."""

from __future__ import annotations

import argparse
import json
import platform
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from rollout import __version__
from rollout.cli import add_listed_command
from rollout.errors import ExitCode

# Written by the Containerfile (ARG ROLLOUT_COMMIT) before the package is built, so the image
# knows its commit without git; a checkout has none and asks git instead.
BUILD_FILE = "build.json"
_COMMIT = re.compile(r"^[0-9a-f]{7,64}$")

HELP = """\
Print rollout's version. With --output json: the version, the commit the build came from
(null when unknown), whether the checkout had uncommitted changes, and the Python version and
implementation running it; the image built from the Containerfile records its commit.
"""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = add_listed_command(subparsers, "version", HELP)
    parser.add_argument(
        "--output", "-o", choices=("text", "json"), default="text", help="text (default) or json"
    )
    parser.set_defaults(func=run_version)


def run_version(args: argparse.Namespace) -> int:
    info = build_info()
    if args.output == "json":
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
    else:
        commit = info["commit"] or "unknown commit"
        print(f"rollout {info['version']} ({commit}), Python {info['python']['version']}")
    return ExitCode.OK


def build_info(package_dir: Path | None = None) -> dict[str, Any]:
    """The build's description; `package_dir` is rollout's directory (tests point it
    elsewhere)."""
    directory = package_dir or Path(str(resources.files("rollout")))
    recorded = read_build_file(directory / BUILD_FILE)
    commit = recorded.get("commit")
    source: str | None = "build"
    dirty: bool | None = None
    if commit is None:
        commit, dirty = read_git_commit(directory.parent)
        source = "git" if commit else None
    return {
        "version": __version__,
        "commit": commit,
        "commit_source": source,
        "dirty": dirty,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "platform": f"{sys.platform}-{platform.machine()}",
    }


def read_build_file(path: Path) -> dict[str, str]:
    """The commit a build recorded; {} when there is no such file or it names no commit."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    commit = data.get("commit") if isinstance(data, dict) else None
    return {"commit": commit} if isinstance(commit, str) and _COMMIT.match(commit) else {}


def read_git_commit(checkout: Path) -> tuple[str | None, bool | None]:
    """HEAD and whether the work tree differs, when rollout runs from a git checkout."""
    if not (checkout / ".git").exists():
        return None, None
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
        return None, None
    commit = head.stdout.strip()
    if head.returncode != 0 or not _COMMIT.match(commit):
        return None, None
    return commit, bool(status.stdout.strip()) if status.returncode == 0 else None
