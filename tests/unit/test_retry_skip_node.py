"""`rollout resume --skip-node`: a node that died and never comes back is left out of the rest
of the run, on the record: not probed, journalled with who asked, its step no longer in flight."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import rollout.cli.apply as cli_apply
from rollout.cli import main
from rollout.executor import RunReport
from rollout.plan import NodePlan, Plan, StepPlan, Wave, plan_to_data
from rollout.run import (
    Invocation,
    Journal,
    NodeFinished,
    NodeOutcome,
    RunHalted,
    RunOutcome,
    StepStarted,
    read_run,
)
from rollout.transports.kube import KubeClient
from tests.emulator import emulated_kube
from tests.examples import PLAN
from tests.unit.runfakes import FleetWithoutSsh

NODES = ("gpu-a-1", "gpu-a-2", "gpu-a-3")


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    with emulated_kube(None, "kube-system") as client:
        yield client


@pytest.fixture
def halted_run(tmp_path: Path) -> str:
    """A run halted while gpu-a-2's cordon was in flight (the node died under it)."""
    steps = tuple(StepPlan.acting(kind, f"{kind} it") for kind in ("preflight", "cordon"))
    nodes = tuple(NodePlan(name, "1.7.24", steps) for name in NODES)
    plan = Plan(
        name="registry-mirror",
        source=str(PLAN),
        facts_source="recorded",
        changes=("registry mirror",),
        waves=(Wave(1, nodes),),
    )
    invocation = Invocation(
        str(PLAN), PLAN.read_text(), str(tmp_path / "inv.yaml"), None, None, False
    )
    with Journal.create(
        tmp_path, plan.name, json.dumps(plan_to_data(plan)), invocation=invocation
    ) as journal:
        journal.append(StepStarted("gpu-a-2", 1, "cordon", 1))
        journal.append(RunHalted("gpu-a-2: cordon: node unreachable: connection refused"))
        return str(journal.run_id)


@pytest.fixture
def seen(kube: KubeClient, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    fleet = FleetWithoutSsh(kube, NODES)
    seen: dict[str, Any] = {"fleet": fleet}

    def gather_fleet_facts(spec: Any, runners: dict[str, Any], *_: Any, **__: Any) -> object:
        fleet.probed = sorted(runners)
        return object()

    def execute(plan: Plan, spec: Any, facts: Any, fleet: Any, journal: Journal, *_: Any) -> Any:
        seen["state"] = journal.replay()
        return RunReport(RunOutcome.SUCCEEDED, "", {})

    monkeypatch.setattr(cli_apply, "FleetConnection", fleet.connect)
    monkeypatch.setattr(cli_apply, "gather_fleet_facts", gather_fleet_facts)
    monkeypatch.setattr(cli_apply, "execute", execute)
    return seen


def test_a_skipped_node_is_recorded_and_not_probed(
    halted_run: str, seen: dict[str, Any], tmp_path: Path
) -> None:
    args = ["resume", halted_run, "--skip-node", "gpu-a-2", "--state-dir", str(tmp_path)]
    assert main(args) == 0
    assert seen["fleet"].probed == ["gpu-a-1", "gpu-a-3"]
    skipped = seen["state"].node("gpu-a-2")
    assert skipped.outcome is NodeOutcome.SKIPPED and skipped.in_flight is None
    assert "--skip-node" in skipped.outcome_reason
    journal = (tmp_path / "runs" / halted_run / "journal.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in journal]
    assert kinds[-2:] == ["run-resumed", "node-skipped"]
    assert read_run(tmp_path, halted_run).node("gpu-a-2").outcome is NodeOutcome.SKIPPED


def test_without_skip_every_node_is_probed(
    halted_run: str, seen: dict[str, Any], tmp_path: Path
) -> None:
    assert main(["resume", halted_run, "--state-dir", str(tmp_path)]) == 0
    assert seen["fleet"].probed == list(NODES)
    assert seen["state"].node("gpu-a-2").in_flight is not None  # re-checked by the step


@pytest.mark.parametrize(
    ("node", "words"), [("gpu-z-9", "not a node of run"), ("gpu-a-1", "already finished")]
)
def test_a_node_that_cannot_be_skipped_is_bad_input(
    halted_run: str,
    seen: dict[str, Any],
    tmp_path: Path,
    node: str,
    words: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if node == "gpu-a-1":
        with Journal.open(tmp_path, halted_run) as journal:
            journal.append(NodeFinished("gpu-a-1", NodeOutcome.SUCCEEDED))
    assert main(["resume", halted_run, "--skip-node", node, "--state-dir", str(tmp_path)]) == 2
    assert words in capsys.readouterr().err
    assert "state" not in seen
