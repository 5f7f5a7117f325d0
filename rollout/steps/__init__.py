"""Step kinds, one module per area: preflight, containerd, systemd, Kubernetes, time-slicing."""

from __future__ import annotations

import inspect
from types import ModuleType
from typing import cast

from rollout.steps.base import Step


def builtin_steps() -> dict[str, Step]:
    """Every built-in step, by kind: each class in the step modules that has a `kind`."""
    from rollout.steps import containerd, kube, preflight, systemd, timeslicing

    return steps_in(preflight, containerd, systemd, kube, timeslicing)


def steps_in(*modules: ModuleType) -> dict[str, Step]:
    """An instance of every step class defined in the modules, keyed by its kind."""
    found: dict[str, Step] = {}
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            kind = getattr(cls, "kind", None)
            if cls.__module__ != module.__name__ or not isinstance(kind, str) or not kind:
                continue
            if not (callable(getattr(cls, "apply", None)) and callable(getattr(cls, "undo", None))):
                continue
            if kind in found:
                raise TypeError(f"two step classes for {kind!r}: {cls} and {type(found[kind])}")
            found[kind] = cast(Step, cls())
    return found
