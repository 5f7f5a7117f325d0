"""The product stands without the MIG change kind: MIG as a node's state (rollout.facts.migmode)
is what the shared steps know; the kind (rollout/changes/mig/) is one registration.

Every example plan, with its recorded facts, and a time-slicing plan are planned byte for byte
the same with a kinds table less `mig` as with the whole one; and no module of the package
outside rollout/changes/mig/ imports it (the lab and the tests may), checked by an AST walk
that also sees imports inside functions, relative ones and `from rollout.changes import mig`.
"""

from __future__ import annotations

import ast
import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

import rollout
from rollout.changes import kind_planners
from rollout.cli.render import make_console, plan_to_json, plan_to_markdown, print_plan_text
from rollout.errors import RolloutError
from rollout.facts import load_recorded_facts
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import parse_spec
from tests.planning import time_slicing_plan

PACKAGE = Path(rollout.__file__).resolve().parent
MIG_PACKAGE = "rollout.changes.mig"
# where an import of the MIG kind is the kind's own, or the lab's (apart from the product)
MIG_OWNERS = ("changes/mig/", "lab/")
EXAMPLES = sorted((PACKAGE / "examples").glob("*.yaml"))
FACTS = PACKAGE / "examples" / "facts"
SLICING = time_slicing_plan(
    name="share", targets="{selector: nvidia.com/gpu.present=true}", profile="a100-4x"
)


def rendered(text: str, source: str, kinds: Mapping[str, Any] | None) -> str:
    """The plan of `text` over the example facts, as text, markdown and JSON; or why it was
    refused (an example written for the lab's nodes)."""
    facts = load_recorded_facts(FACTS)
    try:
        plan = build_plan(parse_spec(text, source), source, facts, load_playbooks(), kinds=kinds)
    except RolloutError as refused:
        return f"refused: {refused}"
    out = io.StringIO()
    print_plan_text(plan, make_console(out, color=False))
    return "\n".join((out.getvalue(), plan_to_markdown(plan), plan_to_json(plan)))


PLANS = [*((p.name, p.read_text()) for p in EXAMPLES), ("time-slicing.yaml", SLICING)]


@pytest.mark.parametrize(("source", "text"), PLANS, ids=[source for source, _ in PLANS])
def test_every_plan_is_the_same_without_the_mig_kind(source: str, text: str) -> None:
    whole = kind_planners()
    without = {key: kind for key, kind in whole.items() if key != "mig"}
    assert "mig" in whole and len(without) == len(whole) - 1
    assert rendered(text, source, without) == rendered(text, source, whole)


def module_name(relative: str) -> str:
    """rollout.x.y of the module at `relative` (below rollout/); a package's own name."""
    parts = ["rollout", *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_mig(relative: str, source: str) -> list[str]:
    """Every import of the MIG kind's package in the module at `relative`, as written."""
    name = module_name(relative)
    package = name if relative.endswith("__init__.py") else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, filename=relative)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        if any(n == MIG_PACKAGE or n.startswith(MIG_PACKAGE + ".") for n in names):
            found.append(ast.unparse(node))
    return found


def mig_import_violations(relative: str, source: str) -> list[str]:
    """What the module at `relative` breaks of the rule: only the kind and the lab import it."""
    if relative.startswith(MIG_OWNERS):
        return []
    return [
        f"rollout/{relative}: `{line}`: only rollout/changes/mig/ (and the lab) import the MIG "
        "kind; shared code knows MIG as a node's state (rollout.facts.migmode)"
        for line in imports_mig(relative, source)
    ]


def test_no_module_outside_the_mig_kind_imports_it() -> None:
    problems = [
        problem
        for path in sorted(PACKAGE.rglob("*.py"))
        for problem in mig_import_violations(path.relative_to(PACKAGE).as_posix(), path.read_text())
    ]
    assert problems == []


@pytest.mark.parametrize(
    "source",
    [
        "from rollout.changes.mig.layout import MigLayout\n",
        "import rollout.changes.mig\n",
        "from rollout.changes import mig\n",
        "def late():\n    from rollout.changes.mig import kind\n",
        "if TYPE_CHECKING:\n    import rollout.changes.mig.model\n",
        "from ..changes.mig import steps\n",
        "from ..changes import mig\n",
    ],
)
def test_the_check_catches_an_import_of_the_mig_kind(source: str) -> None:
    (problem,) = mig_import_violations("steps/gpu_smoke.py", source)
    assert problem.startswith("rollout/steps/gpu_smoke.py: `")
    assert mig_import_violations("changes/mig/steps.py", source) == []
    assert mig_import_violations("lab/simulation/kubelet.py", source) == []


def test_the_check_lets_other_imports_be() -> None:
    for source in (
        "from rollout.changes import kind_planners\n",
        "from rollout.changes.migration import x\n",
        "from rollout.facts.migmode import read_mig_mode\n",
        "from . import gpu_wait\n",
    ):
        assert mig_import_violations("steps/gpu_smoke.py", source) == []
