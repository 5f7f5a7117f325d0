"""The layering contract of STYLE.md, checked on every module of the package.

Only transports/ imports fabric (and invoke, which fabric is built on), paramiko and
kubernetes; only the CLI layer (rollout/cli/, the render module included) imports rich; only
retry.py imports tenacity, the one place retries live. No exceptions: a module that needs one
of these libraries belongs in that layer.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import rollout

PACKAGE = Path(rollout.__file__).resolve().parent

# library -> where in rollout/ it may be imported: a folder (ending in "/") or one module
RULES: dict[str, tuple[str, ...]] = {
    "fabric": ("transports/",),
    "invoke": ("transports/",),
    "paramiko": ("transports/",),
    "kubernetes": ("transports/",),
    "rich": ("cli/",),
    "tenacity": ("retry.py",),
}
DYNAMIC_IMPORTERS = {"import_module", "__import__"}


def imported_roots(source: str, filename: str = "<module>") -> set[str]:
    """Top-level names of every absolute import anywhere in a module: at the top, inside
    functions and `if TYPE_CHECKING:` blocks, and `importlib.import_module("x")` calls."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args:
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            first = node.args[0]
            if name in DYNAMIC_IMPORTERS and isinstance(first, ast.Constant):
                roots.add(str(first.value).split(".")[0])
    return roots


def allowed_in(relative: str, places: tuple[str, ...]) -> bool:
    return any(
        relative.startswith(place) if place.endswith("/") else relative == place for place in places
    )


def layering_violations(relative: str, source: str) -> list[str]:
    """Every rule the module at `relative` (a path below rollout/) breaks, as messages."""
    return [
        f"{relative} imports {library}; only {', '.join(RULES[library])} may"
        for library in sorted(imported_roots(source, relative) & RULES.keys())
        if not allowed_in(relative, RULES[library])
    ]


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_every_module_keeps_to_its_layer(module: Path) -> None:
    relative = module.relative_to(PACKAGE).as_posix()
    assert layering_violations(relative, module.read_text()) == []


def python_modules(directory: Path, prefix: str) -> set[str]:
    """Module names as Python's import system lists them (no import), packages as `.__init__`."""
    found: set[str] = set()
    for info in pkgutil.iter_modules([str(directory)]):
        name = f"{prefix}.{info.name}"
        if info.ispkg:
            found |= {f"{name}.__init__"} | python_modules(directory / info.name, name)
        else:
            found.add(name)
    return found


def test_the_collector_sees_every_module_of_the_package() -> None:
    """The files checked are exactly the modules Python can import from the package."""
    collected = {
        "rollout." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts) for p in MODULES
    }
    listed = python_modules(PACKAGE, "rollout") | {"rollout.__init__"}
    unlisted = sorted(collected - listed)
    assert not unlisted, f"in a folder without __init__.py (not a regular package): {unlisted}"
    assert collected == listed
    assert {"rollout.cli.render", "rollout.transports.ssh", "rollout.retry"} <= collected


def test_the_collector_finds_imports_however_deep_they_sit() -> None:
    source = (
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import rich.table\n"
        "class A:\n    def m(self):\n        def inner():\n            import paramiko.client\n"
        "try:\n    import fabric\nexcept ImportError:\n    pass\n"
        "loader = __import__('kubernetes.config')\n"
        "from . import sibling\n"
    )
    assert imported_roots(source) == {"os", "typing", "rich", "paramiko", "fabric", "kubernetes"}


@pytest.mark.parametrize(
    ("relative", "source", "library"),
    [
        ("steps/kube.py", "import kubernetes.client\n", "kubernetes"),
        ("drain.py", "from paramiko import SSHClient\n", "paramiko"),
        ("executor.py", "def later():\n    import fabric\n    return fabric\n", "fabric"),
        ("probe.py", "from invoke import Context\n", "invoke"),
        ("planner.py", "if TYPE_CHECKING:\n    from rich.table import Table\n", "rich"),
        ("render.py", "from rich.console import Console\n", "rich"),
        ("transports/ssh.py", "from rich.console import Console\n", "rich"),
        ("cli/plan.py", "import kubernetes\n", "kubernetes"),
        ("lab/cluster.py", "import importlib\nimportlib.import_module('paramiko')\n", "paramiko"),
        ("retry_policies.py", "import tenacity\n", "tenacity"),
        (
            "steps/base.py",
            "class A:\n    def m(self):\n        from tenacity import retry\n",
            "tenacity",
        ),
    ],
)
def test_the_checker_catches_a_module_breaking_the_rule(
    relative: str, source: str, library: str
) -> None:
    (found,) = layering_violations(relative, source)
    assert f"{relative} imports {library}" in found


@pytest.mark.parametrize(
    ("relative", "source"),
    [
        ("transports/kube/client.py", "from kubernetes import client\nimport urllib3\n"),
        ("transports/ssh.py", "import fabric\nimport paramiko\n"),
        ("cli/render.py", "from rich.console import Console\n"),
        ("retry.py", "import tenacity\n"),
        ("steps/kube.py", "from rollout.transports.kube import KubeClient\n"),
        # a relative import names a module of the package, never a library
        ("cli/plan.py", "from . import render\nfrom .render import make_console\n"),
    ],
)
def test_the_checker_lets_each_layer_use_its_own_libraries(relative: str, source: str) -> None:
    assert layering_violations(relative, source) == []


def test_transport_errors_and_retry_load_without_the_transport_libraries() -> None:
    """The executor, the steps and the CLI catch transport errors without importing them."""
    code = (
        "import sys, rollout.retry, rollout.transports.errors\n"
        "loaded = {'paramiko', 'fabric', 'kubernetes', 'invoke', 'rich'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_no_helper_grab_bags() -> None:
    names = {p.stem for p in MODULES}
    assert not names & {"utils", "helpers", "common", "misc"}
