"""Topology groups (rollout.topology): waves of whole groups, the per-group budget, refusals.

Wave building is checked property-style (no group split across waves for random group sizes
and wave specs); the planner on the example facts with nodes labelled into cliques; the
budget's max_unavailable_per_group; the refusal of a driver change whose budget cannot take a
whole clique down; and `rollout plan`'s text and JSON naming each wave's groups.
"""

from __future__ import annotations

import dataclasses
import io
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout.budget import GroupLimit, NodeAvailability, UnavailabilityBudget, Verdict
from rollout.cli.render import make_console, write_plan_json
from rollout.cli.render_groups import print_plan
from rollout.errors import InputErrors
from rollout.facts import FleetFacts, load_recorded_facts
from rollout.plan import Plan, TopologyGroup, plan_from_data, plan_to_data
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import Policy, load_spec
from rollout.topology import TopologyError, pack_waves
from tests.examples import FACTS, REPO, edited_plan

CLIQUE = "nvidia.com/gpu.clique"
# the example facts' four nodes in two cliques, one of them across the name order
CLIQUES = {"gpu-a-1": "c.1", "gpu-b-1": "c.1", "gpu-a-2": "c.2", "gpu-a-3": "c.2"}
POLICY = 'policy:\n  waves: [1, "50%"]\n  max_unavailable: 1\n'


def labelled_fleet(cliques: dict[str, str]) -> FleetFacts:
    fleet = load_recorded_facts(FACTS)
    nodes = tuple(
        dataclasses.replace(n, labels={**n.labels, CLIQUE: cliques[n.name]})
        if n.name in cliques
        else n
        for n in fleet.nodes
    )
    return dataclasses.replace(fleet, nodes=nodes)


def grouped_plan(tmp_path: Path, policy: str, cliques: dict[str, str] = CLIQUES) -> Plan:
    path = edited_plan(tmp_path, POLICY, policy)
    return build_plan(load_spec(path), str(path), labelled_fleet(cliques), load_playbooks())


def groups_of(sizes: list[int]) -> list[TopologyGroup]:
    groups, start = [], 0
    for number, size in enumerate(sizes):
        names = tuple(f"n{start + i:03d}" for i in range(size))
        groups.append(TopologyGroup(label=f"{CLIQUE}=c.{number}", nodes=names))
        start += size
    return groups


AMOUNTS = st.one_of(
    st.integers(min_value=1, max_value=6),
    st.integers(min_value=1, max_value=100).map(lambda p: f"{p}%"),
)


@given(
    st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=15),
    st.lists(AMOUNTS, min_size=1, max_size=4),
)
def test_no_group_is_split_across_waves(sizes: list[int], waves: list[object]) -> None:
    """Every group lies whole in exactly one wave, in order; a wave holds more than its size
    only when its one group alone is larger; no wave is empty."""
    groups = groups_of(sizes)
    packed = pack_waves(Policy.model_validate({"waves": waves}), groups)
    assert [g for _, taken in packed for g in taken] == groups
    for size, taken in packed:
        count = sum(len(g.nodes) for g in taken)
        assert taken
        assert count <= size or len(taken) == 1


@given(st.integers(min_value=0, max_value=60), st.lists(AMOUNTS, min_size=1, max_size=4))
def test_without_groups_the_waves_are_policy_waves(total: int, waves: list[object]) -> None:
    policy = Policy.model_validate({"waves": waves})
    packed = pack_waves(policy, groups_of([1] * total))
    assert [len(taken) for _, taken in packed] == policy.wave_sizes(total)


def test_the_planner_keeps_each_clique_in_one_wave_and_says_a_wave_grew(tmp_path: Path) -> None:
    plan = grouped_plan(tmp_path, POLICY + f"  group_by: {CLIQUE}\n")
    assert [[n.name for n in w.nodes] for w in plan.waves] == [
        ["gpu-a-1", "gpu-b-1"],
        ["gpu-a-2", "gpu-a-3"],
    ]
    assert [[g.label for g in w.groups] for w in plan.waves] == [
        [f"{CLIQUE}=c.1"],
        [f"{CLIQUE}=c.2"],
    ]
    assert [w.oversized for w in plan.waves] == [True, False]
    stream = io.StringIO()
    print_plan(plan, make_console(stream, color=False), False)
    lines = [line.strip() for line in stream.getvalue().splitlines()]
    wave_one = next(line for line in lines if line.startswith("wave 1:"))
    assert wave_one.endswith(
        f"topology group(s) {CLIQUE}=c.1 (2) (more than the wave's size 1, to keep a group whole)"
    )
    wave_two = next(line for line in lines if line.startswith("wave 2:"))
    assert wave_two.endswith(f"topology group(s) {CLIQUE}=c.2 (2)")
    stream = io.StringIO()
    write_plan_json(plan, stream)
    shown = json.loads(stream.getvalue())["waves"][0]
    assert shown["groups"] == [
        {"label": f"{CLIQUE}=c.1", "nodes": ["gpu-a-1", "gpu-b-1"], "max_unavailable": 0}
    ]
    assert shown["size"] == 1
    assert plan_from_data(plan_to_data(plan)).waves == plan.waves


