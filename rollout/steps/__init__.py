"""Step kinds, one module per job: preflight, containerd, systemd, cordon, drain, time-slicing,
the GPU checks, drivers.

The step classes are the one list of step kinds: playbooks are checked against it, the
planner asks each step for its plan, the executor runs the ones that can be applied, and
what is true of each kind (rollout.steps.traits) is read from its class.
"""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import cast

from rollout.steps.base import Step, StepPlanner
from rollout.steps.traits import StepTraits


def step_planners() -> dict[str, StepPlanner]:
    """Every built-in step kind, by kind: each step class that can plan itself (the shared
    steps', and those of every change kind, rollout.changes)."""
    from rollout.changes import kind_planners
    from rollout.steps import cordon, drain, gates, gpu_smoke, gpu_wait, preflight, systemd

    own = [m for kind in kind_planners().values() for m in kind.step_modules()]
    return steps_in(
        preflight, systemd, cordon, drain, gpu_wait, gpu_smoke, gates, *dict.fromkeys(own)
    )


def builtin_steps() -> dict[str, Step]:
    """The step kinds rollout can apply: those that also implement `apply` and `undo`."""
    return {
        kind: cast(Step, step)
        for kind, step in step_planners().items()
        if callable(getattr(step, "apply", None)) and callable(getattr(step, "undo", None))
    }


def step_traits() -> dict[str, StepTraits]:
    """What is true of each step kind rollout can apply (its class's `traits`), by kind."""
    return {kind: step.traits for kind, step in builtin_steps().items()}


def step_kinds() -> frozenset[str]:
    """The names a playbook may use."""
    return frozenset(step_planners())


def steps_in(*modules: ModuleType) -> dict[str, StepPlanner]:
    """An instance of every step class defined in the modules, keyed by its kind."""
    found: dict[str, StepPlanner] = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            kind = getattr(cls, "kind", None)
            if cls.__module__ != module.__name__ or not isinstance(kind, str) or not kind:
                continue
            if not callable(getattr(cls, "plan", None)):
                continue
            if kind in found:
                raise TypeError(f"two step classes for {kind!r}: {cls} and {type(found[kind])}")
            found[kind] = cast(StepPlanner, cls())
    return found
