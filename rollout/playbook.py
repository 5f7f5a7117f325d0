"""Playbooks: the built-in step sequences of playbooks/, one YAML file per change kind.

They ship inside the package: rollout/playbooks is a link to the top-level playbooks/, which
setuptools follows when it builds the wheel, so an installed rollout reads the same files."""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.errors import InputError, SourceLocation
from rollout.inputs.yamlsource import SourceDocument
from rollout.steps import step_kinds


class Phase(enum.Enum):
    """Where a step sits when playbooks combine: prepare, change, verify, finish."""

    PREPARE = "prepare"
    CHANGE = "change"
    VERIFY = "verify"
    FINISH = "finish"


@dataclass(frozen=True)
class PlaybookStep:
    kind: str
    phase: Phase
    why: str


@dataclass(frozen=True)
class Playbook:
    kind: str
    description: str
    steps: tuple[PlaybookStep, ...]
    source: str


def playbooks_dir() -> Path:
    """The directory of built-in playbooks (ROLLOUT_PLAYBOOKS overrides it)."""
    override = os.environ.get("ROLLOUT_PLAYBOOKS")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / "playbooks"


def load_playbook(path: Path) -> Playbook:
    """Read and check one playbook file."""
    document = SourceDocument.from_path(path)
    raw = document.data
    if not isinstance(raw, Mapping):
        raise InputError(
            document.location_of(()), "a playbook is a mapping with kind, description and steps"
        )
    steps = tuple(
        _parse_step(document.location_of(("steps", i)), i, item)
        for i, item in enumerate(raw.get("steps") or [])
    )
    if not steps:
        raise InputError(document.location_of(("steps",)), "no steps", field="steps")
    return Playbook(
        kind=str(raw.get("kind") or path.stem),
        description=str(raw.get("description") or ""),
        steps=steps,
        source=str(path),
    )


def load_playbooks(directory: Path | None = None) -> dict[str, Playbook]:
    """Every playbook in the directory, keyed by its change kind."""
    directory = directory or playbooks_dir()
    if not directory.is_dir():
        raise InputError(
            SourceLocation(str(directory)),
            "playbook directory not found",
            hint="reinstall rollout (its playbooks ship in the package), or set"
            " ROLLOUT_PLAYBOOKS to a folder of playbooks",
        )
    books = [load_playbook(p) for p in sorted(directory.glob("*.yaml"))]
    return {book.kind: book for book in books}


def compose_steps(books: Iterable[Playbook]) -> tuple[PlaybookStep, ...]:
    """One node's steps for several playbooks: prepare, change (in order), verify, finish.

    Prepare, verify and finish steps run once even when several playbooks name them: one
    cordon, one drain, one wait for the GPUs, one smoke pod, one uncordon per node.
    """
    ordered = list(books)
    result: list[PlaybookStep] = []
    for phase in Phase:
        seen: set[str] = set()
        for book in ordered:
            for step in book.steps:
                if step.phase is not phase:
                    continue
                if phase is not Phase.CHANGE and step.kind in seen:
                    continue
                seen.add(step.kind)
                result.append(step)
    return tuple(result)


def _parse_step(location: SourceLocation, index: int, item: Any) -> PlaybookStep:
    field = f"steps[{index}]"
    if not isinstance(item, Mapping) or "step" not in item:
        raise InputError(
            location, "each step is a mapping with `step`, `phase` and `why`", field=field
        )
    kind = str(item["step"])
    known = step_kinds()  # the step classes are the one list of kinds
    if kind not in known:
        raise InputError(
            location,
            f"unknown step {kind!r}",
            field=field,
            hint="known steps: " + ", ".join(sorted(known)),
        )
    try:
        phase = Phase(str(item.get("phase", "change")))
    except ValueError as exc:
        raise InputError(
            location,
            f"unknown phase {item.get('phase')!r}",
            field=f"{field}.phase",
            hint="phases: " + ", ".join(p.value for p in Phase),
        ) from exc
    return PlaybookStep(kind=kind, phase=phase, why=str(item.get("why", "")))
