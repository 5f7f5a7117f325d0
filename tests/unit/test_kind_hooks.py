"""What the layers below and above the planner ask a change kind, answered by a test-only kind:
its extra node facts are read, its files outside /etc/containerd read with the node's files,
its NVIDIADriver reads asked for, its grants in the schedule's role, its cleanup done and its
notes said after a run. A new kind needs no edit of the facts, the schedule or the CLI.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest

from rollout.changes import kind_planners, node_files, node_reads, reads_nvidia_drivers
from rollout.changes.base import ChangeKindPlanner
from rollout.cli.runsummary import report_run
from rollout.commands import CommandRunner
from rollout.containerd import ContainerdVersion
from rollout.executor import RunReport
from rollout.fact import ProbeFailed
from rollout.facts import load_recorded_facts
from rollout.facts.extra import NodeRead, with_hosts_files, with_plan_facts
from rollout.plan import Plan
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.rbac import Grant
from rollout.run import Journal, RunOutcome
from rollout.run.state import RunState
from rollout.schedule.permissions import RUN_GRANTS, grants_for
from rollout.spec import Spec, parse_spec
from rollout.steps import step_traits
from tests.examples import FACTS, PLAN
from tests.fakes import ScriptedRunner
from tests.node_facts import CONFIG_TOML, containerd_node
from tests.unit.test_change_kinds import ECHO_BOOK, EchoKind, echo_spec
from tests.unit.test_hosts_outside_facts import VERSION, file_dump
from tests.unit.test_steps_node import failed

ECHO_FILE = "/opt/echo/echo.toml"
ECHO_GRANT = Grant("example.com", "echoes", "patch", "echo-system")


class HookedEchoKind(EchoKind):
    """The echo kind answering every hook: what a new kind says of itself."""

    key: ClassVar[str] = "echo"

    def __init__(self, read: Any = None) -> None:
        super().__init__()
        self.read = read or (lambda runner: f"echo kernel of {runner.host}")
        self.cleaned: list[tuple[str, ...]] = []

    def node_reads(self, change: Any) -> tuple[NodeRead, ...]:
        return (NodeRead("driver_kernel", self.read, "the echo kernels"),)

    def node_files(self, change: Any) -> tuple[str, ...]:
        return (ECHO_FILE,)

    def reads_nvidia_drivers(self, change: Any) -> bool:
        return True

    def grants(self, change: Any, step_kinds: Collection[str]) -> tuple[Grant, ...]:
        return (ECHO_GRANT,) if "preflight" in step_kinds else ()

    def clean_up_run(
        self, change: Any, plan: Plan, runners: Mapping[str, CommandRunner], run_id: str
    ) -> dict[str, str]:
        self.cleaned.append((run_id, *sorted(runners)))
        return {"gpu-a-1": "echo label not removed: the node did not answer"}

    def run_notes(
        self, change: Any, plan: Plan, spec: Any, outcome: str, state: RunState
    ) -> list[str]:
        acted = state.first_acted({"preflight"})
        return [f"echo {change.value}: the run {outcome}, preflight acted: {acted is not None}"]


def planners(kind: ChangeKindPlanner) -> dict[str, ChangeKindPlanner]:
    return {**kind_planners(), "echo": kind}


def test_the_kinds_table_asks_each_changes_kind() -> None:
    spec, kind = echo_spec(), HookedEchoKind()
    assert [r.what for r in node_reads(spec.changes, planners(kind))] == ["the echo kernels"]
    assert node_files(spec.changes, planners(kind)) == (ECHO_FILE,)
    assert reads_nvidia_drivers(spec.changes, planners(kind))
    # the same plan's kind without the hooks: the defaults ask for nothing
    plain = planners(EchoKind())
    assert (node_reads(spec.changes, plain), node_files(spec.changes, plain)) == ([], ())
    assert not reads_nvidia_drivers(spec.changes, plain)


def test_a_kinds_node_facts_are_read_on_every_node() -> None:
    nodes = list(load_recorded_facts(FACTS).nodes)
    runners = {n.name: ScriptedRunner(name=n.name) for n in nodes}
    read = with_plan_facts(echo_spec(), runners, nodes, 8, planners(HookedEchoKind()))
    assert [str(n.driver_kernel) for n in read] == [f"echo kernel of {n.name}" for n in nodes]
    # a plan whose kinds read nothing more leaves the nodes as they are
    assert with_plan_facts(echo_spec(), runners, nodes, 8, planners(EchoKind())) == nodes


def test_a_node_that_cannot_be_read_fails_the_gathering_named_by_the_kind() -> None:
    def refuse(runner: CommandRunner) -> str:
        raise ProbeFailed(f"{runner.host} refused")

    nodes = list(load_recorded_facts(FACTS).nodes)[:1]
    runners = {n.name: ScriptedRunner(name=n.name) for n in nodes}
    with pytest.raises(ProbeFailed, match="could not read the echo kernels:\n  gpu-a-1: "):
        with_plan_facts(echo_spec(), runners, nodes, 8, planners(HookedEchoKind(refuse)))


def test_a_kinds_files_are_read_with_the_nodes_files() -> None:
    runner = ScriptedRunner(name="n1").on(
        ["sh", "-c"], file_dump({CONFIG_TOML: "version = 2\n", ECHO_FILE: "echo = 1\n"})
    )
    node = dataclasses.replace(
        containerd_node("n1"), containerd=ContainerdVersion.from_output(VERSION)
    )
    (read,) = with_hosts_files(echo_spec(), {"n1": runner}, [node], 8, planners(HookedEchoKind()))
    assert read.config_files.files[ECHO_FILE] == "echo = 1\n"
    (call,) = runner.calls
    assert ECHO_FILE in " ".join(call)


def playbooks() -> dict[str, Any]:
    return {**load_playbooks(), "echo": ECHO_BOOK}


def test_a_kinds_grants_are_in_the_schedules_role() -> None:
    spec = echo_spec()
    granted = grants_for(spec, playbooks(), planners(HookedEchoKind()))
    assert ECHO_GRANT in granted
    assert set(granted) == set(RUN_GRANTS) | {ECHO_GRANT} | set(grants_of_preflight())
    assert ECHO_GRANT not in grants_for(spec, playbooks(), planners(EchoKind()))


def grants_of_preflight() -> tuple[Grant, ...]:
    return step_traits()["preflight"].grants


def echo_plan(kind: ChangeKindPlanner) -> tuple[Spec, Plan]:
    spec = echo_spec()
    fleet = load_recorded_facts(FACTS)
    return spec, build_plan(spec, "plan.yaml", fleet, playbooks(), kinds=planners(kind))


@pytest.mark.parametrize("output", ["text", "json"])
def test_a_kinds_cleanup_is_done_and_its_notes_said_after_a_run(
    output: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kind = HookedEchoKind()
    spec, plan = echo_plan(kind)
    report = RunReport(RunOutcome.HALTED, "a gate failed", {})
    runners = {"gpu-a-1": ScriptedRunner(name="gpu-a-1")}
    said: list[str] = []
    with Journal.create(tmp_path, plan.name, "{}") as journal:
        capsys.readouterr()
        report_run(plan, spec, report, journal, runners, output, said.append, {"echo": kind})
        run_id = str(journal.run_id)
    out = capsys.readouterr().out
    assert kind.cleaned == [(run_id, "gpu-a-1")]
    assert said == ["gpu-a-1: echo label not removed: the node did not answer"]
    note = "echo on: the run halted, preflight acted: False"
    if output == "json":
        assert json.loads(out)["notes"] == [note]
    else:
        assert note in out


def test_the_registered_kinds_remove_the_runs_staging_and_say_no_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example registry plan's run: the containerd kind removes the run's staging on every
    node with files, a node it cannot reach said with its reason; no kind has a note."""
    spec = parse_spec(PLAN.read_text(), str(PLAN))
    plan = build_plan(spec, str(PLAN), load_recorded_facts(FACTS), load_playbooks())
    staged = [n.name for n in plan.nodes if n.files]
    assert staged
    runners = {name: ScriptedRunner(name=name).on(["sh", "-c"], "") for name in staged}
    runners[staged[0]] = ScriptedRunner(name=staged[0]).on(
        ["sh", "-c"], failed(1, "rm: read-only file system")
    )
    said: list[str] = []
    with Journal.create(tmp_path, plan.name, "{}") as journal:
        capsys.readouterr()
        report = RunReport(RunOutcome.SUCCEEDED, "", {})
        report_run(plan, spec, report, journal, runners, "json", said.append)
        run_id = str(journal.run_id)
    assert "notes" not in json.loads(capsys.readouterr().out)
    (problem,) = said
    assert problem.startswith(f"{staged[0]}: staging not removed: ")
    assert "read-only" in problem
    assert all(runners[name].ran("rollout-unstage", run_id) for name in staged[1:])
