"""Invariant 4's rule, written once: whose cordon a node carries (rollout.steps.cordon)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rollout
from rollout.steps.cordon import CordonOwner, cordon_owner

PACKAGE = Path(rollout.__file__).resolve().parent


@pytest.mark.parametrize(
    ("unschedulable", "ours", "owner"),
    [
        (False, False, CordonOwner.NOBODY),
        # journalled, then uncordoned by someone: rollout cordons it again
        (False, True, CordonOwner.NOBODY),
        (True, True, CordonOwner.THIS_RUN),
        (True, False, CordonOwner.SOMEONE_ELSE),
    ],
)
def test_whose_cordon(unschedulable: bool, ours: bool, owner: CordonOwner) -> None:
    assert cordon_owner(unschedulable, ours) is owner


def test_the_plan_and_the_steps_say_the_same_reason() -> None:
    assert CordonOwner.SOMEONE_ELSE.value == "cordoned by someone else; stays cordoned"


def test_the_rule_is_said_in_one_place() -> None:
    """No other string of the product's steps says a node was cordoned by someone else: the
    plan of cordon and uncordon and their apply all take CordonOwner.SOMEONE_ELSE."""
    sayers = sorted(
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in (PACKAGE / "steps").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and "cordoned by someone else" in node.value
        and "\n" not in node.value  # docstrings
    )
    assert len(sayers) == 1 and sayers[0].startswith("steps/cordon.py:"), sayers
