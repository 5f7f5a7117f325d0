"""The command line a reviewer and a CI job reach for: --color under a terminal, -o yaml,
a plan read from standard input, status -o json/yaml, status --schedule given a plan file."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import rollout.cli.apply as cli_apply
import rollout.cli.facts as cli_facts
import rollout.cli.plan as cli_plan
from rollout.cli import main
from rollout.cli.status import scheduled_plan_name
from rollout.executor import RunReport
from rollout.facts import FleetFacts, load_recorded_facts
from rollout.plan import Plan
from rollout.run import RunOutcome
from rollout.transports.kube import KubeClient
from tests.emulator import emulated_kube
from tests.examples import FACTS, PLAN
from tests.unit.runfakes import FleetWithoutSsh

ESCAPE = b"\x1b["


def run_on_terminal(*words: str) -> tuple[int, bytes]:
    """Run `rollout WORDS` with its output on a pseudo-terminal; its exit code and output."""
    main, child = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "rollout", *words],
        stdin=child,
        stdout=child,
        stderr=child,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm-256color"},
    )
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the terminal closed: the child has exited
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    return process.wait(timeout=120), b"".join(chunks)


@pytest.mark.parametrize(
    ("words", "exit_code"),
    [
        (("plan", str(PLAN), "--facts", str(FACTS)), 0),
        # the example fleet has a broken node: diagnose exits 1
        (("diagnose", "--facts", str(FACTS)), 1),
    ],
    ids=["plan", "diagnose"],
)
def test_color_never_on_a_terminal_writes_no_escape(words: tuple[str, ...], exit_code: int) -> None:
    _, coloured = run_on_terminal(*words, "--color", "auto")
    assert ESCAPE in coloured  # a terminal indeed: auto colours it
    code, plain = run_on_terminal(*words, "--color", "never")
    assert code == exit_code
    assert ESCAPE not in plain
    assert b"gpu-a-3" in plain


def plan_json(capsys: pytest.CaptureFixture[str], *words: str) -> dict[str, Any]:
    assert main(["plan", str(PLAN), "--facts", str(FACTS), *words, "-o", "json"]) == 0
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return data


def planned(data: dict[str, Any]) -> list[str]:
    return [n["name"] for wave in data["waves"] for n in wave["nodes"]]


@pytest.mark.parametrize(
    ("limit", "nodes"),
    [
        ("gpu-a-1", ["gpu-a-1"]),
        ("gpu-a-1,gpu-b-1", ["gpu-a-1", "gpu-b-1"]),
        ("gpu-a-1:gpu-b-1", ["gpu-a-1", "gpu-b-1"]),
        ("gpu-a-*", ["gpu-a-1", "gpu-a-2", "gpu-a-3"]),
        ("gpu-a-*,!gpu-a-2", ["gpu-a-1", "gpu-a-3"]),
        ("!gpu-a-2", ["gpu-a-1", "gpu-a-3", "gpu-b-1"]),
        ("node-pool=gpu-b", ["gpu-b-1"]),
        ("node-pool!=gpu-b", ["gpu-a-1", "gpu-a-2", "gpu-a-3"]),
        ("gpu-?-3,&node-pool=gpu-a", ["gpu-a-3"]),
    ],
)
def test_limit_intersects_the_targets(
    capsys: pytest.CaptureFixture[str], limit: str, nodes: list[str]
) -> None:
    data = plan_json(capsys, "--limit", limit)
    assert planned(data) == nodes
    assert data["limit"] == limit
    everyone = ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"]
    assert data["limited_out"] == [n for n in everyone if n not in nodes]
    assert data["not_targeted"] == []


def test_limit_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listed = tmp_path / "canaries"
    listed.write_text("# the canaries\ngpu-a-2\n\ngpu-b-*  # and the B pool\n")
    data = plan_json(capsys, "-l", f"@{listed},!gpu-b-1")
    assert planned(data) == ["gpu-a-2"]


def test_limit_is_stated_in_text_and_markdown(capsys: pytest.CaptureFixture[str]) -> None:
    note = "limited to node-pool=gpu-a: 3 of the plan's 4 target node(s); 1 left out"
    for output in ("text", "markdown"):
        words = ["plan", str(PLAN), "--facts", str(FACTS), "-l", "node-pool=gpu-a", "-o", output]
        assert main([*words, "--color", "never"] if output == "text" else words) == 0
        assert note in capsys.readouterr().out
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--color", "never"]) == 0
    assert "limited to" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ("gpu-x-1", "--limit gpu-x-1: gpu-x-1 not a node of"),
        ("gpu-z-*", "--limit gpu-z-* leaves none of the plan's 4 target node(s)"),
        ("!gpu-*", "leaves none of the plan's 4 target node(s)"),
        ("node-pool=a=b", "--limit node-pool=a=b:"),
        ("@missing-limit-file", "--limit @missing-limit-file: cannot read it"),
        (",", "no pattern"),
    ],
)
def test_bad_limit_exits_2(capsys: pytest.CaptureFixture[str], limit: str, message: str) -> None:
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--limit", limit]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    with emulated_kube(None, "kube-system") as client:
        yield client


def test_apply_limit_runs_the_limited_nodes_only(
    kube: KubeClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet = FleetWithoutSsh(kube, ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"])
    monkeypatch.setattr(fleet, "gather", lambda *_, **__: load_recorded_facts(FACTS))
    monkeypatch.setattr(cli_plan, "FleetConnection", fleet.connect)
    ran: list[list[str]] = []

    def execute(plan: Plan, *_: object) -> RunReport:
        ran.append([node.name for node in plan.nodes])
        return RunReport(RunOutcome.SUCCEEDED, "", {})

    monkeypatch.setattr(cli_apply, "execute", execute)
    inventory = tmp_path / "inventory.yaml"
    state = ["--state-dir", str(tmp_path / "state")]
    words = ["apply", str(PLAN), "-i", str(inventory), *state, "--yes", "-o", "json"]
    assert main([*words, "--limit", "gpu-a-*,!gpu-a-2"]) == 0
    assert ran == [["gpu-a-1", "gpu-a-3"]]
    capsys.readouterr()
    # the run keeps the limited plan: status -o json|yaml says so
    for output, load in (("json", json.loads), ("yaml", yaml.safe_load)):
        assert main(["status", *state, "-o", output]) == 0
        status = load(capsys.readouterr().out)
        assert status["plan"] == "registry-mirror"
        assert [n["name"] for n in status["nodes"]] == ["gpu-a-1", "gpu-a-3"]
        assert status["nodes_left"] == 2
        assert main(["status", *state, "--all", "-o", output]) == 0
        assert [r["plan"] for r in load(capsys.readouterr().out)["runs"]] == ["registry-mirror"]


def test_status_schedule_reads_the_name_of_a_plan_file() -> None:
    assert scheduled_plan_name(str(PLAN)) == "registry-mirror"
    assert scheduled_plan_name("registry-mirror") == "registry-mirror"


def test_diagnose_limit(capsys: pytest.CaptureFixture[str]) -> None:
    # gpu-a-3 is the broken node: left out, the rest is healthy
    words = ["diagnose", "--facts", str(FACTS), "-o", "json"]
    assert main([*words, "--limit", "node-pool=gpu-a,!gpu-a-3"]) == 0
    assert json.loads(capsys.readouterr().out)["nodes"] == ["gpu-a-1", "gpu-a-2"]
    assert main([*words, "--limit", "gpu-a-[23]"]) == 1
    assert json.loads(capsys.readouterr().out)["nodes"] == ["gpu-a-2", "gpu-a-3"]
    assert main([*words, "--limit", "gpu-a-9"]) == 2
    assert "gpu-a-9 not a node of" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("limit", "probed", "recorded"),
    [
        # names alone decide: only those nodes are probed
        ("gpu-a-1,gpu-b-*", ["gpu-a-1", "gpu-b-1"], ["gpu-a-1", "gpu-b-1"]),
        # a label selector is decided on the labels read: every node is probed
        ("node-pool=gpu-b", ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"], ["gpu-b-1"]),
    ],
)
def test_facts_record_limit(
    kube: KubeClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    limit: str,
    probed: list[str],
    recorded: list[str],
) -> None:
    fleet = FleetWithoutSsh(kube, ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"])
    monkeypatch.setattr(cli_plan, "FleetConnection", fleet.connect)
    asked: list[list[str]] = []

    def gather(runners: dict[str, object], *_: object, **__: object) -> tuple[FleetFacts, dict]:
        asked.append(sorted(runners))
        facts = load_recorded_facts(FACTS)
        nodes = tuple(n for n in facts.nodes if n.name in runners)
        return dataclasses.replace(facts, nodes=nodes), {}

    monkeypatch.setattr(cli_facts, "gather_diagnosis_facts", gather)
    out = tmp_path / "recorded"
    words = ["facts", "record", str(out), "-i", str(tmp_path / "inventory.yaml")]
    assert main([*words, "--limit", limit]) == 0
    assert asked == [probed]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == recorded


@pytest.mark.parametrize(
    "words",
    [
        ["plan", str(PLAN), "--facts", str(FACTS)],
        ["diagnose", "--facts", str(FACTS)],
    ],
    ids=["plan", "diagnose"],
)
def test_yaml_is_the_json_data(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    main([*words, "-o", "json"])
    as_json = json.loads(capsys.readouterr().out)
    main([*words, "-o", "yaml"])
    text = capsys.readouterr().out
    assert yaml.safe_load(text) == as_json
    if words[0] == "plan":  # file texts read as blocks of lines (a diff's " " lines cannot)
        assert "after: |" in text


def test_show_yaml_is_the_json_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = tmp_path / "plan.saved"
    assert main(["plan", str(PLAN), "--facts", str(FACTS), "--out", str(saved), "-o", "json"]) == 0
    capsys.readouterr()
    assert main(["show", str(saved), "-o", "json"]) == 0
    as_json = json.loads(capsys.readouterr().out)
    assert main(["show", str(saved), "-o", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == as_json


def test_diagnose_names_only_the_nodes_with_findings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagnose", "--facts", str(FACTS), "--color", "never"]) == 1
    header = capsys.readouterr().out.splitlines()[0]
    assert header == "Diagnosis of 4 node(s): NOT healthy; findings on gpu-a-3"
    assert main(["diagnose", "--facts", str(FACTS), "-o", "markdown"]) == 1
    markdown = capsys.readouterr().out
    assert "4 node(s) checked: **not healthy**; findings on `gpu-a-3`" in markdown
    # the commands copy and paste as they are: fenced, no \\| escape
    assert "```sh\nssh gpu-a-3 containerd config dump | grep -A2 'runtimes\\.'\n```" in markdown
    assert "\\|" not in markdown.split("## ", 1)[1]


def test_fix_plan_says_why_its_change_repairs_what(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fix = tmp_path / "fix.yaml"
    assert main(["diagnose", "--facts", str(FACTS), "--fix", str(fix)]) == 1
    text = fix.read_text()
    # above the change: the findings it answers (their cause) and how it repairs them
    comment = text.partition("\nchanges:\n")[2].partition("\n- containerd:")[0]
    assert comment.startswith(
        "# repairs runtime.shadowing on gpu-a-3: /etc/containerd/conf.d/registry.toml replaces"
    )
    assert "# repairs runtime.handler-missing on gpu-a-3: containerd on gpu-a-3" in comment
    assert "# how: the last file setting the CRI table must carry the whole table" in comment
    assert all(line.startswith("#") and len(line) <= 100 for line in comment.splitlines())
    # still a plan `rollout plan` takes, repairing the node the comment names
    capsys.readouterr()
    assert main(["plan", str(fix), "--facts", str(FACTS), "-o", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [n["name"] for w in plan["waves"] for n in w["nodes"]] == ["gpu-a-3"]
