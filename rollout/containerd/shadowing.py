"""Shadowing analysis: which file hides which settings of which other file, and what is lost.

On containerd 1.x a later file's `[plugins."X"]` table replaces the whole table X of every
earlier file: a three-line registry drop-in sorting after the toolkit's 99-nvidia.toml throws
away the `nvidia` runtime handlers; one sorting before it loses its own key to the toolkit's
copy of the whole table (`config_path = ""`). On 2.x tables merge, so only single keys can be
overridden.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rollout.containerd.diff import format_path, has_path
from rollout.containerd.files import ConfigFiles, parse_toml
from rollout.containerd.merge import PLUGINS, find_value, iter_leaves, merge_files
from rollout.containerd.version import ContainerdVersion, MergeMode

Path = tuple[str, ...]
_SHOWN = 8


class ShadowKind(Enum):
    TABLE_REPLACED = "table-replaced"  # 1.x: a whole plugin table
    KEY_OVERRIDDEN = "key-overridden"  # 2.x: one key, different value


@dataclass(frozen=True)
class Shadowing:
    """A later file hiding settings of an earlier one; `lost` paths are relative to the table.

    A replaced table (1.x) may also carry keys of the earlier file with other values:
    `overridden` (relative paths too). When that is all it hides, the kind is KEY_OVERRIDDEN.
    """

    kind: ShadowKind
    plugin_id: str
    shadowing_file: str
    shadowed_file: str
    lost: tuple[Path, ...]
    version: ContainerdVersion
    overridden: tuple[Path, ...] = ()

    def describe(self) -> str:
        """The shadowing in words, lost keys collapsed to the highest lost subtree."""
        table = f'plugins."{self.plugin_id}"'
        names = [format_path(p) for p in self.lost]
        shown = ", ".join(names[:_SHOWN]) + (
            f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
        )
        if self.kind is ShadowKind.TABLE_REPLACED or self.version.major < 2:
            return (
                f"{self.shadowing_file} replaces the whole {table} table of "
                f"{self.shadowed_file} (containerd {self.version.series} replaces plugin tables, "
                f"it does not merge them); lost: {shown}"
            )
        return f"{self.shadowing_file} overrides {table} keys of {self.shadowed_file}: {shown}"


def find_shadowing(files: ConfigFiles, version: ContainerdVersion) -> list[Shadowing]:
    """Every shadowing among the loaded files, in load order."""
    effective = merge_files(files, version)
    tables = _plugin_tables(files, effective.load_order)
    if version.merge_mode is MergeMode.REPLACE_PLUGIN_TABLES:
        return _replaced_tables(tables, effective.plugin, version)
    return _overridden_keys(tables, version)


def _plugin_tables(
    files: ConfigFiles, order: tuple[str, ...]
) -> dict[str, list[tuple[str, Mapping[str, Any]]]]:
    tables: dict[str, list[tuple[str, Mapping[str, Any]]]] = {}
    for path in order:
        plugins = parse_toml(path, files.files[path]).get(PLUGINS, {})
        if isinstance(plugins, dict):
            for plugin_id, table in plugins.items():
                if isinstance(table, dict):
                    tables.setdefault(plugin_id, []).append((path, table))
    return tables


def _replaced_tables(
    tables: dict[str, list[tuple[str, Mapping[str, Any]]]],
    effective_table: Any,
    version: ContainerdVersion,
) -> list[Shadowing]:
    found = []
    for plugin_id, definers in tables.items():
        if len(definers) < 2:
            continue
        final_file = definers[-1][0]
        effective = effective_table(plugin_id)
        claimed: set[Path] = set()
        # Walk backwards so a key lost twice is blamed on the last file that had it.
        for path, table in reversed(definers[:-1]):
            lost_leaves = [
                p for p, _ in iter_leaves(table) if not has_path(effective, p) and p not in claimed
            ]
            # A zero value is what the toolkit's copy of a dump holds for every key nobody
            # set (`config_path = ""`): replacing it loses no one's setting.
            changed = tuple(
                p
                for p, value in iter_leaves(table)
                if value not in ("", 0, [], {})
                and has_path(effective, p)
                and find_value(effective, p) != value
                and p not in claimed
            )
            claimed.update(lost_leaves, changed)
            lost = _collapse(lost_leaves, effective)
            if lost:
                found.append(
                    Shadowing(
                        ShadowKind.TABLE_REPLACED,
                        plugin_id,
                        final_file,
                        path,
                        lost,
                        version,
                        changed,
                    )
                )
            elif changed:
                found.append(
                    Shadowing(
                        ShadowKind.KEY_OVERRIDDEN, plugin_id, final_file, path, changed, version
                    )
                )
    return sorted(found, key=lambda s: (s.plugin_id, s.shadowed_file))


def _overridden_keys(
    tables: dict[str, list[tuple[str, Mapping[str, Any]]]], version: ContainerdVersion
) -> list[Shadowing]:
    found = []
    for plugin_id, definers in tables.items():
        seen: dict[Path, tuple[str, Any]] = {}
        pairs: dict[tuple[str, str], list[Path]] = {}
        for path, table in definers:
            for leaf, value in iter_leaves(table):
                if leaf in seen and seen[leaf][1] != value and seen[leaf][0] != path:
                    pairs.setdefault((path, seen[leaf][0]), []).append(leaf)
                seen[leaf] = (path, value)
        for (later, earlier), leaves in pairs.items():
            found.append(
                Shadowing(
                    ShadowKind.KEY_OVERRIDDEN, plugin_id, later, earlier, tuple(leaves), version
                )
            )
    return found


def _collapse(leaves: list[Path], effective: Mapping[str, Any]) -> tuple[Path, ...]:
    tops: list[Path] = []
    for leaf in leaves:
        top = next(leaf[:i] for i in range(1, len(leaf) + 1) if not has_path(effective, leaf[:i]))
        if top[0] == "containerd" and len(top) < 3 and len(leaf) >= 2:
            # Name runtime handlers one by one (they are what breaks GPU pods), and the other
            # keys of the containerd table singly rather than as one opaque "containerd".
            top = leaf[:3] if leaf[1] == "runtimes" and len(leaf) >= 3 else leaf[:2]
        if top not in tops:
            tops.append(top)
    handlers = sorted(t for t in tops if t[:2] == ("containerd", "runtimes"))
    return tuple(handlers + [t for t in tops if t not in handlers])


def repair_scope(files: ConfigFiles, version: ContainerdVersion) -> tuple[Path, ...]:
    """The plugin tables repair_shadowing gives keys back to: where prediction lets keys return."""
    return tuple(
        ("plugins", s.plugin_id)
        for s in find_shadowing(files, version)
        if s.kind is ShadowKind.TABLE_REPLACED
    )
