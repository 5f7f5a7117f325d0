"""`-` in place of a plan file reads the plan from standard input, and names it `<stdin>`."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

import rollout.cli.apply as cli_apply
import rollout.cli.plan as cli_plan
from rollout.cli import main
from rollout.executor import RunReport
from rollout.facts import load_recorded_facts
from rollout.plan import Plan
from rollout.run import RunOutcome
from rollout.savedplan import read_saved_plan
from tests.emulator import emulated_kube
from tests.examples import FACTS, PLAN, REPO
from tests.unit.runfakes import FleetWithoutSsh

INVENTORY = REPO / "inventory" / "example.yaml"


def pipe_in(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """Standard input as a pipe holding `text` (no terminal, no size known in advance)."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_plan_from_stdin_is_the_plan_from_its_file(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "-o", "json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    pipe_in(monkeypatch, PLAN.read_text())
    assert main(["plan", "-", "--facts", str(FACTS), "-o", "json"]) == 0
    from_stdin = json.loads(capsys.readouterr().out)
    assert from_stdin["source"] == "<stdin>"
    assert from_stdin | {"source": from_file["source"]} == from_file


def test_a_bad_plan_on_stdin_is_named_with_line_and_field(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe_in(monkeypatch, PLAN.read_text().replace("max_unavailable: 1", "max_unavailable: -1"))
    assert main(["plan", "-", "--facts", str(FACTS)]) == 2
    line = PLAN.read_text().splitlines().index("  max_unavailable: 1") + 1
    err = capsys.readouterr().err
    assert f"<stdin>:{line}:" in err
    assert "policy.max_unavailable" in err


def test_stdin_over_the_size_limit_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pipe_in(monkeypatch, "#" * (1024 * 1024 + 1))
    assert main(["plan", "-", "--facts", str(FACTS)]) == 2
    assert "<stdin>: the file is 1.0 MiB (1048577 bytes), over the 1 MiB limit" in (
        capsys.readouterr().err
    )


def test_plan_out_saves_the_text_read_from_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # standard input is read once: the saved plan holds the text planned, not an empty re-read
    saved = tmp_path / "plan.saved"
    pipe_in(monkeypatch, PLAN.read_text())
    assert main(["plan", "-", "--facts", str(FACTS), "--out", str(saved), "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert main(["show", str(saved), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["waves"] == shown["waves"]
    kept = read_saved_plan(saved)
    assert (kept.spec_source, kept.spec_text) == ("<stdin>", PLAN.read_text())


def test_apply_from_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with emulated_kube(None, "kube-system") as kube:
        fleet = FleetWithoutSsh(kube, ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"])
        monkeypatch.setattr(fleet, "gather", lambda *_, **__: load_recorded_facts(FACTS))
        monkeypatch.setattr(cli_plan, "FleetConnection", fleet.connect)
        ran: list[list[str]] = []

        def execute(plan: Plan, *_: object) -> RunReport:
            ran.append([node.name for node in plan.nodes])
            return RunReport(RunOutcome.SUCCEEDED, "", {})

        monkeypatch.setattr(cli_apply, "execute", execute)
        state = ["--state-dir", str(tmp_path / "state")]
        pipe_in(monkeypatch, PLAN.read_text())
        words = ["apply", "-", "-i", str(tmp_path / "inventory.yaml"), *state, "--yes"]
        assert main([*words, "--limit", "gpu-b-1", "-o", "json"]) == 0
    assert ran == [["gpu-b-1"]]
    capsys.readouterr()
    assert main(["status", *state, "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"] == "registry-mirror"


def test_schedule_from_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    image = "rollout@sha256:" + "0" * 64
    words = ["--image", image, "-i", str(INVENTORY), "--cron", "0 2 * * *", "-o", "json"]
    assert main(["schedule", str(PLAN), *words]) == 0
    from_file = capsys.readouterr().out
    pipe_in(monkeypatch, PLAN.read_text())
    assert main(["schedule", "-", *words]) == 0
    assert capsys.readouterr().out == from_file


def test_a_saved_plan_refuses_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    saved = tmp_path / "plan.saved"
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--out", str(saved)]) == 0
    capsys.readouterr()
    words = ["apply", str(saved), "-i", str(INVENTORY), "--yes", "--limit", "gpu-a-1"]
    assert main(words) == 2
    assert "a saved plan runs as it was reviewed; plan again with --limit" in (
        capsys.readouterr().err
    )
    pipe_in(monkeypatch, saved.read_text())  # the same from standard input
    assert main(["apply", "-", *words[2:]]) == 2
    assert "a saved plan runs as it was reviewed" in capsys.readouterr().err
