"""The runtime handlers of a config, read once (rollout.containerd.runtimehandlers), and the
CRI plugin ids, defined once (rollout.containerd.version)."""

from __future__ import annotations

import ast
from pathlib import Path

import rollout
from rollout.containerd.runtimehandlers import find_runtime_handler, list_runtime_handlers
from rollout.containerd.runtimeoptions import runtime_type_in
from rollout.containerd.version import (
    CRI_IMAGES,
    CRI_RUNTIME,
    CRI_V2,
    ContainerdVersion,
    dump_config_version,
    runtime_plugin_of,
)

PACKAGE = Path(rollout.__file__).resolve().parent
V2 = {
    "version": 2,
    "plugins": {
        CRI_V2: {
            "containerd": {
                "runtimes": {"runc": {}, "nvidia": {"runtime_type": "io.containerd.runc.v2"}}
            }
        },
        # not a CRI plugin: its `containerd.runtimes` holds no handler
        "io.containerd.internal.v1.other": {"containerd": {"runtimes": {"ghost": {}}}},
    },
}
V3 = {
    "version": 3,
    "plugins": {
        CRI_RUNTIME: {"containerd": {"runtimes": {"runc": {}, "nvidia-cdi": {}}}},
        CRI_IMAGES: {"registry": {"config_path": ""}},
        CRI_V2: {"stream_server_port": "0"},
    },
}


def test_handlers_of_both_layouts_and_only_cri_tables() -> None:
    assert list_runtime_handlers(V2) == ("nvidia", "runc")
    assert list_runtime_handlers(V3) == ("nvidia-cdi", "runc")
    assert list_runtime_handlers({}) == ()
    assert list_runtime_handlers({"plugins": "not a table"}) == ()


def test_which_plugin_holds_a_releases_handlers() -> None:
    """The one choice by release (probe configs, recorded defaults, runc's option keys)."""
    assert (runtime_plugin_of(1), runtime_plugin_of(2)) == (CRI_V2, CRI_RUNTIME)
    assert (dump_config_version(1), dump_config_version(2)) == (2, 3)
    assert ContainerdVersion.from_series("2.1").max_config_version == 3


def test_one_handler_and_its_runtime_type() -> None:
    assert find_runtime_handler(V2, "nvidia") == {"runtime_type": "io.containerd.runc.v2"}
    assert find_runtime_handler(V2, "ghost") is None
    assert find_runtime_handler(V3, "nvidia-cdi") == {}
    assert runtime_type_in("nvidia", (), V2) == "io.containerd.runc.v2"
    assert runtime_type_in("runc", (), V3) is None


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_cri_plugin_ids_are_written_once() -> None:
    """Everywhere else (product and lab) imports them; text that merely mentions one (a
    docstring, a TOML snippet) is not a definition."""
    ids = {CRI_V2, CRI_RUNTIME, CRI_IMAGES}
    defining = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if ids & _string_constants(path)
    )
    assert defining == ["containerd/version.py"]


def test_runtime_handlers_are_read_once() -> None:
    """Only the engine walks a config's `containerd.runtimes` tables to list handlers:
    steps, diagnose and the lab's kubelet import list_runtime_handlers."""
    readers = sorted(
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if _walks_runtimes(path)
    )
    assert readers == ["containerd/runtimehandlers.py"]


def _walks_runtimes(path: Path) -> bool:
    """A loop whose body reads `X.get("runtimes")`: a walk over plugin tables' handlers."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For | ast.comprehension)):
        body = loop.body if isinstance(loop, ast.For) else [loop.iter]
        for node in (m for b in body for m in ast.walk(b)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == "runtimes"
            ):
                return True
    return False
