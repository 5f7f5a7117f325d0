"""`rollout version`: which build this is: the version, the commit it was built from (when the
build recorded it, or the checkout it runs from tells), and the Python running it."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from rollout import __version__
from rollout.cli import add_listed_command
from rollout.errors import ExitCode
from rollout.version import BUILD_FILE, read_build_file, read_git_commit

HELP = """\
Print rollout's version and the commit it was built from: a wheel or sdist built from a git
checkout records it, the image built from the Containerfile records it (ROLLOUT_COMMIT), and
a checkout asks git. With --output json: the version, the commit (null when unknown), where
it came from (build or git), whether the checkout had uncommitted changes, and the Python
version and implementation running it.
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
        changes = ", with uncommitted changes" if info["dirty"] else ""
        print(f"rollout {info['version']} ({commit}{changes}), Python {info['python']['version']}")
    return ExitCode.OK


def build_info(package_dir: Path | None = None) -> dict[str, Any]:
    """The build's description; `package_dir` is rollout's directory (tests point it
    elsewhere)."""
    directory = package_dir or Path(str(resources.files("rollout")))
    found = read_build_file(directory / BUILD_FILE)
    source = "build"
    if found is None:
        found, source = read_git_commit(directory.parent), "git"
    return {
        "version": __version__,
        "commit": found.commit if found else None,
        "commit_source": source if found else None,
        "dirty": found.dirty if found else None,
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "platform": f"{sys.platform}-{platform.machine()}",
    }
