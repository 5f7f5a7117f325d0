"""The plan document (plan.yaml): metadata, targets, changes, policy; and its loader."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import pydantic
from pydantic import Field, PlainValidator, PrivateAttr, model_validator

from rollout.changes import KINDS
from rollout.changes.model import ChangeModel
from rollout.errors import InputError, InputErrors, SourceLocation
from rollout.inputs.fieldproblems import (
    FieldProblem,
    PathPart,
    describe_value,
    format_path,
    sort_errors,
)
from rollout.inputs.fieldtypes import DnsLabel, KubeName, SpecModel, Str
from rollout.inputs.inputfile import MAX_INPUT_BYTES
from rollout.inputs.yamlsource import SourceDocument
from rollout.spec.changeentry import MODELS, Change, ChangeEntry
from rollout.spec.policy import Policy, SelectorField

API_VERSION = "rollout/v1"
# A plan holds a few hundred values; the limit bounds alias bombs and the time to refuse one.
PLAN_MAX_VALUES = 10_000
# Plans are small; the limit is the largest file read at all (docs/input-contract.md).
PLAN_MAX_BYTES = MAX_INPUT_BYTES
ChangeT = TypeVar("ChangeT", bound=SpecModel)


class Metadata(SpecModel):
    """The plan's name (used for run ids, Leases and CronJobs) and a free description."""

    name: DnsLabel
    description: Str = ""


def _first_duplicate(names: tuple[str, ...]) -> int | None:
    """The index of the first name that repeats an earlier one."""
    return next((i for i, name in enumerate(names) if name in names[:i]), None)


class Targets(SpecModel):
    """Which nodes the plan changes: selector AND nodes (each when given), minus exclude."""

    selector: SelectorField | None = None
    nodes: tuple[KubeName, ...] = ()
    exclude: tuple[KubeName, ...] = ()

    @model_validator(mode="after")
    def _check_targets(self) -> Targets:
        if self.selector is None and not self.nodes:
            raise FieldProblem(
                "targets need a `selector`, a `nodes` list, or both",
                hint='e.g. selector: "nvidia.com/gpu.present=true"',
            )
        if self.selector is not None and self.selector.is_empty:
            raise FieldProblem(
                "an empty selector would target every node",
                hint='name the GPU nodes, e.g. selector: "nvidia.com/gpu.present=true"',
            )
        for field, names in (("nodes", self.nodes), ("exclude", self.exclude)):
            twice = _first_duplicate(names)
            if twice is not None:
                raise FieldProblem(
                    f"node {names[twice]!r} is listed twice in `{field}`", at=(field, twice)
                )
        both = [i for i, name in enumerate(self.exclude) if name in self.nodes]
        if both:
            raise FieldProblem(
                f"node {self.exclude[both[0]]!r} is both listed in `nodes` and excluded",
                hint="remove it from one of the two lists",
                at=("exclude", both[0]),
            )
        return self

    def includes(self, name: str, labels: Mapping[str, str]) -> bool:
        """True when the node `name` with `labels` is a target of the plan."""
        if name in self.exclude:
            return False
        if self.nodes and name not in self.nodes:
            return False
        return self.selector is None or self.selector.matches(labels)


def _check_kind(value: Any) -> str:
    if value != "Plan":
        hint = "this is an inventory file, not a plan" if value == "Inventory" else None
        raise FieldProblem(f"expected kind: Plan, found {describe_value(value)}", hint=hint)
    return "Plan"


def _check_api_version(value: Any) -> str:
    if value != API_VERSION:
        raise FieldProblem(f"expected apiVersion: {API_VERSION}, found {describe_value(value)}")
    return API_VERSION


