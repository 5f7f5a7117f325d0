"""A registry change's hosts.toml under a config_path outside /etc/containerd: the facts read
it (live, and `facts record --plan` records it), so the plan's diff starts from the node's
file and the write step's drift check finds what the plan was made from."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.containerd import ContainerdVersion
from rollout.facts import ClusterFacts, FleetFacts, NodeFacts
from rollout.facts.extra import with_hosts_files, with_plan_facts
from rollout.facts.recording import record_fleet
from rollout.plan import Plan
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import Spec, parse_spec
from tests.fakes import ScriptedRunner
from tests.node_facts import CONFIG_TOML, containerd_node

VERSION = "containerd github.com/containerd/containerd 1.7.24 61f9fd8\n"
HOSTS = "/etc/docker/certs.d/docker.io/hosts.toml"
NODE_HOSTS = 'server = "https://registry-1.docker.io"\n'
PLAN = """apiVersion: rollout/v1
kind: Plan
metadata: {name: mirror}
targets: {nodes: [n1]}
changes:
  - registry:
      host: docker.io
      config_path: /etc/docker/certs.d
      allow_paths_outside: true
      endpoints: [{url: "https://mirror.internal:5000"}]
"""


def file_dump(files: dict[str, str]) -> str:
    """What the files fact's `sh -c` prints: path NUL content NUL, ..."""
    return "".join(f"{path}\0{text}\0" for path, text in files.items())


def read_nodes(spec: Spec, node_hosts: str | None) -> tuple[list[NodeFacts], ScriptedRunner]:
    files = {CONFIG_TOML: "version = 2\n"}
    if node_hosts is not None:
        files[HOSTS] = node_hosts
    runner = ScriptedRunner(name="n1").on(["sh", "-c"], file_dump(files))
    node = replace(containerd_node("n1"), containerd=ContainerdVersion.from_output(VERSION))
    # the record path (`facts record --plan`): files read without the plan, read again with it
    return with_hosts_files(spec, {"n1": runner}, [node], 8), runner


def plan_of(spec: Spec, nodes: list[NodeFacts]) -> Plan:
    fleet = FleetFacts(nodes=tuple(nodes), cluster=ClusterFacts(), source="unit facts")
    return build_plan(spec, "plan.yaml", fleet, load_playbooks())


def test_an_existing_hosts_toml_outside_etc_containerd_is_the_plans_before() -> None:
    spec = parse_spec(PLAN, "plan.yaml")
    nodes, runner = read_nodes(spec, NODE_HOSTS)
    (call,) = runner.calls
    assert call[-1] == HOSTS  # read by path, wherever it lies
    assert nodes[0].config_files.files[HOSTS] == NODE_HOSTS
    (node,) = plan_of(spec, nodes).nodes
    (change,) = [f for f in node.files if f.path == HOSTS]
    assert change.before == NODE_HOSTS
    assert change.after.startswith(NODE_HOSTS)
    assert '[host."https://mirror.internal:5000"]' in change.after


def test_a_missing_hosts_toml_outside_etc_containerd_is_a_new_file() -> None:
    spec = parse_spec(PLAN, "plan.yaml")
    nodes, _ = read_nodes(spec, None)
    assert HOSTS not in nodes[0].config_files.files
    (node,) = plan_of(spec, nodes).nodes
    (change,) = [f for f in node.files if f.path == HOSTS]
    assert change.before is None


def test_recorded_facts_keep_it_and_plan_the_same_diff(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = parse_spec(PLAN, "plan.yaml")
    nodes, _ = read_nodes(spec, NODE_HOSTS)
    facts = tmp_path / "facts"
    record_fleet(FleetFacts(nodes=tuple(nodes), cluster=ClusterFacts(), source="unit"), facts)
    assert (facts / "n1/files" / HOSTS.lstrip("/")).read_text() == NODE_HOSTS
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    assert main(["plan", str(plan), "--facts", str(facts), "--output", "json"]) == 0
    assert '"before": "server = \\"https://registry-1.docker.io\\"\\n"' in capsys.readouterr().out


def test_a_hosts_toml_under_a_custom_config_path_is_no_unloaded_config() -> None:
    custom = "/srv/mirrors/docker.io/hosts.toml"
    spec = parse_spec(PLAN.replace("/etc/docker/certs.d", "/srv/mirrors"), "plan.yaml")
    runner = ScriptedRunner(name="n1").on(
        ["sh", "-c"], file_dump({CONFIG_TOML: "version = 2\n", custom: NODE_HOSTS})
    )
    node = replace(containerd_node("n1"), containerd=ContainerdVersion.from_output(VERSION))
    (planned,) = plan_of(spec, with_hosts_files(spec, {"n1": runner}, [node], 8)).nodes
    assert [f.before for f in planned.files if f.path == custom] == [NODE_HOSTS]
    assert planned.shadowing == ()  # not "imported by nothing"


def test_a_plans_gathering_reads_them_in_its_one_probe_of_the_node(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Live planning asks for the outside hosts.toml in the node's one probe (the same round
    trip, on the connection it then closes), and reads the node's files no second time."""
    from rollout.facts import live
    from tests.unit.test_live_gathering import Kube, Runner, probe_waiting_for

    asked: list[tuple[str, ...]] = []
    kube = Kube()
    fake = probe_waiting_for(kube)

    def probe_node(runner: Runner, main_path: str = "", also: tuple[str, ...] = ()) -> object:
        asked.append(also)
        return fake(runner, main_path, also)

    monkeypatch.setattr(live, "probe_node", probe_node)
    spec = parse_spec(PLAN.replace("targets: {nodes: [n1]}", "targets: {nodes: [n1, n2]}"), "p")
    silent = {name: ScriptedRunner(name=name) for name in ("n1", "n2")}
    fleet = live.gather_fleet_facts(spec, silent, kube)  # type: ignore[arg-type]
    assert asked == [(HOSTS,), (HOSTS,)]
    assert [n.name for n in fleet.nodes] == ["n1", "n2"]
    assert all(not r.calls for r in silent.values())  # nothing read after the probe
    assert with_plan_facts(spec, silent, list(fleet.nodes)) == list(fleet.nodes)
