"""The one way rollout runs `containerd config dump`, and the pure parser of its output.

containerd 1.6 resolves a relative import glob against the process's working directory (`/`
under systemd), so a dump run from anywhere else can read files the daemon never reads, or
miss the ones it does. Every dump therefore runs from `/` (or, for staged files, from the
directory that stands in for `/`) with `--config` naming the main config.
"""

from __future__ import annotations

import tomllib
from typing import Any

from rollout.containerd.errors import StagingFailed

# Positional parameters keep every path out of the shell's parsing: $1 the working directory,
# $2 the binary, $3 the main config.
_DUMP_SCRIPT = 'cd "$1" && exec "$2" --config "$3" config dump'


def dump_command(containerd_bin: str, config_path: str, *, workdir: str = "/") -> list[str]:
    """The argv of `containerd --config <config_path> config dump`, run from `workdir` (`/`).

    Staging passes the staged root as `workdir`: it stands in for `/` on the node.
    """
    return ["sh", "-c", _DUMP_SCRIPT, "rollout-dump", workdir, containerd_bin, config_path]


def parse_dump(text: str, host: str) -> dict[str, Any]:
    """The tree of a `config dump` output; StagingFailed naming `host` when it is not TOML."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StagingFailed(
            f"`containerd config dump` on {host} printed invalid TOML: {exc}"
        ) from exc
