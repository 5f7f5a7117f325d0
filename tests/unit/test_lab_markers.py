"""Which lab tests boot labs of their own is said by their marker, and the marker is true.

scripts/test runs the modules marked `own_lab` apart from the shared lab's tests, on their own
addresses; a module that boots its own lab without the marker would run beside the shared
lab's tests on the own-lab addresses' defaults, and one marked but using the shared lab would
boot a second shared lab.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.examples import REPO

LAB_TESTS = sorted((REPO / "tests" / "lab").glob("test_*.py"))
OWN_LAB_SIGNS = {"own_lab", "OWN_ADDRESS_PREFIX"}  # from tests.lab.test_cluster_shared


def names_used(tree: ast.Module) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


def marked_own_lab(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return "own_lab" in {
                n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)
            }
    return False


@pytest.mark.parametrize("path", LAB_TESTS, ids=lambda p: p.name)
def test_a_module_booting_its_own_lab_is_marked_so(path: Path) -> None:
    if path.name == "test_cluster_shared.py":
        return  # defines own_lab and shared_lab
    tree = ast.parse(path.read_text())
    used = names_used(tree)
    if used & OWN_LAB_SIGNS:
        assert marked_own_lab(tree), f"{path.name} boots a lab of its own: mark it own_lab"
    if marked_own_lab(tree):
        assert "shared_lab" not in used, f"{path.name} is marked own_lab but uses the shared lab"


def test_the_own_lab_modules_are_found_by_their_marker() -> None:
    marked = [p.name for p in LAB_TESTS if marked_own_lab(ast.parse(p.read_text()))]
    assert "test_chaos.py" in marked and "test_apply.py" in marked
    assert "OWN_LAB_TESTS" not in (REPO / "scripts" / "test").read_text()