def test_a_plan_without_group_by_keeps_its_waves_and_says_no_groups(tmp_path: Path) -> None:
    plan = grouped_plan(tmp_path, POLICY)
    assert [[n.name for n in w.nodes] for w in plan.waves] == [
        ["gpu-a-1"],
        ["gpu-a-2", "gpu-a-3"],
        ["gpu-b-1"],
    ]
    assert all(w.groups == () and not w.oversized for w in plan.waves)


def test_unlabelled_nodes_are_alone_by_default_and_refused_on_request(tmp_path: Path) -> None:
    partial = {"gpu-a-2": "c.2", "gpu-a-3": "c.2"}
    plan = grouped_plan(tmp_path, POLICY + f"  group_by: {CLIQUE}\n", partial)
    assert [[g.label or g.nodes[0] for g in w.groups] for w in plan.waves] == [
        ["gpu-a-1"],
        [f"{CLIQUE}=c.2"],
        ["gpu-b-1"],
    ]
    with pytest.raises(TopologyError, match=r"2 target node\(s\) have no .* gpu-a-1, gpu-b-1"):
        grouped_plan(tmp_path, POLICY + f"  group_by: {CLIQUE}\n  ungrouped: refuse\n", partial)


def test_a_per_group_limit_needs_group_by(tmp_path: Path) -> None:
    with pytest.raises(InputErrors, match="max_unavailable_per_group is set but group_by is not"):
        grouped_plan(tmp_path, POLICY + "  max_unavailable_per_group: 1\n")


def test_the_per_group_limit_is_resolved_per_group(tmp_path: Path) -> None:
    cliques = {**CLIQUES, "gpu-b-1": "c.3"}
    plan = grouped_plan(
        tmp_path, POLICY + f'  group_by: {CLIQUE}\n  max_unavailable_per_group: "50%"\n', cliques
    )
    limits = {g.label: g.max_unavailable for w in plan.waves for g in w.groups}
    assert limits == {f"{CLIQUE}=c.1": 1, f"{CLIQUE}=c.2": 1, f"{CLIQUE}=c.3": 1}


def driver_plan(tmp_path: Path, policy: str) -> Plan:
    source = REPO / "examples" / "driver-host.yaml"
    text = source.read_text()
    assert POLICY in text
    path = tmp_path / "driver.yaml"
    path.write_text(text.replace(POLICY, policy))
    return build_plan(load_spec(path), str(path), labelled_fleet(CLIQUES), load_playbooks())


def test_a_driver_change_is_refused_when_the_budget_cannot_take_a_clique_down(
    tmp_path: Path,
) -> None:
    """Two driver versions in one NVLink domain: a clique's nodes change together."""
    with pytest.raises(TopologyError, match=rf"max_unavailable 1 cannot take group {CLIQUE}=c.1"):
        driver_plan(tmp_path, POLICY + f"  group_by: {CLIQUE}\n")
    plan = driver_plan(
        tmp_path,
        POLICY.replace("max_unavailable: 1", "max_unavailable: 2") + f"  group_by: {CLIQUE}\n",
    )
    assert len(plan.waves) == 2
    with pytest.raises(TopologyError, match="max_unavailable_per_group 1 cannot take group"):
        driver_plan(
            tmp_path,
            POLICY.replace("max_unavailable: 1", "max_unavailable: 2")
            + f"  group_by: {CLIQUE}\n  max_unavailable_per_group: 1\n",
        )


def test_a_registry_change_needs_no_whole_clique_down(tmp_path: Path) -> None:
    plan = grouped_plan(tmp_path, POLICY + f"  group_by: {CLIQUE}\n")
    assert plan.max_unavailable == 1


NOW = datetime(2026, 1, 1, tzinfo=UTC)
GROUPS = (
    GroupLimit(f"{CLIQUE}=c.1", frozenset({"a", "b", "c"}), 1),
    GroupLimit(f"{CLIQUE}=c.2", frozenset({"d", "e"}), 1),
)


def test_the_budget_holds_max_unavailable_per_group() -> None:
    budget = UnavailabilityBudget(4, frozenset("abcde"), groups=GROUPS)
    nodes = [NodeAvailability(n, cordoned=n == "a", ready=True) for n in "abcde"]
    refused = budget.decide("b", nodes, held=(), now=NOW)
    assert refused.verdict is Verdict.HALT
    assert refused.reason == (
        "taking b down would make 2 node(s) unavailable, over max_unavailable_per_group 1 of "
        f"group {CLIQUE}=c.1 (already unavailable: a)"
    )
    assert budget.decide("d", nodes, held=(), now=NOW).verdict is Verdict.START
    assert budget.decide("d", nodes, held=("e",), now=NOW).verdict is Verdict.HALT
    # max_unavailable still holds over every group
    tight = UnavailabilityBudget(1, frozenset("abcde"), groups=GROUPS)
    assert "over max_unavailable 1 " in tight.decide("d", nodes, held=(), now=NOW).reason
