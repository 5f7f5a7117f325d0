"""What the simulated kubelet asks of a node's running containerd: which runtime handlers it has."""

from __future__ import annotations

import logging
import threading
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rollout.lab.description import LabDescription

log = logging.getLogger("rollout.lab.simulation")

# Written by the lab's containerd unit drop-in at each start, removed at stop: the
# `containerd config dump` of the configuration the running daemon loaded.
RUNNING_CONFIG_PATH = Path("var/lib/rollout-lab/containerd-running.toml")
# Where runtime handlers live in a dump: containerd 1.x (config v2), then 2.x (config v3).
_CRI_RUNTIME_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")


class NodeRuntimeProbe(Protocol):
    """The seam between the simulation and real (or fake) node runtimes."""

    def has_handler(self, node: str, handler: str) -> bool:
        """Whether the containerd running on `node` now has runtime handler `handler`."""
        ...


def handlers_in_dump(dump: Mapping[str, Any]) -> set[str]:
    """Runtime handler names in a parsed `containerd config dump` (1.x or 2.x layout)."""
    plugins = dump.get("plugins") or {}
    handlers: set[str] = set()
    for plugin in _CRI_RUNTIME_PLUGINS:
        runtimes = ((plugins.get(plugin) or {}).get("containerd") or {}).get("runtimes") or {}
        handlers.update(runtimes)
    return handlers


class RunningConfigProbe:
    """Reads each node's running-config dump from its root filesystem on this host."""

    def __init__(self, roots: Mapping[str, Path]) -> None:
        self._roots = dict(roots)

    @classmethod
    def from_lab(cls, lab: LabDescription) -> RunningConfigProbe:
        return cls({n.name: n.root for n in lab.nodes if n.root is not None})

    def has_handler(self, node: str, handler: str) -> bool:
        root = self._roots.get(node)
        if root is None:
            return False
        try:
            text = (root / RUNNING_CONFIG_PATH).read_text()
        except FileNotFoundError:
            return False  # containerd is not running
        except OSError as error:
            log.warning("cannot read the running containerd config of %s: %s", node, error)
            return False
        try:
            dump = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            # Caught mid-write by the unit drop-in; the next tick reads it whole.
            log.debug("running containerd config of %s not parseable yet: %s", node, error)
            return False
        return handler in handlers_in_dump(dump)


class FixedRuntimeProbe:
    """Handlers set by hand: for tests and for a control plane run without lab nodes."""

    def __init__(self, handlers: Mapping[str, Iterable[str]] | None = None) -> None:
        self._lock = threading.Lock()
        self._handlers = {node: set(names) for node, names in (handlers or {}).items()}

    @classmethod
    def with_nvidia(cls, nodes: Iterable[str]) -> FixedRuntimeProbe:
        return cls({node: {"runc", "nvidia"} for node in nodes})

    def set_handlers(self, node: str, handlers: Iterable[str]) -> None:
        with self._lock:
            self._handlers[node] = set(handlers)

    def has_handler(self, node: str, handler: str) -> bool:
        with self._lock:
            return handler in self._handlers.get(node, set())
