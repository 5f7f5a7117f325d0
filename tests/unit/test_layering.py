"""The layering contract of STYLE.md, checked on every module of the package.

Only transports/ imports fabric (and invoke, which fabric is built on), paramiko and
kubernetes; only the CLI layer (rollout/cli/, the render module included) imports rich; only
retry.py imports tenacity, the one place retries live. No exceptions: a module that needs one
of these libraries belongs in that layer.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import pkgutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

import rollout
from rollout.cli import COMMANDS
from tests.examples import FACTS, PLAN

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


# ------------------------------------------------------------------- the package's own graph


def module_name(path: Path) -> str:
    """`rollout.steps.base` for rollout/steps/base.py, `rollout.steps` for its __init__.py."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None) if isinstance(node, ast.If) else None
    return isinstance(test, ast.Name | ast.Attribute) and (
        getattr(test, "id", None) == "TYPE_CHECKING"
        or getattr(test, "attr", None) == "TYPE_CHECKING"
    )


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of `tree` that runs at some point: all but `if TYPE_CHECKING:` bodies (their
    `else:` runs)."""
    for child in ast.iter_child_nodes(tree):
        if is_type_checking_block(child):
            assert isinstance(child, ast.If)
            for other in child.orelse:
                yield other
                yield from runtime_nodes(other)
            continue
        yield child
        yield from runtime_nodes(child)


def package_imports(
    source: str, importer: str, known: set[str], is_package: bool, *, typing: bool = False
) -> set[str]:
    """The modules of the package that `importer` imports when it runs (top level or inside
    functions; for typing only too with `typing`): `from rollout.x import y` names
    rollout.x.y when that is a module, else rollout.x."""
    found: set[str] = set()
    base = importer if is_package else importer.rpartition(".")[0]
    tree = ast.parse(source, filename=importer)
    for node in ast.walk(tree) if typing else runtime_nodes(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base.rsplit(".", node.level - 1)[0] if node.level > 1 else base
                module = f"{anchor}.{node.module}" if node.module else anchor
            else:
                module = node.module or ""
            for alias in node.names:
                found.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
        elif isinstance(node, ast.Call) and node.args:
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            first = node.args[0]
            if name in DYNAMIC_IMPORTERS and isinstance(first, ast.Constant):
                found.add(str(first.value))
    found = {name for name in found if name in known}
    # importing rollout.a.b.c runs rollout.a and rollout.a.b first, unless they are the
    # importer's own packages (already running when it runs)
    for name in list(found):
        parts = name.split(".")
        found.update(".".join(parts[:n]) for n in range(2, len(parts)))
    own = {".".join(importer.split(".")[:n]) for n in range(1, importer.count(".") + 2)}
    return found - own


def import_graph(*, typing: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at run time (and for typing only too, with
    `typing`), for every module of rollout."""
    names = {module_name(path): path for path in MODULES}
    return {
        name: package_imports(
            path.read_text(), name, set(names), path.name == "__init__.py", typing=typing
        )
        for name, path in names.items()
    }


