"""`rollout facts record` on the lab (1.6, 1.7 and 2.1 nodes): `plan --facts` of what it wrote
gives the same plan as the live `plan`, and `diagnose --facts` of it the same findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from tests.examples import PLAN, REPO
from tests.lab.labapi import api_lab

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


def run_json(capsys: pytest.CaptureFixture[str], words: list[str], code: int = 0) -> Any:
    got = main(words)
    captured = capsys.readouterr()
    assert got == code, captured.err
    return json.loads(captured.out)


def test_record_then_plan_facts_equals_the_live_plan(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live_args = ["--inventory", str(lab.inventory), "--kubeconfig", str(lab.kubeconfig)]
    assert {n.containerd for n in lab.nodes} >= {"1.6", "1.7", "2.1"}
    facts = tmp_path / "facts"
    assert main(["facts", "record", str(facts), *live_args]) == 0, capsys.readouterr().err
    capsys.readouterr()
    live = run_json(capsys, ["plan", str(PLAN), *live_args, "--output", "json"])
    recorded = run_json(capsys, ["plan", str(PLAN), "--facts", str(facts), "--output", "json"])
    # where the facts came from is the one thing that differs
    for plan in (live, recorded):
        plan.pop("facts_source", None)
        plan.pop("source", None)
    assert recorded == live
    assert {p.name for p in facts.iterdir() if p.is_dir()} == {n.name for n in lab.nodes}
    healthy = run_json(capsys, ["diagnose", *live_args, "--output", "json"])
    offline = run_json(capsys, ["diagnose", "--facts", str(facts), "--output", "json"])
    assert healthy["healthy"] is True, healthy["findings"]
    assert offline == healthy


def test_record_with_a_driver_plan_keeps_its_host_driver_facts(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host-mode driver plan reads each node's packages, holds and apt candidates: recorded
    with --plan, `plan --facts` gives the live plan; recorded without, the plan says they were
    not read and how to record them."""
    live_args = ["--inventory", str(lab.inventory), "--kubeconfig", str(lab.kubeconfig)]
    driver_plan = REPO / "examples" / "driver-host.yaml"
    with_plan, without = tmp_path / "with-plan", tmp_path / "without"
    record = ["facts", "record", *live_args]
    assert main([*record, str(with_plan), "--plan", str(driver_plan)]) == 0
    assert main([*record, str(without)]) == 0
    capsys.readouterr()
    live = run_json(capsys, ["plan", str(driver_plan), *live_args, "--output", "json"])
    recorded = run_json(
        capsys, ["plan", str(driver_plan), "--facts", str(with_plan), "--output", "json"]
    )
    bare = run_json(capsys, ["plan", str(driver_plan), "--facts", str(without), "--output", "json"])
    for plan in (live, recorded, bare):
        plan.pop("facts_source", None)
        plan.pop("source", None)
    assert recorded == live
    assert "no host driver facts" not in json.dumps(live)
    assert "record them with `rollout facts record --plan PLAN`" in json.dumps(bare)
