"""The capacity forecast (rollout.capacity): each GPU resource's allocatable before -> after.

Per change kind (time-slicing with and without renameByDefault, back to whole GPUs,
containerd settings, registry, driver in both modes), a node with an unhealthy device, a
node whose facts hold no capacity, the fleet's sums, the JSON and saved-plan round trip, and
every renderer showing it.
"""

from __future__ import annotations

import dataclasses
import io
import json

import pytest

from rollout.capacity import (
    UNKNOWN_NOTE,
    forecast_fleet,
    forecast_node,
    stale_note,
    unhealthy_note,
)
from rollout.cli.render import make_console, plan_to_json, plan_to_markdown, print_plan_text
from rollout.cli.render_groups import plan_markdown, print_plan
from rollout.facts import FleetFacts, NodeFacts, load_recorded_facts
from rollout.facts.pods import advertised_now
from rollout.plan import CapacityForecast, Plan, plan_from_data
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import Spec, load_spec
from rollout.spec.plan import parse_spec
from rollout.steps.gpu_wait import expect_gpus
from tests.examples import FACTS, PLAN, REPO

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
HEADER = """\
apiVersion: rollout/v1
kind: Plan
metadata: {name: capacity}
targets: {selector: nvidia.com/gpu.present=true}
changes:
"""


def time_slicing(replicas: int, rename: bool) -> Spec:
    sharing = (
        f"""
        sharing:
          timeSlicing:
            renameByDefault: {str(rename).lower()}
            resources:
              - name: nvidia.com/gpu
                replicas: {replicas}"""
        if replicas > 1
        else ""
    )
    text = f"""{HEADER}  - time-slicing:
      profile: p{replicas}
      config:
        version: v1{sharing}
"""
    return parse_spec(text, "plan.yaml")


CONTAINERD = parse_spec(
    HEADER + "  - containerd:\n      settings:\n        max_concurrent_downloads: 7\n", "plan.yaml"
)
REGISTRY = load_spec(PLAN)
DRIVER_HOST = load_spec(REPO / "examples" / "driver-host.yaml")
DRIVER_OPERATOR = load_spec(REPO / "examples" / "driver-operator.yaml")


def node(allocatable: dict[str, str], capacity: dict[str, str] | None = None) -> NodeFacts:
    """An example node (4 GPUs) advertising `allocatable` of `capacity` (default the same)."""
    facts = load_recorded_facts(FACTS).by_name("gpu-a-1")
    assert facts is not None and facts.gpus.count == 4
    return dataclasses.replace(
        facts,
        allocatable=allocatable,
        capacity=allocatable if capacity is None else capacity,
    )


WHOLE = {GPU: "4", "cpu": "64", "memory": "512Gi"}


def counts(forecast: CapacityForecast) -> dict[str, tuple[int | None, int | None]]:
    return {r.resource: (r.before, r.after) for r in forecast.resources}


def test_time_slicing_multiplies_the_gpus_under_their_own_name() -> None:
    forecast = forecast_node(time_slicing(4, rename=False), node(WHOLE))
    assert counts(forecast) == {GPU: (4, 16)}
    assert forecast.notes == (
        "nvidia.com/gpu: 4 time-slices per GPU share its memory and its faults "
        "(no isolation between the pods on one GPU)",
    )


def test_rename_by_default_moves_the_slices_to_the_shared_name() -> None:
    forecast = forecast_node(time_slicing(4, rename=True), node(WHOLE))
    assert counts(forecast) == {GPU: (4, 0), SHARED: (0, 16)}
    assert "nvidia.com/gpu.shared: 4 time-slices per GPU" in forecast.notes[0]


def test_a_profile_without_sharing_brings_the_whole_gpus_back() -> None:
    shared_now = {SHARED: "8", "cpu": "64"}
    forecast = forecast_node(time_slicing(1, rename=False), node(shared_now))
    assert counts(forecast) == {GPU: (0, 4), SHARED: (8, 0)}
    assert forecast.notes == ()


@pytest.mark.parametrize("replicas,rename", [(4, False), (4, True), (2, True), (1, False)])
def test_the_forecast_is_what_gpu_wait_waits_for(replicas: int, rename: bool) -> None:
    spec, facts = time_slicing(replicas, rename), node(WHOLE)
    expected = expect_gpus(spec, facts)
    assert counts(forecast_node(spec, facts))[expected.resource][1] == expected.count


@pytest.mark.parametrize(
    "spec", [CONTAINERD, REGISTRY, DRIVER_HOST, DRIVER_OPERATOR], ids=lambda s: s.metadata.name
)
def test_containerd_registry_and_driver_changes_leave_the_gpus_as_they_are(spec: Spec) -> None:
    mig = {GPU: "0", "nvidia.com/mig-1g.10gb": "14", "cpu": "64"}
    assert counts(forecast_node(spec, node(WHOLE))) == {GPU: (4, 4)}
    assert counts(forecast_node(spec, node(mig))) == {
        GPU: (0, 0),
        "nvidia.com/mig-1g.10gb": (14, 14),
    }
    assert forecast_node(spec, node(WHOLE)).notes == ()


