"""The device-plugin profile rules, written once (rollout.deviceprofiles): the plan model,
diagnose and the time-slicing planner read profiles through them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import rollout
from rollout.changes.timeslicing.model import TimeSlicingChange
from rollout.deviceprofiles import (
    fallback_key,
    load_profile,
    renames_by_default,
    shared_replicas,
    time_slicing_of,
)

PACKAGE = Path(rollout.__file__).resolve().parent
GPU = "nvidia.com/gpu"
SHARED = """version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""


@pytest.mark.parametrize(
    ("text", "replicas", "renamed"),
    [
        (SHARED, 4, True),
        ("version: v1\n", None, False),
        ("version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}\n", 1, False),
        (
            "version: v1\nsharing:\n  timeSlicing:\n"
            "    resources: [{name: nvidia.com/mig-1g.5gb, replicas: 2}]\n",
            None,
            False,
        ),
        ("version: v1\nsharing: {timeSlicing: [not, a, table]}\n", None, False),
        ("not: [yaml", None, False),
        ("- a list", None, False),
    ],
)
def test_what_a_profile_shares(text: str, replicas: int | None, renamed: bool) -> None:
    document = load_profile(text)
    assert shared_replicas(document, GPU) == replicas
    assert renames_by_default(document) is renamed


def test_an_unparsable_profile_is_its_text() -> None:
    assert load_profile("not: [yaml") == "not: [yaml"
    assert time_slicing_of("not: [yaml") == {}


@pytest.mark.parametrize(
    ("default", "keys", "loaded"),
    [
        ("x2", ["a", "b"], "x2"),
        ("", ["default", "b"], "default"),
        ("", ["only"], "only"),
        ("", ["a", "b"], None),
        ("", [], None),
    ],
)
def test_the_config_managers_fallback(default: str, keys: list[str], loaded: str | None) -> None:
    assert fallback_key(default, keys) == loaded


def test_the_plan_model_reads_its_profile_with_the_same_rules() -> None:
    change = TimeSlicingChange.model_validate(
        {"profile": "x4", "config": load_profile(SHARED)}, by_alias=True
    )
    assert change.replicas_for(GPU) == 4
    assert change.replicas_for("nvidia.com/mig-1g.5gb") == 1
    assert change.rename_by_default is True
    assert change.shared_gpus() == ("nvidia.com/gpu.shared", 4)


def _reads_time_slicing(path: Path) -> bool:
    """`X.get("timeSlicing")` or `X["timeSlicing"]`: a walk of a profile document by hand."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            key = node.args[0] if node.func.attr == "get" and node.args else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice
        else:
            continue
        if isinstance(key, ast.Constant) and key.value == "timeSlicing":
            return True
    return False


def test_only_the_engine_walks_a_profile() -> None:
    """The lab's device plugin (rollout/lab/simulation) stands in for the real one and keeps
    its own reading, so a wrong rule here is caught by the lab, not shared with it."""
    walkers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] != "lab" and _reads_time_slicing(path)
    )
    assert walkers == ["deviceprofiles.py"]
