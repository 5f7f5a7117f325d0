"""What a step kind is lives on its class (rollout.steps.traits): every registered step class
declares all of it, and no module keeps a table of step names beside the classes."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import rollout
from rollout.plan import NodePlan, StepPlan
from rollout.rbac import Grant
from rollout.spec import Policy
from rollout.steps import builtin_steps, step_kinds, step_traits
from rollout.steps.traits import StepTraits, cluster_wide_kinds, takes_down

PACKAGE = Path(rollout.__file__).resolve().parent
STEPS = builtin_steps()
# The string-keyed tables the traits replaced: none may come back under its old name.
REMOVED_TABLES = ("CLUSTER_WIDE_STEPS", "STEP_GRANTS", "SSH_STEPS", "STEP_EXPECTED_S")


@pytest.mark.parametrize("kind", sorted(STEPS))
def test_every_step_class_declares_every_trait_itself(kind: str) -> None:
    cls = type(STEPS[kind])
    # on the class itself: a new subclass does not silently inherit a sibling's traits
    assert "traits" in vars(cls), f"{cls.__name__} declares no traits"
    traits = vars(cls)["traits"]
    assert isinstance(traits, StepTraits)
    for field in dataclasses.fields(StepTraits):
        assert field.default is dataclasses.MISSING, f"{field.name} must be said by each step"
    assert isinstance(traits.cluster_wide, bool)
    assert isinstance(traits.takes_down, bool)
    assert isinstance(traits.uses_ssh, bool)
    assert isinstance(traits.grants, tuple)
    assert all(isinstance(grant, Grant) for grant in traits.grants)
    assert traits.expected_s > 0
    assert traits.worst_s(Policy()) > 0


def test_every_kind_a_playbook_may_name_has_traits() -> None:
    assert set(step_traits()) == set(step_kinds())


def test_the_traits_say_what_the_removed_tables_said() -> None:
    traits = step_traits()
    assert cluster_wide_kinds(traits) == {"configmap.update", "driver.pin"}
    assert {kind for kind, t in traits.items() if t.takes_down} == {"cordon"}
    assert {kind for kind, t in traits.items() if t.uses_ssh} == {
        "preflight",
        "containerd.write",
        "systemd.restart",
        "containerd.verify",
        "driver.unload",
        "driver.install",
        "driver.reload",
        "driver.verify",
        # the kernel clock and the kernel log (the Xid gate); nvidia-smi on the node
        "gates.baseline",
        "gates",
        "driver.confirm",
        # the boot id, for a reboot the MIG manager does
        "mig.configure",
        "mig.wait",
    }


def test_a_worst_duration_follows_the_plans_policy() -> None:
    traits = step_traits()
    slow = Policy.model_validate({"verify": {"gpu_wait_timeout_s": 900}, "drain": {"timeout_s": 0}})
    assert traits["gpu.wait"].worst_s(Policy()) == 300
    assert traits["gpu.wait"].worst_s(slow) == 900
    assert traits["drain"].worst_s(slow) == 86_400  # no drain timeout: a day is counted


@pytest.mark.parametrize(
    ("acting", "down"),
    [
        (("preflight", "cordon", "drain"), True),
        (("preflight", "drain"), False),  # a cordon planned as a no-op takes nothing down
        (("driver.pin", "driver.release"), False),  # the operator cordons, not rollout
    ],
)
def test_a_node_is_taken_down_by_an_acting_step_that_says_so(
    acting: tuple[str, ...], down: bool
) -> None:
    steps = tuple(
        StepPlan.acting(kind, "act") if kind in acting else StepPlan.skipping(kind, "no-op")
        for kind in ("preflight", "cordon", "drain", "driver.pin", "driver.release")
    )
    node = NodePlan(name="gpu-1", containerd_version="1.7.24", steps=steps)
    assert takes_down(node, step_traits()) is down


def step_kind_tables(source: str, kinds: frozenset[str]) -> list[str]:
    """Where a module keeps what step kinds are beside their classes: a removed table's
    name, a literal dict, set, list or tuple of two or more step kinds, or a step's `.kind`
    compared with a kind's name."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name | ast.Attribute):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in REMOVED_TABLES:
                found.append(f"line {node.lineno}: {name}")
        elif isinstance(node, ast.ImportFrom):
            found += [
                f"line {node.lineno}: imports {a.name}"
                for a in node.names
                if a.name in REMOVED_TABLES
            ]
        items: list[ast.expr | None] = []
        if isinstance(node, ast.Dict):
            items = list(node.keys)
        elif isinstance(node, ast.Set | ast.List | ast.Tuple):
            items = list(node.elts)
        named = [i.value for i in items if isinstance(i, ast.Constant) and i.value in kinds]
        if len(named) >= 2:
            found.append(f"line {node.lineno}: a table of {', '.join(named)}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            by_kind = any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides)
            named = [s.value for s in sides if isinstance(s, ast.Constant) and s.value in kinds]
            if by_kind and named:
                found.append(f"line {node.lineno}: .kind compared with {named[0]!r}")
    return found


@pytest.mark.parametrize(
    "source",
    [
        'CLUSTER_WIDE_STEPS = frozenset({"a"})',
        "from rollout.schedule.forecast import STEP_EXPECTED_S",
        'EXPECTED = {"cordon": 1.0, "drain": 30.0}',
        'SSH = frozenset({"preflight", "containerd.write"})',
        'def down(node):\n    return any(s.kind == "cordon" for s in node.steps)',
    ],
)
def test_the_table_check_finds_each_kind_of_table(source: str) -> None:
    assert step_kind_tables(source, step_kinds())


def test_no_module_keeps_a_table_of_step_kinds() -> None:
    kinds = step_kinds()
    found = {
        path.relative_to(PACKAGE).as_posix(): problems
        for path in sorted(PACKAGE.rglob("*.py"))
        if (problems := step_kind_tables(path.read_text(), kinds))
    }
    assert found == {}
