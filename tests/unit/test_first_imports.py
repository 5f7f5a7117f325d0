"""Every module a process may import first loads then, whatever else it loads on the way.

The layering test's import graph (test_layering.py) sees no circle through the kinds' table,
which loads each kind's plan model by name (importlib): rollout.changes.mig.model once
imported rollout.spec, whose loading of every kind's model met that model half-loaded, and
`import rollout.changes.mig.model` failed in a fresh interpreter. Here each module is imported
in one interpreter after every module of the package is dropped, as if it were the first.
The modules: every package's __init__ and everything of FIRST_PLACES; the lab aside. The
driver engine is among them: were the fact frame (rollout.fact) still under rollout.facts, whose
package loads the node facts that carry the engine's models, an engine module imported first
would meet itself half-loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rollout.changes import KINDS
from tests.unit.test_layering import PACKAGE, module_name

# module name prefixes: the plan model, the kinds and their table, the input edge; the driver
# engine; the fact frame and every facts module (`rollout.fact` is a prefix of both), the node
# facts that carry the engine's models among them
FIRST_PLACES = (
    "rollout.changes",
    "rollout.spec",
    "rollout.inputs",
    "rollout.driver",
    "rollout.fact",
)

# Run in a fresh interpreter: argv is the package's name, then the modules to import.
IMPORT_EACH_FIRST = """
import importlib, json, sys
root, names = sys.argv[1], sys.argv[2:]
failures = {}
for name in names:
    for loaded in [m for m in sys.modules if m.split(".")[0] == root]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failures[name] = f"{type(exc).__name__}: {exc}"
print(json.dumps(failures))
"""


def first_import_failures(names: list[str], where: Path, root: str = "rollout") -> dict[str, str]:
    """Module -> why it fails to import as the first of the `root` package, for each of
    `names` that does, importing from the folder `where`."""
    found = subprocess.run(
        [sys.executable, "-c", IMPORT_EACH_FIRST, root, *names],
        cwd=where,
        capture_output=True,
        text=True,
        check=True,
    )
    failures: dict[str, str] = json.loads(found.stdout)
    return failures


def first_modules() -> list[str]:
    """The modules imported first: each package's __init__ and every module of
    FIRST_PLACES, outside the lab."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name.startswith("rollout.lab") or path.stem == "__main__":
            continue
        if path.stem == "__init__" or name.startswith(FIRST_PLACES):
            names.append(name)
    return names


def test_every_first_module_loads_first() -> None:
    names = first_modules()
    models = {f"rollout.{kind.model.partition(':')[0]}" for kind in KINDS.values()}
    assert models <= set(names), "every kind's plan model is among the modules imported first"
    assert {"rollout.driver.host", "rollout.driver.status", "rollout.facts.model"} <= set(names)
    assert first_import_failures(names, PACKAGE.parent) == {}


def test_the_check_catches_a_model_its_table_loads_half_made(tmp_path: Path) -> None:
    """The shape of the MIG model's circle: the model imports a module that loads the model
    by name; imported first, the table loads it first and succeeds, the model does not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "table.py").write_text(
        "import importlib\nMODEL = importlib.import_module('pkg.model').Model\n"
    )
    (package / "model.py").write_text("import pkg.table\n\nclass Model:\n    pass\n")
    failures = first_import_failures(["pkg.table", "pkg.model"], tmp_path, root="pkg")
    assert list(failures) == ["pkg.model"]
    assert "partially initialized module 'pkg.model'" in failures["pkg.model"]
