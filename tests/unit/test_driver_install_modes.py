"""driver.install is host mode's step: the operator-mode branch it kept (a plan that acted,
an apply that failed every node) is gone. Built-in plans never put it in an operator-mode
plan; a playbook of one's own that does gets a step with nothing to do, not a failure."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import cast

from rollout.changes.driver.install import OPERATOR_MODE, DriverInstall
from rollout.planner import build_plan
from rollout.playbook import Phase, PlaybookStep, load_playbooks
from rollout.spec import parse_spec
from rollout.steps.base import StepContext, StepResultKind
from tests.unit.test_driver_operator_plan import fleet, spec_text

INSTALL = DriverInstall.kind


def test_only_the_host_mode_playbook_names_driver_install() -> None:
    books = load_playbooks()
    naming = sorted(k for k, book in books.items() if any(s.kind == INSTALL for s in book.steps))
    assert naming == ["driver-upgrade"]


def test_an_operator_mode_plan_has_no_driver_install() -> None:
    plan = build_plan(parse_spec(spec_text(), "plan.yaml"), "plan.yaml", fleet(), load_playbooks())
    assert plan.changes == ("driver-operator",)
    assert plan.nodes and not [s for n in plan.nodes for s in n.steps if s.kind == INSTALL]


def test_a_playbook_of_ones_own_gets_a_step_with_nothing_to_do() -> None:
    books = load_playbooks()
    operator = books["driver-operator"]
    extra = PlaybookStep(INSTALL, Phase.CHANGE, "a playbook of one's own")
    books["driver-operator"] = replace(operator, steps=(*operator.steps, extra))
    plan = build_plan(parse_spec(spec_text(), "plan.yaml"), "plan.yaml", fleet(), books)
    installs = [s for n in plan.nodes for s in n.steps if s.kind == INSTALL]
    assert installs and all(
        s.action is None and s.noop_reason == OPERATOR_MODE for s in installs
    ), installs


def test_its_apply_in_operator_mode_touches_nothing() -> None:
    """A context with the spec alone: any use of the node, the API or the journal raises."""
    spec = parse_spec(spec_text(), "plan.yaml")
    result = DriverInstall().apply(cast(StepContext, SimpleNamespace(spec=spec)))
    assert (result.kind, result.detail) == (StepResultKind.NOOP, OPERATOR_MODE)
