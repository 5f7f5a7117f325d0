"""The runtime handlers a containerd config defines: the one reading of them.

A handler is a key of `containerd.runtimes` in the CRI plugin table that holds the runtimes:
`io.containerd.grpc.v1.cri` in config version 2 (containerd 1.x), `io.containerd.cri.v1.runtime`
in version 3 (2.x). The same reading serves a real `containerd config dump`, the merge model's
tree and one parsed file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.containerd.version import RUNTIME_PLUGIN_IDS


def runtime_tables(tree: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The `containerd.runtimes` tables of a config tree (handler -> its settings), over both
    CRI layouts; a tree of one config version has at most one."""
    plugins = tree.get("plugins")
    if not isinstance(plugins, Mapping):
        return []
    found: list[Mapping[str, Any]] = []
    for plugin_id in RUNTIME_PLUGIN_IDS:
        table = plugins.get(plugin_id)
        containerd = table.get("containerd") if isinstance(table, Mapping) else None
        runtimes = containerd.get("runtimes") if isinstance(containerd, Mapping) else None
        if isinstance(runtimes, Mapping):
            found.append(runtimes)
    return found


def list_runtime_handlers(tree: Mapping[str, Any]) -> tuple[str, ...]:
    """The runtime handler names a config tree defines, sorted, over both CRI layouts."""
    return tuple(sorted({str(name) for runtimes in runtime_tables(tree) for name in runtimes}))


def find_runtime_handler(tree: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """One handler's settings in a config tree, None when the tree does not define it."""
    for runtimes in runtime_tables(tree):
        entry = runtimes.get(name)
        if isinstance(entry, Mapping):
            return entry
    return None
