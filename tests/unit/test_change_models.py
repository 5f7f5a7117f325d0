"""Every kind's plan model is a ChangeModel in its kind's package, and the plan asks each
change what it knows (its kind's rules across its changes, the GPU sharing and the driver
version it makes, whether it watches a failed driver upgrade) without naming a kind."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from rollout.changes import KINDS, change_models
from rollout.changes.driver.model import DriverUpgradeChange
from rollout.changes.model import ChangeModel, RawChanges
from rollout.changes.timeslicing.model import TimeSlicingChange
from rollout.errors import InputError
from rollout.inputs.yamlsource import SourceDocument
from rollout.plan import Advertised
from rollout.spec import parse_spec
from rollout.spec.plan import check_changes
from tests.planning import time_slicing_plan

DRIVER_PLAN = """\
apiVersion: rollout/v1
kind: Plan
metadata: {name: driver}
targets: {nodes: [gpu-a-1]}
changes:
  - driver-upgrade: {version: "550.90.07", mode: operator, retry_failed: RETRY}
"""


def test_every_kind_model_is_a_change_model_in_its_kind_package() -> None:
    for key, model in change_models().items():
        assert issubclass(model, ChangeModel), key
        package = KINDS[key].planner.partition(":")[0]
        assert model.__module__.startswith(f"rollout.{package}."), key


class SeenChange(ChangeModel):
    """A test kind whose rule across its changes reports what it was given."""

    name: str

    def advertises(self, now: Mapping[str, int], physical: int) -> Advertised:
        return Advertised(now)

    @classmethod
    def check_across(cls, doc: SourceDocument, found: RawChanges) -> list[InputError]:
        return [InputError(doc.location_of(path), f"saw {body['name']}") for path, body in found]


def test_the_plan_gives_each_kind_its_changes_across_the_plan() -> None:
    text = "changes:\n  - seen: {name: a}\n  - other: {}\n  - seen: {name: b}\n"
    doc = SourceDocument.from_text(text, "plan.yaml")
    errors = check_changes(doc, {"seen": SeenChange})
    assert [(e.message, e.location.line) for e in errors] == [("saw a", 2), ("saw b", 4)]


def test_the_plan_reads_gpu_sharing_and_driver_version_from_its_changes() -> None:
    sharing = parse_spec(
        time_slicing_plan(name="share", targets="{nodes: [gpu-a-1]}", profile="p", replicas=4),
        "plan.yaml",
    )
    (change,) = sharing.changes_of(TimeSlicingChange)
    assert sharing.shared_gpus() == change.shared_gpus() == ("nvidia.com/gpu", 4)
    assert sharing.driver_version() is None
    assert sharing.change_of(DriverUpgradeChange) is None
    driver = parse_spec(DRIVER_PLAN.replace("RETRY", "false"), "plan.yaml")
    assert driver.driver_version() == "550.90.07"
    assert driver.shared_gpus() is None
    assert driver.change_of(DriverUpgradeChange) is driver.changes[0]


@pytest.mark.parametrize(
    ("retry", "node", "watched"),
    [("true", "gpu-a-1", True), ("true", "gpu-z-9", False), ("false", "gpu-a-1", False)],
)
def test_a_failed_upgrade_is_the_plans_to_watch_only_on_a_target_it_retries(
    retry: str, node: str, watched: bool
) -> None:
    spec = parse_spec(DRIVER_PLAN.replace("RETRY", retry), "plan.yaml")
    assert spec.retries_failed_upgrade_of(node, {}) is watched