def test_an_unhealthy_device_is_forecast_healthy_after_and_said_so() -> None:
    facts = node({GPU: "3"}, capacity={GPU: "4"})
    forecast = forecast_node(CONTAINERD, facts)
    assert counts(forecast) == {GPU: (3, 4)}
    assert forecast.notes == (unhealthy_note(GPU),)
    shared = forecast_node(time_slicing(4, rename=True), facts)
    assert counts(shared) == {GPU: (3, 0), SHARED: (0, 16)}
    assert shared.notes[-1] == unhealthy_note(GPU)


MIG_1G = "nvidia.com/mig-1g.5gb"
# just after a layout put back to all-disabled: the plugin advertises whole GPUs again, and the
# kubelet still lists the MIG devices in capacity, none allocatable, for its grace period
LEFT_MIG = node({GPU: "4", MIG_1G: "0"}, capacity={GPU: "4", MIG_1G: "14"})


@pytest.mark.parametrize("spec", [CONTAINERD, REGISTRY, DRIVER_HOST], ids=lambda s: s.metadata.name)
def test_a_resource_none_of_which_is_allocatable_is_not_promised_back(spec: Spec) -> None:
    forecast = forecast_node(spec, LEFT_MIG)
    assert counts(forecast) == {GPU: (4, 4), MIG_1G: (0, 0)}
    assert forecast.notes == (stale_note(MIG_1G, 14),)
    assert stale_note(MIG_1G, 14).startswith(
        "nvidia.com/mig-1g.5gb: capacity 14 but none allocatable now"
    )


def test_a_stale_resource_is_neither_forecast_nor_waited_for_in_the_plan() -> None:
    (planned,) = plan_of(CONTAINERD, [LEFT_MIG]).nodes
    assert counts(planned.capacity) == {GPU: (4, 4), MIG_1G: (0, 0)}
    wait = next(s for s in planned.steps if s.kind == "gpu.wait")
    assert MIG_1G not in wait.action and "nvidia.com/gpu = 4" in wait.action
    shared = forecast_node(time_slicing(4, rename=True), LEFT_MIG)
    assert counts(shared) == {GPU: (4, 0), SHARED: (0, 16), MIG_1G: (0, 0)}


def test_a_shared_name_the_plugin_stopped_advertising_is_not_waited_for() -> None:
    # just after a profile without renameByDefault: gpu.shared still in capacity, none allocatable
    facts = node({GPU: "4", SHARED: "0"}, capacity={GPU: "4", SHARED: "16"})
    assert expect_gpus(CONTAINERD, facts).resource == GPU
    (planned,) = plan_of(CONTAINERD, [facts]).nodes
    wait = next(s for s in planned.steps if s.kind == "gpu.wait")
    assert SHARED not in wait.action and "nvidia.com/gpu = 4" in wait.action
    assert expect_gpus(CONTAINERD, node({SHARED: "16"})).resource == SHARED


def test_capacity_alone_counts_where_the_facts_hold_no_allocatable() -> None:
    assert advertised_now({GPU: "4", MIG_1G: "14"}, {}) == {GPU: 4, MIG_1G: 14}
    assert advertised_now({GPU: "4", MIG_1G: "14"}, {"cpu": "8"}) == {GPU: 0, MIG_1G: 0}
    assert advertised_now({GPU: "4"}, {GPU: "3"}) == {GPU: 4}


def test_facts_without_node_capacity_give_an_unknown_before() -> None:
    facts = node({}, capacity={})
    assert forecast_node(CONTAINERD, facts) == CapacityForecast((), (UNKNOWN_NOTE,))
    shared = forecast_node(time_slicing(4, rename=True), facts)
    assert counts(shared) == {SHARED: (None, 16)}
    assert shared.notes[-1] == UNKNOWN_NOTE


def plan_of(spec: Spec, facts: list[NodeFacts]) -> Plan:
    fleet = load_recorded_facts(FACTS)
    fleet = FleetFacts(nodes=tuple(facts), cluster=fleet.cluster, source=fleet.source)
    return build_plan(spec, "plan.yaml", fleet, load_playbooks())


def example_nodes(allocatable: list[dict[str, str]]) -> list[NodeFacts]:
    """The example fleet's nodes, each advertising the given resources (capacity the same)."""
    nodes = load_recorded_facts(FACTS).nodes
    return [
        dataclasses.replace(n, allocatable=a, capacity=a)
        for n, a in zip(nodes, allocatable, strict=False)
    ]


def test_the_fleet_sums_its_targets_and_counts_a_note_of_some_nodes() -> None:
    facts = example_nodes([WHOLE, WHOLE, {GPU: "2"}])
    facts[2] = dataclasses.replace(facts[2], capacity={GPU: "4"})
    plan = plan_of(time_slicing(4, rename=True), facts)
    assert counts(plan.capacity) == {GPU: (10, 0), SHARED: (0, 16 * 3)}
    assert plan.capacity.notes[-1] == f"{unhealthy_note(GPU)} (1 of 3 node(s))"
    assert [counts(n.capacity)[SHARED] for n in plan.nodes] == [(0, 16)] * 3


