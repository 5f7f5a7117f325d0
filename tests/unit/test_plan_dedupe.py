"""The planner's memo (one engine run per distinct node configuration) changes no plan.

`rollout plan` output of the examples is the same, byte for byte, with and without the memo;
over generated fleets (the example nodes copied, some with edited files or another version)
the deduplicated plan equals the one computed node by node, errors included.
"""

from __future__ import annotations

import dataclasses
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollout.changes import kind_planners
from rollout.changes.base import ChangeKindPlanner
from rollout.changes.containerd import engineruns as containerd_plans
from rollout.changes.containerd.engineruns import ContainerdPlans
from rollout.changes.containerd.kind import ContainerdKind, RegistryKind
from rollout.cli.render import make_console, plan_to_json, plan_to_markdown, print_plan_text
from rollout.containerd import ContainerdVersion
from rollout.errors import RolloutError
from rollout.facts import FleetFacts, NodeFacts, load_recorded_facts
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec.plan import parse_spec
from tests.examples import FACTS, PLAN

SETTINGS_PLAN = """\
apiVersion: rollout/v1
kind: Plan
metadata: {name: settings}
targets: {selector: nvidia.com/gpu.present=true}
changes:
  - containerd:
      settings:
        max_concurrent_downloads: 7
"""


def counting_kinds(
    *, deduplicate: bool = True
) -> tuple[dict[str, ChangeKindPlanner], list[ContainerdPlans]]:
    """The registered kinds, registry and containerd listing the engine runs of each plan
    made with them (ContainerdPlans.runs): the kinds, and that list."""
    made: list[ContainerdPlans] = []
    kinds = {
        **kind_planners(),
        "registry": RegistryKind(deduplicate=deduplicate, plans_made=made),
        "containerd": ContainerdKind(deduplicate=deduplicate, plans_made=made),
    }
    return kinds, made


def test_the_examples_plan_the_same_with_and_without_the_memo() -> None:
    fleet = load_recorded_facts(FACTS)
    reference_kinds, _ = counting_kinds(deduplicate=False)
    reference = render_all(PLAN.read_text(), fleet, reference_kinds)
    kinds, made = counting_kinds()
    assert render_all(PLAN.read_text(), fleet, kinds) == reference
    assert [p.runs for p in made] == [4]  # four example nodes, four distinct configurations
    # planned again, the same: a plan keeps nothing for the next one
    assert render_all(PLAN.read_text(), fleet, kinds) == reference
    assert [p.runs for p in made] == [4, 4]


def test_copies_of_a_node_cost_one_engine_run() -> None:
    fleet = load_recorded_facts(FACTS)
    copies = tuple(
        dataclasses.replace(node, name=f"{node.name}-{i}") for node in fleet.nodes for i in range(5)
    )
    spec = parse_spec(PLAN.read_text(), str(PLAN))
    kinds, made = counting_kinds()
    plan = build_plan(
        spec, str(PLAN), dataclasses.replace(fleet, nodes=copies), load_playbooks(), kinds=kinds
    )
    assert [p.runs for p in made] == [len(fleet.nodes)]
    assert sum(len(w.nodes) for w in plan.waves) == len(copies)


# Edits that keep a node's config loadable but make it another configuration (or not).
EDITS = ("none", "comment", "oom_score", "drop_registry", "other_patch")


def edit_node(node: NodeFacts, name: str, edit: str, number: int) -> NodeFacts:
    files = node.config_files
    main_path = files.main_path
    if edit == "comment":  # another text, the same config
        files = files.with_file(main_path, files.files[main_path] + f"\n# copy {number}\n")
    elif edit == "oom_score":  # another config
        files = files.with_file(main_path, f"oom_score = {number}\n" + files.files[main_path])
    elif edit == "drop_registry":
        registry = "/etc/containerd/conf.d/registry.toml"
        if registry in files.files:
            files = files.without_file(registry)
    version = node.containerd
    if edit == "other_patch":  # the same series, another release: another input
        version = ContainerdVersion(
            version.major, version.minor, version.patch + 1, raw=version.raw + " (patched)"
        )
    return dataclasses.replace(node, name=name, config_files=files, containerd=version)


