"""`rollout facts record` on the lab (1.6, 1.7 and 2.1 nodes): `plan --facts` of what it wrote
gives the same plan as the live `plan`, and `diagnose --facts` of it the same findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from tests.examples import PLAN
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