def strongly_connected(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """The groups of modules that each reach all the others (Tarjan), more than one each."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in graph.get(name, ()):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            group = {stack.pop()}
            while name not in group:
                group.add(stack.pop())
            if len(group) > 1:
                groups.append(group)

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return groups


def shortest_cycle(graph: Mapping[str, set[str]], group: set[str]) -> list[str]:
    """A shortest a -> ... -> a through the group's first module (breadth first)."""
    start = min(group)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for name in frontier:
            for target in sorted(graph[name] & group):
                if target == start:
                    path = [name]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target not in came_from:
                    came_from[target] = name
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def import_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> ... -> a) through each group of modules that import each other."""
    return sorted(shortest_cycle(graph, group) for group in strongly_connected(graph))


@pytest.mark.parametrize("typing", [False, True], ids=["at-run-time", "for-typing-too"])
def test_no_module_imports_itself_back_through_others(typing: bool) -> None:
    """No circle at run time; nor through an `if TYPE_CHECKING:` import, which hides a circle
    rather than removing it (a Protocol on the lower side does: lab/apiserver/handler.py)."""
    cycles = [" -> ".join(cycle) for cycle in import_cycles(import_graph(typing=typing))]
    assert not cycles, "import circles:\n" + "\n".join(cycles)


def test_the_retry_policies_know_no_transport() -> None:
    """Transports declare their errors transient (rollout.errors.TransientError) and name
    their retry kind themselves: the retry policies and the error root import none of them."""
    graph = import_graph()
    for module in ("rollout.retry", "rollout.errors"):
        assert not {name for name in graph[module] if name.startswith("rollout.transports")}


def test_a_cycle_is_found_and_named_whatever_its_length() -> None:
    graph = {
        "a": {"b"},
        "b": {"c"},
        "c": {"a", "d"},
        "d": set(),
        "e": {"e2"},
        "e2": {"e"},
        "f": {"a"},
    }
    assert import_cycles(graph) == [["a", "b", "c", "a"], ["e", "e2", "e"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_in_functions_but_not_for_typing_only() -> None:
    known = {"rollout.a", "rollout.b", "rollout.c", "rollout.pkg", "rollout.pkg.d"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from rollout.b import B\n"
        "else:\n    import rollout.c\n"
        "def f():\n    from rollout.pkg import d\n"
        "import os\n"
    )
    assert package_imports(source, "rollout.a", known, is_package=False) == {
        "rollout.c",
        "rollout.pkg",
        "rollout.pkg.d",
    }
    relative = "from . import a\nfrom .pkg.d import x\n"
    assert package_imports(relative, "rollout.b", known, is_package=False) == {
        "rollout.a",
        "rollout.pkg",
        "rollout.pkg.d",
    }


# ------------------------------------------------------------------ the lab, apart from it


def outside_the_lab(module: str) -> bool:
    return module != "rollout.lab" and not module.startswith("rollout.lab.")


def lab_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of a lab module by a module outside the lab."""
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if outside_the_lab(module)
        for target in targets
        if not outside_the_lab(target)
    )


def test_the_product_never_imports_the_lab() -> None:
    """Not even for typing: `rollout lab` is found through the CLI's command table (a module
    path imported only when the command runs), and the lab drives the product through seams."""
    assert lab_imports(import_graph(typing=True)) == []


def test_the_lab_check_sees_a_product_module_importing_the_lab() -> None:
    graph = {
        "rollout.cli.plan": {"rollout.lab.cluster", "rollout.planner"},
        "rollout.lab.cli": {"rollout.cli", "rollout.lab.cluster"},
        "rollout.laboratory": {"rollout.lab"},
    }
    assert lab_imports(graph) == [
        "rollout.cli.plan imports rollout.lab.cluster",
        "rollout.laboratory imports rollout.lab",
    ]


def test_the_lab_command_is_listed_by_module_path_only() -> None:
    (lab,) = (command for command in COMMANDS if command.name == "lab")
    assert lab.module == "rollout.lab.cli"


def modules_loaded_by(argv: list[str]) -> set[str]:
    """The rollout modules a fresh interpreter has loaded after `python -m rollout ARGV`."""
    script = (
        "import contextlib, io, json, runpy, sys\n"
        f"sys.argv = ['rollout', *{argv!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()), "
        "contextlib.redirect_stderr(io.StringIO()):\n"
        "    try:\n"
        "        runpy.run_module('rollout', run_name='__main__')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rollout'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=300
    )
    return set(json.loads(result.stdout))


@pytest.mark.parametrize(
    ("argv", "ran"),
    [
        (["plan", str(PLAN), "--facts", str(FACTS)], "rollout.planner"),
        (["apply", "--help"], "rollout.cli.apply"),
        (["--help"], "rollout.cli"),
    ],
    ids=["plan", "apply-help", "help"],
)
def test_the_product_commands_load_no_lab_module(argv: list[str], ran: str) -> None:
    loaded = modules_loaded_by(argv)
    assert ran in loaded  # the command did run
    assert sorted(m for m in loaded if not outside_the_lab(m)) == []


def test_the_lab_command_loads_the_lab_when_it_runs() -> None:
    """The other direction: the registration does find the lab's command."""
    assert "rollout.lab.cli" in modules_loaded_by(["lab", "--help"])


# --------------------------------------------------------------------- the product's layers