# A generated fleet: per node, which example node it copies, the edit and its number.
fleet_shapes = st.lists(
    st.tuples(st.integers(0, 3), st.sampled_from(EDITS), st.integers(0, 3)),
    min_size=1,
    max_size=12,
)


def generated_fleet(shape: list[tuple[int, str, int]]) -> FleetFacts:
    """The example fleet's nodes copied and edited as `shape` says, named node-00, node-01..."""
    examples = load_recorded_facts(FACTS)
    nodes = tuple(
        edit_node(examples.nodes[which], f"node-{index:02d}", edit, number)
        for index, (which, edit, number) in enumerate(shape)
    )
    return dataclasses.replace(examples, nodes=nodes)


def render_all(
    spec_text: str, fleet: FleetFacts, kinds: dict[str, ChangeKindPlanner]
) -> tuple[str, ...] | str:
    """Every output of the plan, or the error it stops with."""
    spec = parse_spec(spec_text, "plan.yaml")
    try:
        plan = build_plan(spec, "plan.yaml", fleet, load_playbooks(), kinds=kinds)
    except RolloutError as exc:
        return f"{type(exc).__name__}: {exc}"
    text = io.StringIO()
    print_plan_text(plan, make_console(text, False))
    return plan_to_json(plan), plan_to_markdown(plan), text.getvalue()


def render_with_and_without_memo(
    spec_text: str, fleet: FleetFacts
) -> tuple[tuple[str, ...] | str, tuple[str, ...] | str, ContainerdPlans]:
    """render_all computed node by node, then with the memo; and that plan's memo."""
    reference_kinds, _ = counting_kinds(deduplicate=False)
    kinds, made = counting_kinds()
    reference = render_all(spec_text, fleet, reference_kinds)
    deduplicated = render_all(spec_text, fleet, kinds)
    return reference, deduplicated, made[0] if made else ContainerdPlans()


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(shape=fleet_shapes, settings_plan=st.booleans())
def test_a_generated_fleet_plans_the_same_deduplicated(
    shape: list[tuple[int, str, int]], settings_plan: bool
) -> None:
    fleet = generated_fleet(shape)
    spec_text = SETTINGS_PLAN if settings_plan else PLAN.read_text()
    reference, deduplicated, memo = render_with_and_without_memo(spec_text, fleet)
    assert deduplicated == reference
    distinct = {containerd_plans.input_key(parse_spec(spec_text, "p"), n) for n in fleet.nodes}
    assert memo.runs <= len(distinct)


@settings(max_examples=10, deadline=None)
@given(shape=fleet_shapes, pieces=st.integers(1, 64))
def test_json_written_in_pieces_is_the_document_json_dumps_makes(
    shape: list[tuple[int, str, int]], pieces: int
) -> None:
    """`plan -o json` streams the document; the text is json.dumps's, whatever the piece size."""
    import json

    from rollout.cli import render

    plan = build_plan(
        parse_spec(PLAN.read_text(), "plan.yaml"),
        "plan.yaml",
        generated_fleet(shape),
        load_playbooks(),
    )
    forecast = {"total_s": 1.5, "waves": [1, 2]}
    reference = json.dumps(render._plan_json_data(plan, forecast), indent=2, default=str) + "\n"
    written = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(render, "JSON_PIECES_PER_WRITE", pieces)
        render.write_plan_json(plan, written, forecast)
    assert written.getvalue() == reference
    assert plan_to_json(plan, forecast) == reference


def test_nodes_whose_files_do_not_load_are_refused_in_order_after_planning_ahead() -> None:
    """The distinct configurations are planned ahead, several at once (plan_distinct); the
    error is still the first node's in plan order, worded as without the memo."""
    examples = load_recorded_facts(FACTS)
    broken = [
        edit_node(examples.nodes[which], f"node-{index}", "none", 0)
        for index, which in ((0, 1), (1, 3))
    ]
    nodes = tuple(
        dataclasses.replace(
            node,
            config_files=node.config_files.with_file(
                node.config_files.main_path, f"version = 2\n[broken {index}\n"
            ),
        )
        for index, node in enumerate(broken)
    ) + tuple(examples.nodes)
    fleet = dataclasses.replace(examples, nodes=nodes)
    reference, ahead, _ = render_with_and_without_memo(PLAN.read_text(), fleet)
    assert isinstance(reference, str) and "node-0" in reference
    assert ahead == reference