class Spec(SpecModel):
    """A validated plan. `changes` are the typed changes, in file order."""

    api_version: Annotated[Literal["rollout/v1"], PlainValidator(_check_api_version)] = Field(
        alias="apiVersion"
    )
    kind: Annotated[Literal["Plan"], PlainValidator(_check_kind)]
    metadata: Metadata
    targets: Targets
    change_entries: Annotated[tuple[ChangeEntry, ...], Field(min_length=1)] = Field(alias="changes")
    policy: Policy = Policy()

    # Kept for the planner's messages ("plan.yaml:12:9: registry ... unreachable").
    _document: SourceDocument | None = PrivateAttr(default=None)

    @property
    def changes(self) -> tuple[Change, ...]:
        """The plan's changes, in file order."""
        return tuple(entry.change for entry in self.change_entries)

    def changes_of(self, kind: type[ChangeT]) -> tuple[ChangeT, ...]:
        """The changes of one kind's model class (imported from its kind's package)."""
        changes: tuple[object, ...] = self.changes
        return tuple(c for c in changes if isinstance(c, kind))

    def change_of(self, kind: type[ChangeT]) -> ChangeT | None:
        """The plan's change of a kind it holds at most once (its model class), if any."""
        return next(iter(self.changes_of(kind)), None)

    def shared_gpus(self) -> tuple[str, int] | None:
        """How a change of the plan shares each GPU (resource, slices per GPU), if one does."""
        found = (change.shared_gpus() for change in self.changes)
        return next((sharing for sharing in found if sharing is not None), None)

    def driver_version(self) -> str | None:
        """The driver version a change of the plan moves its nodes to, if one does."""
        found = (change.driver_version() for change in self.changes)
        return next((version for version in found if version is not None), None)

    def retries_failed_upgrade_of(self, node: str, labels: Mapping[str, str]) -> bool:
        """Whether a change of the plan relabels this node's driver `upgrade-failed` and
        watches it (the operator-mode driver change's `retry_failed`, the node a target): that
        label is then the node's own step's to watch, not a reason to halt or hold a release."""
        watched = any(change.watches_failed_upgrade() for change in self.changes)
        return watched and self.targets.includes(node, labels)

    @property
    def source(self) -> str:
        """The file the plan was read from ("" when built in code)."""
        return self._document.path if self._document is not None else ""

    def location_of(self, *path: PathPart) -> SourceLocation:
        """Where a field of the plan file is, e.g. `location_of("changes", 1, "registry")`."""
        if self._document is None:
            return SourceLocation(self.source or "<plan>")
        return self._document.location_of(path)


def check_changes(
    doc: SourceDocument, models: Mapping[str, type[ChangeModel]] = MODELS
) -> list[InputError]:
    """Rules across changes, checked on the raw data so they are found with every other error.

    At most one change of each kind the table does not mark repeatable; then each kind's own
    rules across its changes (its model's `check_across`: registry hosts distinct, one
    config_path), for the kinds of `models` (key -> model, the table's by default).
    """
    raw = doc.data.get("changes") if isinstance(doc.data, dict) else None
    if not isinstance(raw, list):
        return []
    errors: list[InputError] = []
    first_kind: dict[str, int] = {}
    found: dict[str, list[tuple[tuple[PathPart, ...], Any]]] = {key: [] for key in models}
    for index, item in enumerate(raw):
        if not isinstance(item, dict) or len(item) != 1:
            continue
        ((kind, body),) = item.items()
        here = ("changes", index, kind)
        if kind in first_kind and kind in KINDS and not KINDS[kind].repeatable:
            first = doc.location_of(("changes", first_kind[kind], kind), at_key=True)
            errors.append(
                InputError(
                    doc.location_of(here, at_key=True),
                    f"a second {kind!r} change (the first is at line {first.line})",
                    field=format_path(here[:2]),
                    hint="a plan has at most one change of each kind except registry;"
                    " merge them into one",
                )
            )
        first_kind.setdefault(kind, index)
        if kind in found:
            found[kind].append((here, body))
    for key, model in models.items():
        if found[key]:
            errors += model.check_across(doc, found[key])
    return errors


def parse_spec(text: str, source: str) -> Spec:
    """Validate plan text; `source` names it in error messages. InputErrors on bad input."""
    try:
        doc = SourceDocument.from_text(text, source, max_values=PLAN_MAX_VALUES)
    except InputError as exc:
        raise InputErrors([exc]) from exc
    return _spec_from_document(doc)


def load_spec(path: Path) -> Spec:
    """Read and validate plan.yaml; InputErrors (exit 2) listing every problem found."""
    try:
        doc = SourceDocument.from_path(path, max_bytes=PLAN_MAX_BYTES, max_values=PLAN_MAX_VALUES)
    except InputError as exc:
        raise InputErrors([exc]) from exc
    return _spec_from_document(doc)


def _spec_from_document(doc: SourceDocument) -> Spec:
    if not isinstance(doc.data, dict):
        raise InputErrors(
            [
                InputError(
                    doc.location_of(()),
                    f"expected a mapping (apiVersion, kind, metadata, ...) at the top level,"
                    f" found {describe_value(doc.data)}",
                    hint="see docs/plan-reference.md",
                )
            ]
        )
    errors = check_changes(doc)
    try:
        spec = Spec.model_validate(doc.data)
    except pydantic.ValidationError as exc:
        errors.extend(doc.errors_from(exc, Spec))
        raise InputErrors(sort_errors(errors)) from exc
    if errors:
        raise InputErrors(sort_errors(errors))
    spec._document = doc
    return spec
