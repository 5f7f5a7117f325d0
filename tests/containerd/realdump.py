"""Test support: the real containerd of one series, run through LocalRunner."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from rollout.containerd import ConfigFiles, ContainerdVersion, dump_configs
from rollout.transports.local import LocalRunner


@functools.cache
def version_of(binary: Path) -> ContainerdVersion:
    """The version the binary reports, parsed by the code under test."""
    result = LocalRunner().run([str(binary), "--version"])
    return ContainerdVersion.from_output(result.stdout)


def real_dumps(binary: Path, *file_sets: ConfigFiles) -> list[dict[str, Any]]:
    """The normalised real `config dump` of each file set."""
    return dump_configs(LocalRunner(), str(binary), list(file_sets))


def runtimes_of(dump: dict[str, Any]) -> dict[str, Any]:
    """The runtime handlers of a dump, wherever this version keeps them."""
    plugins = dump.get("plugins", {})
    for plugin_id in ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"):
        runtimes = plugins.get(plugin_id, {}).get("containerd", {}).get("runtimes")
        if runtimes is not None:
            return dict(runtimes)
    return {}


def config_path_of(dump: dict[str, Any]) -> str | None:
    """registry.config_path of a dump, wherever this version keeps it."""
    plugins = dump.get("plugins", {})
    for plugin_id in ("io.containerd.cri.v1.images", "io.containerd.grpc.v1.cri"):
        registry = plugins.get(plugin_id, {}).get("registry")
        if registry is not None:
            value = registry.get("config_path")
            return value if isinstance(value, str) else None
    return None
