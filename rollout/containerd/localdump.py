"""containerd's defaults from the real binary on this machine: `config dump` of staged files.

When scripts/fetch-containerd has cached the binary of a node's series, offline planning asks
that binary what it loads from the node's files (staged, as on the node: see staging.py), so
built-in defaults, migrations and map rules are containerd's own. Dumps are cached by content:
a fleet of nodes with the same files costs one dump, and so does asking twice; the standard
source also keeps them on disk between runs (rollout.memo.DiskMemo: under the cache's
`dumps/`, another directory in $ROLLOUT_DUMP_CACHE, none when it says `off`), keyed by the
binary's digest, the files and this code's own source; never files that hold a credential.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rollout.commands import CommandFailed, CommandRunner, check
from rollout.containerd import dump, staging
from rollout.containerd.binaries import BinariesMissing, cache_dir, find_containerd
from rollout.containerd.defaults import (
    Defaults,
    DefaultsSource,
    LoadedConfig,
    RecordedDefaults,
    probe_files,
    runtime_entry_of,
)
from rollout.containerd.errors import ConfigRejected
from rollout.containerd.files import ConfigFiles
from rollout.containerd.staging import dump_configs
from rollout.containerd.version import ContainerdVersion
from rollout.memo import BoundedCache, DiskMemo, source_digest
from rollout.secrets import redact_toml
from rollout.transports.local import LocalRunner

CACHE_ENTRIES = 512
DUMP_CACHE_ENV = "ROLLOUT_DUMP_CACHE"

_Key = tuple[str, str, tuple[tuple[str, str], ...]]


class LocalContainerd:
    """The real `config dump` of the series' cached binary; another source where it is not."""

    def __init__(
        self,
        runner: CommandRunner | None = None,
        locate: Callable[[str], Path] = find_containerd,
        fallback: DefaultsSource | None = None,
        store: Callable[[], DiskMemo | None] | None = None,
    ) -> None:
        self._runner: CommandRunner = runner if runner is not None else LocalRunner()
        self._locate = locate
        self._fallback: DefaultsSource = fallback if fallback is not None else RecordedDefaults()
        self._dumps: BoundedCache[_Key, dict[str, Any]] = BoundedCache(CACHE_ENTRIES)
        self._labels: dict[str, str] = {}
        self._lock = threading.Lock()
        self.dumps_run = 0  # how many real dumps this source ran (the caches' misses)
        self._store = functools.cache(store) if store is not None else None

    def load(
        self, files: ConfigFiles, version: ContainerdVersion, configured: Mapping[str, Any]
    ) -> LoadedConfig:
        try:
            binary = str(self._locate(version.series))
        except BinariesMissing:
            return self._fallback.load(files, version, configured)
        return LoadedConfig(self._dump(binary, files), self._label(binary))

    def _dump(self, binary: str, files: ConfigFiles) -> dict[str, Any]:
        key: _Key = (binary, files.main_path, tuple(files.files.items()))
        return self._dumps.get_or_compute(key, lambda: self._kept(binary, files))

    def _kept(self, binary: str, files: ConfigFiles) -> dict[str, Any]:
        """The dump kept on disk by a run before, else run now (and kept)."""
        store = self._store() if self._store is not None else None
        if store is None or _holds_secret(files):  # no credential is kept on disk
            return self._run_dump(binary, files)
        key = [
            "containerd config dump",
            _code_digest(),
            store.file_digest(binary),
            files.main_path,
            sorted(files.files.items()),
        ]
        tree: dict[str, Any] = store.get_or_compute(key, lambda: self._run_dump(binary, files))
        return tree

    def _run_dump(self, binary: str, files: ConfigFiles) -> dict[str, Any]:
        try:
            tree = dump_configs(self._runner, binary, [files])[0]
        except CommandFailed as exc:
            # the node's files, not rollout, are at fault: say so in containerd's own words
            # (its last line), without the staging paths of this machine
            said = exc.result.tail().strip().splitlines()[-1:] or ["(no message)"]
            words = said[0].lstrip("| ").strip()
            raise ConfigRejected(
                f"{files.main_path}: {self._label(binary)} refuses to load these files: {words}",
                path=files.main_path,
            ) from exc
        with self._lock:
            self.dumps_run += 1
        return tree

    def _label(self, binary: str) -> str:
        with self._lock:
            if binary in self._labels:
                return self._labels[binary]

        def read() -> str:
            return f"containerd {binary_version(self._runner, binary)}'s own config dump"

        store = self._store() if self._store is not None else None
        if store is None:
            label = read()
        else:
            key = ["containerd --version", _code_digest(), store.file_digest(binary)]
            label = str(store.get_or_compute(key, read))
        with self._lock:
            self._labels[binary] = label
        return label


def _holds_secret(files: ConfigFiles) -> bool:
    return any(redact_toml(text) != text for text in files.files.values())


@functools.cache
def _code_digest() -> str:
    """The source of what makes a kept dump: running and staging it, parsing, normalising."""
    return source_digest(sys.modules[__name__], staging, dump)


def dump_store() -> DiskMemo | None:
    """The disk memo $ROLLOUT_DUMP_CACHE names: unset, `dumps/` in the cache; `off`, none."""
    return DiskMemo.from_setting(os.environ.get(DUMP_CACHE_ENV), lambda: cache_dir() / "dumps")


def binary_version(runner: CommandRunner, binary: str) -> ContainerdVersion:
    """The version a containerd binary reports."""
    result = check(runner.run([binary, "--version"]), f"read the version of {binary}")
    return ContainerdVersion.from_output(result.stdout)


def record_defaults(binary: str, runner: CommandRunner | None = None) -> Defaults:
    """The defaults of a real binary: what rollout/containerd/data/ records for its series."""
    run = runner if runner is not None else LocalRunner()
    series = binary_version(run, binary).series
    empty, handler = dump_configs(run, binary, list(probe_files(series)))
    return Defaults(series, empty, runtime_entry_of(handler, series))


_STANDARD = LocalContainerd(store=dump_store)


def standard_defaults() -> DefaultsSource:
    """The process-wide source: the cached real binary, else the recorded defaults."""
    return _STANDARD
