"""Differences between two effective configs: leaf changes and a readable unified diff."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import tomli_w

from rollout.containerd.merge import EffectiveConfig, find_value, iter_leaves

Path = tuple[str, ...]


class ChangeKind(Enum):
    ADDED = "added"
    REMOVED = "removed"
    CHANGED = "changed"


@dataclass(frozen=True)
class Change:
    """One leaf of the effective config that differs; None on a side means absent there."""

    path: Path
    before: Any
    after: Any

    @property
    def kind(self) -> ChangeKind:
        if self.before is None:
            return ChangeKind.ADDED
        if self.after is None:
            return ChangeKind.REMOVED
        return ChangeKind.CHANGED

    @property
    def dotted(self) -> str:
        return format_path(self.path)

    def __str__(self) -> str:
        if self.kind is ChangeKind.ADDED:
            return f"+ {self.dotted} = {self.after!r}"
        if self.kind is ChangeKind.REMOVED:
            return f"- {self.dotted} (was {self.before!r})"
        return f"~ {self.dotted}: {self.before!r} -> {self.after!r}"


def format_path(path: Path) -> str:
    """A path the way TOML writes it: plugins."io.containerd.grpc.v1.cri".registry."""
    return ".".join(p if p.replace("_", "").replace("-", "").isalnum() else f'"{p}"' for p in path)


_ABSENT = object()


def has_path(tree: Mapping[str, Any], path: Path) -> bool:
    """Whether a key path exists in a tree, whatever its value."""
    return find_value(tree, path, _ABSENT) is not _ABSENT


def tree_of(config: EffectiveConfig | Mapping[str, Any]) -> Mapping[str, Any]:
    """The plain tree of an EffectiveConfig, or the mapping itself."""
    return config.tree if isinstance(config, EffectiveConfig) else config


def diff_effective(
    before: EffectiveConfig | Mapping[str, Any], after: EffectiveConfig | Mapping[str, Any]
) -> list[Change]:
    """Leaf-level changes from `before` to `after`, sorted by path."""
    tree_b, tree_a = tree_of(before), tree_of(after)
    leaves_b, leaves_a = dict(iter_leaves(tree_b)), dict(iter_leaves(tree_a))
    changes = []
    for path in sorted(set(leaves_b) | set(leaves_a)):
        old, new = leaves_b.get(path), leaves_a.get(path)
        if old == new and (path in leaves_b) == (path in leaves_a):
            continue
        # An empty table that gained keys (or the reverse) is told by the keys themselves.
        if (old == {} and _is_table(tree_a, path)) or (new == {} and _is_table(tree_b, path)):
            continue
        changes.append(Change(path, old, new))
    return changes


def render_diff_text(
    before: EffectiveConfig | Mapping[str, Any],
    after: EffectiveConfig | Mapping[str, Any],
    before_label: str = "effective before",
    after_label: str = "effective after",
) -> str:
    """A unified diff of the canonical TOML of both trees ('' when they are equal)."""
    lines = difflib.unified_diff(
        to_canonical_toml(tree_of(before)).splitlines(keepends=True),
        to_canonical_toml(tree_of(after)).splitlines(keepends=True),
        fromfile=before_label,
        tofile=after_label,
    )
    return "".join(lines)


def to_canonical_toml(tree: Mapping[str, Any]) -> str:
    """TOML with keys sorted at every level, so equal trees print equal text."""
    return tomli_w.dumps(_sorted(tree))


def _sorted(tree: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: _sorted(v) if isinstance(v, Mapping) else v
        for k, v in sorted(tree.items(), key=lambda kv: kv[0])
    }


def _is_table(tree: Mapping[str, Any], path: Path) -> bool:
    node = find_value(tree, path)
    return isinstance(node, Mapping) and bool(node)