def test_the_fleet_is_unknown_where_a_node_is() -> None:
    facts = example_nodes([WHOLE, {}])
    plan = plan_of(CONTAINERD, facts)
    assert counts(plan.capacity) == {GPU: (None, None)}
    assert plan.capacity.notes == (f"{UNKNOWN_NOTE} (1 of 2 node(s))",)


def test_the_fleet_forecast_of_no_nodes_is_empty() -> None:
    assert forecast_fleet([]) == CapacityForecast()


def test_json_and_a_saved_plan_carry_the_forecast_both_ways() -> None:
    plan = plan_of(time_slicing(4, rename=True), example_nodes([WHOLE, WHOLE]))
    data = json.loads(plan_to_json(plan))
    assert data["capacity"]["resources"] == [
        {"resource": GPU, "before": 8, "after": 0},
        {"resource": SHARED, "before": 0, "after": 32},
    ]
    assert data["waves"][0]["nodes"][0]["capacity"]["resources"][1] == {
        "resource": SHARED,
        "before": 0,
        "after": 16,
    }
    again = plan_from_data(data)
    assert again.capacity == plan.capacity
    assert [n.capacity for n in again.nodes] == [n.capacity for n in plan.nodes]


def test_json_lists_the_gpus_each_wave_takes_out_of_service() -> None:
    plan = plan_of(REGISTRY, example_nodes([WHOLE, WHOLE, WHOLE]))
    loads = json.loads(plan_to_json(plan))["out_of_service"]
    assert loads == [
        {"wave": 1, "nodes": 1, "gpus": 4, "gpus_at_once": 4},
        {"wave": 2, "nodes": 2, "gpus": 8, "gpus_at_once": 4},
    ]
    shaped = json.loads(plan_to_json(plan_of(time_slicing(4, rename=True), example_nodes([WHOLE]))))
    assert shaped["out_of_service"] == [{"wave": 1, "nodes": 0, "gpus": 0, "gpus_at_once": 0}]


def test_a_plan_saved_before_the_forecast_reads_back_without_one() -> None:
    plan = plan_of(CONTAINERD, example_nodes([WHOLE]))
    data = json.loads(plan_to_json(plan))
    del data["capacity"]
    for wave in data["waves"]:
        for node_data in wave["nodes"]:
            del node_data["capacity"]
    again = plan_from_data(data)
    assert again.capacity == CapacityForecast()
    assert all(n.capacity == CapacityForecast() for n in again.nodes)


def rendered(plan: Plan) -> dict[str, str]:
    def text(full: bool) -> str:
        stream = io.StringIO()
        console = make_console(stream, color=False)
        if full:
            print_plan_text(plan, console)
        else:
            print_plan(plan, console)
        return stream.getvalue()

    return {
        "text": text(full=False),
        "text --full": text(full=True),
        "markdown": plan_markdown(plan),
        "markdown --full": plan_to_markdown(plan),
        "json": plan_to_json(plan),
    }


def test_every_output_shows_the_fleet_table_and_the_changing_nodes() -> None:
    plan = plan_of(time_slicing(4, rename=True), example_nodes([WHOLE, WHOLE]))
    shown = rendered(plan)
    for name in ("text", "text --full"):
        assert "GPU capacity of the 2 target node(s), allocatable before -> after:" in shown[name]
        assert "nvidia.com/gpu.shared  0 -> 32" in shown[name]
        assert "capacity nvidia.com/gpu 4 -> 0, nvidia.com/gpu.shared 0 -> 16" in shown[name]
        assert "note: nvidia.com/gpu.shared: 4 time-slices per GPU share its memory" in shown[name]
    for name in ("markdown", "markdown --full"):
        assert "| `nvidia.com/gpu.shared` | 0 | 32 |" in shown[name]
        assert (
            "- capacity nvidia.com/gpu 4 -&gt; 0, nvidia.com/gpu.shared 0 -&gt; 16" in shown[name]
        )
    assert '"after": 32' in shown["json"]


def test_a_node_whose_resources_stay_has_no_capacity_line() -> None:
    plan = plan_of(CONTAINERD, example_nodes([WHOLE, WHOLE]))
    shown = rendered(plan)
    for name in ("text", "text --full"):
        assert "nvidia.com/gpu  8 -> 8 (unchanged)" in shown[name]
        assert "    capacity " not in shown[name]
    for name in ("markdown", "markdown --full"):
        assert "| `nvidia.com/gpu` | 8 | 8 |" in shown[name]
        assert "- capacity " not in shown[name]


def test_unknown_capacity_is_said_in_every_output() -> None:
    plan = plan_of(CONTAINERD, example_nodes([{}]))
    shown = rendered(plan)
    heading = "GPU capacity of the 1 target node(s), allocatable"
    for name in ("text", "text --full"):
        assert f"{heading} before -> after: unknown" in shown[name]
    for name in ("markdown", "markdown --full"):
        assert f"{heading}: unknown" in shown[name]
    for name in ("text", "text --full", "markdown", "markdown --full"):
        assert "before unknown" in shown[name]
    assert json.loads(shown["json"])["capacity"] == {"resources": [], "notes": [UNKNOWN_NOTE]}