# The product's layers, lowest first: a module imports, at run time, only from its own layer
# and those below it (within a layer, anything). Each entry is a module or package directly
# under rollout/ (with everything below it), or a pattern below one (`changes.*.*model`); the
# most specific entry naming a module wins. A new one goes into the lowest layer its imports
# allow. The lab is in no
# layer: apart from the product, above all of it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "__init__",
            "errors",
            "inputs",
            "memo",
            "closeable",
            "commands",
            # the fact frame (a sentence, a command, a parser): facts and engines state theirs in it
            "fact",
            "secrets",
            # RBAC grants (one verb on one resource): steps and change kinds declare theirs
            "rbac",
            "version",
            "retry",
            "testclock",
            # the change kinds' table: names only, each kind loaded when asked for
            "changes",
        ),
    ),
    ("transports", ("transports",)),
    (
        "engines and stores",
        (
            "containerd",
            # the driver engine: what rollout knows of the NVIDIA driver on a node
            "driver",
            "deviceprofiles",
            "run",
            "lease",
            # the GPU Operator's names (it imports nothing): the engines and models name them
            "operatornames",
        ),
    ),
    (
        "models",
        (
            "spec",
            # what every kind's plan model is, and each kind's model (the registry's:
            # changes.containerd.registrymodel) with its package's __init__, which runs first
            # and so loads nothing
            "changes.model",
            "changes.*.*model",
            "changes.*.__init__",
            "inventory",
            "limit",
            "plan",
            "budget",
            "operatorrolls",
        ),
    ),
    ("facts", ("facts", "drain", "connection")),
    # rollout.changes.base: what a change kind is to the planner and the steps
    ("steps", ("steps", "gates", "changes.base")),
    # each change kind's package
    ("change kinds", ("changes.*",)),
    ("planning", ("planner", "playbook", "plangroups", "topology", "capacity", "diagnose")),
    ("running", ("executor", "schedule", "notify", "savedplan")),
    ("command line", ("cli", "__main__")),
)


def top_of(module: str) -> str:
    """The entry of LAYERS a module belongs to: `steps` for rollout.steps.base."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(module: str) -> int | None:
    """The layer of the most specific LAYERS entry naming the module (`changes.*.*model` before
    `changes.*`, and that before `changes`, the package itself)."""
    below = module.split(".", 1)[1] if "." in module else "__init__"
    # an entry ending in .__init__ names a package itself (`changes.*.__init__`: a kind's)
    is_package = (PACKAGE.parent / module.replace(".", "/") / "__init__.py").is_file()
    found = [
        (len(entry), n)
        for n, (_, entries) in enumerate(LAYERS)
        for entry in entries
        if below == entry
        or ("*" not in entry and below.startswith(entry + "."))
        or ("*" in entry and fnmatch.fnmatchcase(below, entry))
        or (
            is_package
            and entry.endswith(".__init__")
            and fnmatch.fnmatchcase(f"{below}.__init__", entry)
        )
    ]
    return max(found)[1] if found else None


def upward_imports(
    graph: Mapping[str, set[str]], layers: Callable[[str], int | None] = layer_of
) -> list[str]:
    """Every import of a module from a layer above its own, and every module in no layer."""
    problems: list[str] = []
    for module, targets in sorted(graph.items()):
        if not outside_the_lab(module):
            continue
        own = layers(module)
        if own is None:
            problems.append(f"{module}: rollout.{top_of(module)} is in no layer of LAYERS")
            continue
        for target in sorted(targets):
            theirs = layers(target)
            if outside_the_lab(target) and theirs is not None and theirs > own:
                problems.append(
                    f"{module} ({LAYERS[own][0]}) imports {target} ({LAYERS[theirs][0]}), "
                    "a layer above it"
                )
    return problems


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    assert upward_imports(import_graph()) == []


def test_the_layer_check_catches_an_upward_import_and_an_unplaced_module() -> None:
    graph = {
        "rollout.errors": {"rollout.transports.ssh"},
        "rollout.cli.plan": {"rollout.planner", "rollout.errors"},
        "rollout.steps.cordon": {"rollout.lab.cluster"},
        "rollout.newthing": set(),
    }
    assert upward_imports(graph) == [
        "rollout.errors (foundation) imports rollout.transports.ssh (transports), a layer above it",
        "rollout.newthing: rollout.newthing is in no layer of LAYERS",
    ]


def test_a_kind_package_itself_sits_with_the_models_and_loads_nothing_above_them() -> None:
    """A kind's package runs before its model: a fact may import a kind's model, and a kind's
    __init__ importing its steps would be an upward import."""
    graph = {
        "rollout.facts.extra": {"rollout.changes.driver", "rollout.changes.driver.model"},
        "rollout.changes.driver": {"rollout.changes.driver.steps"},
    }
    assert upward_imports(graph) == [
        "rollout.changes.driver (models) imports rollout.changes.driver.steps (change kinds), "
        "a layer above it"
    ]


# ------------------------------------------------------------- a change kind in its package

# words that name a change kind's own code: such a module lives in rollout/changes/<kind>/
KIND_WORDS = ("timeslicing", "profile", "deviceplugin", "driver")
SHARED_PLACES = ("steps", "facts")


def kind_modules_outside(modules: set[str]) -> list[str]:
    """Modules of the shared places (steps, facts) whose name names a change kind."""
    return sorted(
        module
        for module in modules
        if top_of(module) in SHARED_PLACES
        and any(word in module.rsplit(".", 1)[-1] for word in KIND_WORDS)
    )


def kind_imports_of_shared(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of a change kind's package (rollout.changes.<kind>) by a shared step."""
    shared = {"rollout.changes", "rollout.changes.base"}
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if top_of(module) == "steps"
        for target in sorted(targets)
        if target.startswith("rollout.changes.") and target not in shared
    ]


