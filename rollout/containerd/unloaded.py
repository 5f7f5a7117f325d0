"""Settings that containerd does not load: which file, which keys, why on this version, what to do.

One answer for `plan`'s warnings and `diagnose`'s findings. A file's settings are not loaded when
- shadowed: a later file hides them (1.x: its whole plugin table replaces the earlier one;
  2.x: it overrides single keys), see shadowing.py;
- ignored for the version: containerd 2.x reads a version-2 CRI table but, once the last file
  that sets `version` says 3, does not migrate it (the merge model's `ignored_for_version`);
- not imported: no import of a loaded file matches the file on this version (1.6 resolves a
  relative glob against the process's working directory, `/` under systemd; 2.x stops loading
  at an import that does not exist), see merge.py's load order.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rollout.containerd.diff import format_path
from rollout.containerd.errors import ContainerdConfigError
from rollout.containerd.files import ConfigFiles, parse_toml
from rollout.containerd.merge import (
    PLUGINS,
    EffectiveConfig,
    find_value,
    iter_leaves,
    merge_files,
    resolve_import,
)
from rollout.containerd.migration import migrate_cri_tables, v3_plugin_of
from rollout.containerd.shadowing import Shadowing, ShadowKind, find_shadowing
from rollout.containerd.version import CRI_V2, ContainerdVersion

Path = tuple[str, ...]
_SHOWN = 8
# 1.7 and later resolve a relative glob against the importing file's directory
_ABSENT = object()
_IMPORTER_RELATIVE = ContainerdVersion(1, 7, 0, raw="imports relative to the importing file")


class UnloadedKind(Enum):
    SHADOWED = "shadowed"
    IGNORED_FOR_VERSION = "ignored-for-version"
    NOT_IMPORTED = "not-imported"


@dataclass(frozen=True)
class Unloaded:
    """Settings of one file that containerd does not load; `settings` are full key paths."""

    kind: UnloadedKind
    file: str
    settings: tuple[Path, ...]
    why: str
    remedy: str
    version: ContainerdVersion
    shadowing: Shadowing | None = None

    @property
    def handlers(self) -> tuple[str, ...]:
        """The runtime handlers among the settings, by name."""
        names: list[str] = []
        for path in self.settings:
            inner = path[2:]
            if inner[:2] == ("containerd", "runtimes") and len(inner) > 2 and inner[2] not in names:
                names.append(inner[2])
        return tuple(names)

    def shown(self) -> str:
        """The settings in words: runtime handlers by name first, then the other keys."""
        handlers: list[str] = []
        others: list[str] = []
        for path in self.settings:
            is_handler = path[2:4] == ("containerd", "runtimes") and len(path) > 4
            names = handlers if is_handler else others
            name = format_path(path[:5] if is_handler else path)
            if name not in names:
                names.append(name)
        tops = sorted(handlers) + others
        more = f", ... ({len(tops) - _SHOWN} more)" if len(tops) > _SHOWN else ""
        return ", ".join(tops[:_SHOWN]) + more or "(no settings)"

    def describe(self) -> str:
        """The whole finding in one sentence: the file, why, what is not loaded, what to do."""
        if self.shadowing is not None:
            return f"{self.shadowing.describe()}; to fix: {self.remedy}"
        return (
            f"containerd {self.version.series} does not load settings of {self.file}: "
            f"{self.why}; not loaded: {self.shown()}; to fix: {self.remedy}"
        )


def find_unloaded(files: ConfigFiles, version: ContainerdVersion) -> list[Unloaded]:
    """Every file whose settings `version` of containerd does not load, and why."""
    merged = merge_files(files, version)
    found = [_shadowed(s) for s in find_shadowing(files, version)]
    for path, leaves in merged.ignored_for_version.items():
        # A key the version-3 config carries with the same value where 2.x would have
        # migrated it (the toolkit's copy of a dump does) is ignored, yet in effect.
        lost = tuple(leaf for leaf in leaves if not _in_effect_as_v3(files, merged, path, leaf))
        if lost:
            found.append(_ignored(files, merged, path, lost))
    found += [
        _not_imported(files, merged, path)
        for path in files.files
        if path.endswith(".toml")
        and path not in merged.load_order
        and "/certs.d/" not in path
        # a registry's hosts.toml, under whatever config_path: read from there, never imported
        and posixpath.basename(path) != "hosts.toml"
        and path != files.main_path
    ]
    return found


def _shadowed(s: Shadowing) -> Unloaded:
    table = f'plugins."{s.plugin_id}"'
    if s.kind is ShadowKind.TABLE_REPLACED:
        why = f"{s.shadowing_file} loads later and replaces the whole {table} table"
        remedy = (
            f"the last file that sets {table} ({s.shadowing_file}) must carry the whole table on "
            f"containerd {s.version.series}: a `rollout plan` with a containerd or registry "
            "change rewrites it so (`rollout diagnose --fix` writes one)"
        )
    elif s.version.major < 2:
        why = f"{s.shadowing_file} loads later and replaces the whole {table} table"
        remedy = (
            f"set these keys in {s.shadowing_file}, the last file that sets {table} (containerd "
            f"{s.version.series} loads that file's table only)"
        )
    else:
        why = f"{s.shadowing_file} loads later and sets the same keys"
        remedy = (
            f"set each key in one file only (the value of {s.shadowing_file} is the one loaded)"
        )
    return Unloaded(
        UnloadedKind.SHADOWED,
        s.shadowed_file,
        tuple((PLUGINS, s.plugin_id, *p) for p in (*s.lost, *s.overridden)),
        why,
        remedy,
        s.version,
        s,
    )


def _ignored(
    files: ConfigFiles, merged: EffectiveConfig, path: str, leaves: tuple[Path, ...]
) -> Unloaded:
    last = next(
        (p for p in reversed(merged.load_order) if _doc(files, p).get("version") == 3), "a file"
    )
    targets = sorted({v3_plugin_of(leaf[2:]) for leaf in leaves})
    where = ", ".join(f'plugins."{t}"' for t in targets)
    return Unloaded(
        UnloadedKind.IGNORED_FOR_VERSION,
        path,
        leaves,
        f"the last file that sets `version` is {last} (version = 3), so containerd "
        f"{merged.version.series} does not migrate the version-2 CRI table ({CRI_V2}) and "
        "ignores its keys",
        f"write them in version-3 form in {path} (`version = 3`, under {where}), or let a "
        "`rollout plan` with the setting write them",
        merged.version,
    )


def _in_effect_as_v3(files: ConfigFiles, merged: EffectiveConfig, path: str, leaf: Path) -> bool:
    """Whether the loaded config holds the value where 2.x would have migrated the key."""
    tree: dict[str, Any] = {}
    table = tree
    for part in leaf[1:-1]:
        table = table.setdefault(part, {})
    table[leaf[-1]] = find_value(_doc(files, path), leaf)
    migrate_cri_tables(tree)
    moved = [((PLUGINS, *p), v) for p, v in iter_leaves(tree) if p[0] != CRI_V2 and v != {}]
    return bool(moved) and all(find_value(merged.configured, p, _ABSENT) == v for p, v in moved)


def _not_imported(files: ConfigFiles, merged: EffectiveConfig, path: str) -> Unloaded:
    entries = [(importer, e) for importer in merged.load_order for e in _imports(files, importer)]
    # Imported, yet not loaded: 2.x stopped at a missing import before reaching it.
    pending = any(
        path in resolve_import(importer, entry, merged.version, files)
        for importer, entry in entries
    )
    why, remedy = next(
        (
            reason
            for importer, entry in entries
            for reason in [_import_misses(files, merged.version, importer, entry, path, pending)]
            if reason is not None
        ),
        (
            f"no import of the files containerd loads ({', '.join(merged.load_order)}) "
            "matches it on this version",
            f"move it into a directory that the imports of {files.main_path} match, or import "
            "it there by its absolute path",
        ),
    )
    return Unloaded(
        UnloadedKind.NOT_IMPORTED, path, _settings_of(files, path), why, remedy, merged.version
    )


def _import_misses(
    files: ConfigFiles,
    version: ContainerdVersion,
    importer: str,
    entry: str,
    path: str,
    pending: bool,
) -> tuple[str, str] | None:
    """Why one import entry does not load `path` on this version, with what to do; None if
    the entry has nothing to do with it."""
    series = version.series
    if "*" not in entry:
        [target] = resolve_import(importer, entry, version, files)
        if not pending or target in files.files:
            return None
        return (
            f"{importer} imports {target}, which does not exist: containerd {series} stops "
            "loading there and ignores every file still pending",
            f"create {target} or remove its import from {importer}",
        )
    if pending or posixpath.isabs(entry):
        return None
    if path not in resolve_import(importer, entry, _IMPORTER_RELATIVE, files):
        return None
    directory = posixpath.dirname(importer)
    return (
        f"containerd {series} resolves the relative glob {entry!r} of {importer} against its "
        f"working directory (/ under systemd), not against {directory}, so it matches nothing "
        "there",
        f'write the import as an absolute path in {importer}: "{posixpath.join(directory, entry)}"',
    )


def _imports(files: ConfigFiles, path: str) -> list[str]:
    imports = _doc(files, path).get("imports", [])
    return [i for i in imports if isinstance(i, str)] if isinstance(imports, list) else []


def _settings_of(files: ConfigFiles, path: str) -> tuple[Path, ...]:
    return tuple(p for p, _ in iter_leaves(_doc(files, path)) if p[0] not in ("version", "imports"))


def _doc(files: ConfigFiles, path: str) -> dict[str, Any]:
    try:
        return parse_toml(path, files.files[path])
    except ContainerdConfigError:
        return {}  # a file containerd never reads may not even parse: it sets nothing
