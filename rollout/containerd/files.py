"""The set of containerd config files of one node, as recorded: the input of every model."""

from __future__ import annotations

import posixpath
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from rollout.containerd.errors import ConfigParseError
from rollout.errors import BadInput
from rollout.memo import BoundedCache

# Where containerd keeps its configuration, and the main config it loads without --config
CONTAINERD_DIR = "/etc/containerd"
DEFAULT_MAIN_PATH = f"{CONTAINERD_DIR}/config.toml"
# tomllib ends its messages with "(at line 3, column 7)"
_TOML_POSITION = re.compile(r"\(at line (\d+), column (\d+)\)")


@dataclass(frozen=True)
class ConfigFiles:
    """The main config path and every file it may import: absolute path -> TOML text."""

    main_path: str
    files: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for path in (self.main_path, *self.files):
            if not path.startswith("/") or posixpath.normpath(path) != path:
                raise BadInput(f"config file paths must be absolute and normalised: {path!r}")
        if self.main_path not in self.files:
            raise BadInput(f"the main config {self.main_path} is not among the recorded files")
        # A read-only copy: a ConfigFiles is a value, shared between plan and prediction.
        object.__setattr__(self, "files", MappingProxyType(dict(sorted(self.files.items()))))

    @classmethod
    def from_directory(
        cls, local_root: Path, main_path: str = DEFAULT_MAIN_PATH, under: str = CONTAINERD_DIR
    ) -> ConfigFiles:
        """Read every file below `local_root` as if `local_root` were `under` on the node."""
        files: dict[str, str] = {}
        for local in sorted(local_root.rglob("*")):
            if local.is_file():
                rel = local.relative_to(local_root).as_posix()
                files[posixpath.join(under, rel)] = local.read_text(encoding="utf-8")
        return cls(main_path=main_path, files=files)

    def with_file(self, path: str, text: str) -> ConfigFiles:
        """A copy with one file added or replaced."""
        return ConfigFiles(self.main_path, {**self.files, path: text})

    def without_file(self, path: str) -> ConfigFiles:
        """A copy with one file removed (the main config cannot be removed)."""
        return ConfigFiles(self.main_path, {p: t for p, t in self.files.items() if p != path})

    def directories(self) -> frozenset[str]:
        """Every directory that holds a recorded file, up to /."""
        dirs: set[str] = set()
        for path in self.files:
            parent = posixpath.dirname(path)
            while parent not in dirs and parent != "/":
                dirs.add(parent)
                parent = posixpath.dirname(parent)
        return frozenset(dirs)


# Distinct file texts whose parse is kept: a fleet has a few distinct files, and the engine
# reads each file of a node several times (load order, merge, shadowing, synthesis).
PARSED_TEXTS = 1024
_parsed: BoundedCache[str, dict[str, Any]] = BoundedCache(PARSED_TEXTS)


def parse_toml(path: str, text: str) -> dict[str, Any]:
    """Parse one config file; a syntax error names the file and line (tomllib reports both).

    Parsed once per distinct text: the result is shared, and callers only read it (the merge
    model copies what it keeps). A syntax error is not kept, so it always names `path`.
    """
    return _parsed.get_or_compute(text, lambda: _parse_toml(path, text))


def _parse_toml(path: str, text: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        where = _TOML_POSITION.search(str(exc))
        line, column = (int(where[1]), int(where[2])) if where else (None, None)
        if where is None and "end of document" in str(exc):
            line = max(1, len(text.splitlines()))
        raise ConfigParseError(
            f"{path}: not valid TOML: {exc}", path=path, line=line, column=column
        ) from exc
