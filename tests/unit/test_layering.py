"""The layering contract of STYLE.md, checked on every module of the package."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "rollout"

# library -> the package paths (relative to rollout/) allowed to import it
RESTRICTED = {
    "fabric": ("transports/",),
    "paramiko": ("transports/",),
    "invoke": ("transports/",),
    "kubernetes": ("transports/",),
    "rich": ("render.py", "cli/"),
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_package_has_modules() -> None:
    assert len(MODULES) > 10


@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_restricted_imports_stay_in_their_layer(module: Path) -> None:
    relative = module.relative_to(PACKAGE).as_posix()
    for library in imported_roots(module) & RESTRICTED.keys():
        allowed = RESTRICTED[library]
        assert relative.startswith(allowed), f"{relative} imports {library}; only {allowed} may"


def test_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import kubernetes.client\nfrom rich.console import Console\n")
    assert {"kubernetes", "rich"} <= imported_roots(bad)


def test_no_helper_grab_bags() -> None:
    names = {p.stem for p in MODULES}
    assert not names & {"utils", "helpers", "common", "misc"}