def imports_across_kinds(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of one change kind's package by another's: what two kinds share lives
    below them (a shared step, a fact, an engine)."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if module.startswith("rollout.changes.") and module.count(".") >= 3
        for target in sorted(targets)
        if target.startswith("rollout.changes.")
        and target.count(".") >= 3
        and target.split(".")[2] != module.split(".")[2]
    ]


def test_no_change_kind_imports_another() -> None:
    assert imports_across_kinds(import_graph()) == []


def test_the_kind_check_sees_one_kind_importing_another() -> None:
    graph = {
        "rollout.changes.mig.steps": {"rollout.changes.driver.node", "rollout.changes.base"},
        "rollout.changes.driver.install": {"rollout.changes.driver.node"},
    }
    assert imports_across_kinds(graph) == [
        "rollout.changes.mig.steps imports rollout.changes.driver.node"
    ]


def test_every_change_kind_keeps_its_code_in_its_package() -> None:
    assert kind_modules_outside(set(import_graph())) == []


def test_shared_steps_import_no_change_kind() -> None:
    assert kind_imports_of_shared(import_graph()) == []


def test_the_kind_checks_see_a_kind_module_and_import_in_shared_places() -> None:
    graph = {
        "rollout.steps.timeslicing": set(),
        "rollout.facts.deviceplugin": set(),
        "rollout.facts.driver_host": set(),
        "rollout.steps.driver_node": set(),
        "rollout.steps.gpu_wait": {"rollout.changes.timeslicing.profiles", "rollout.changes.base"},
        "rollout.changes.timeslicing.steps": {"rollout.steps.gpu_wait"},
    }
    assert kind_modules_outside(set(graph)) == [
        "rollout.facts.deviceplugin",
        "rollout.facts.driver_host",
        "rollout.steps.driver_node",
        "rollout.steps.timeslicing",
    ]
    assert kind_imports_of_shared(graph) == [
        "rollout.steps.gpu_wait imports rollout.changes.timeslicing.profiles"
    ]


# ---------------------------------------------------------------- the plan names no kind

# the change kinds' packages, rollout/changes/<kind>/
KIND_PACKAGES = frozenset(p.parent.name for p in (PACKAGE / "changes").glob("*/__init__.py"))


def kind_imports_of_spec(graph: Mapping[str, set[str]]) -> list[str]:
    """Every import of a change kind's package (or anything in it) by the plan model,
    rollout.spec and every module below it: the plan loads the kinds' models through the
    kinds' table, and names none."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if top_of(module) == "spec"
        for target in sorted(targets)
        if target.startswith("rollout.changes.") and target.split(".")[2] in KIND_PACKAGES
    ]


def test_the_plan_model_imports_no_change_kind() -> None:
    assert kind_imports_of_spec(import_graph(typing=True)) == []


def test_the_spec_check_sees_the_plan_importing_a_kind() -> None:
    graph = {
        "rollout.spec.plan": {"rollout.changes", "rollout.changes.model"},
        "rollout.spec": {"rollout.changes.driver.model", "rollout.changes.driver"},
        "rollout.facts.extra": {"rollout.changes.driver.model"},
    }
    assert kind_imports_of_spec(graph) == [
        "rollout.spec imports rollout.changes.driver",
        "rollout.spec imports rollout.changes.driver.model",
    ]


# ------------------------------------------- the kinds reached through their table, named nowhere

# Modules outside rollout/changes/ that may still import a change kind's package, each with
# its reason. None today: the shared modules reach the kinds through their table
# (rollout.changes: the planners and the hooks each kind answers, as `cluster_reads`) or the
# kinds' base (rollout.changes.base), and a new kind needs no edit of them.
KIND_IMPORTS_ALLOWED: Mapping[str, str] = {}


def kind_imports_outside(
    graph: Mapping[str, set[str]], allowed: Mapping[str, str] = KIND_IMPORTS_ALLOWED
) -> list[str]:
    """Every import of a change kind's package (rollout.changes.<kind>, or anything in it) by
    a module outside rollout/changes/, the lab and the `allowed` ones apart."""
    return [
        f"{module} imports {target}"
        for module, targets in sorted(graph.items())
        if outside_the_lab(module)
        and module != "rollout.changes"
        and not module.startswith("rollout.changes.")
        and module not in allowed
        for target in sorted(targets)
        if target.startswith("rollout.changes.") and target.split(".")[2] in KIND_PACKAGES
    ]


def test_no_module_outside_the_kinds_imports_a_kind() -> None:
    assert kind_imports_outside(import_graph(typing=True)) == []


def test_every_allowed_kind_import_is_a_module_with_a_reason() -> None:
    modules = set(import_graph())
    for module, reason in KIND_IMPORTS_ALLOWED.items():
        assert module in modules, f"{module}: no such module; drop it from the list"
        assert reason.strip(), f"{module}: say why it may import a kind"


def test_the_kind_import_check_sees_a_shared_module_naming_a_kind() -> None:
    graph = {
        "rollout.facts.extra": {"rollout.changes", "rollout.changes.driver.model"},
        "rollout.cli.apply": {"rollout.changes.base", "rollout.changes.containerd.steps"},
        "rollout.steps.gpu_smoke": {"rollout.changes.mig", "rollout.changes.model"},
        "rollout.changes.driver.kind": {"rollout.changes.driver.operator"},
        "rollout.changes.base": {"rollout.changes"},
        "rollout.lab.simulation.kubelet": {"rollout.changes.mig.layout"},
        "rollout.diagnose.remedy": {"rollout.changes.timeslicing.model"},
    }
    assert kind_imports_outside(graph) == [
        "rollout.cli.apply imports rollout.changes.containerd.steps",
        "rollout.diagnose.remedy imports rollout.changes.timeslicing.model",
        "rollout.facts.extra imports rollout.changes.driver.model",
        "rollout.steps.gpu_smoke imports rollout.changes.mig",
    ]
    allowed = {"rollout.diagnose.remedy": "a reason"}
    assert "rollout.diagnose.remedy" not in " ".join(kind_imports_outside(graph, allowed))


def test_the_graph_sees_every_way_of_importing_a_kind() -> None:
    """`from rollout.changes import mig`, a relative import, one inside a function and one for
    typing only all name the kind's package."""
    known = {"rollout.changes", "rollout.changes.mig", "rollout.changes.mig.layout"}
    for source in (
        "from rollout.changes import mig\n",
        "from ..changes import mig\n",
        "def late():\n    from rollout.changes.mig.layout import MigLayout\n",
        "if TYPE_CHECKING:\n    import rollout.changes.mig.layout\n",
    ):
        found = package_imports(source, "rollout.steps.gpu_smoke", known, False, typing=True)
        assert "rollout.changes.mig" in found, source
