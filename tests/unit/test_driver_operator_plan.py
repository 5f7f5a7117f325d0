"""mode: operator planned from facts: the pin, the version change, the upgradePolicy in force and
which limit binds, who stays pinned, the refusals; and the plan output in all three formats."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from rollout.changes.driver.operatorplan import (
    PINNED_BY_ANNOTATION,
    Budget,
    OperatorUpgradeRefused,
    operator_run_notes,
)
from rollout.cli.render import make_console, plan_to_json, plan_to_markdown, print_plan_text
from rollout.facts import ClusterFacts, FleetFacts, GpuFacts, NodeFacts
from rollout.facts.extra import with_plan_facts
from rollout.plan import Plan
from rollout.planner import build_plan
from rollout.playbook import load_playbooks
from rollout.spec import parse_spec
from tests.fakes import ScriptedRunner
from tests.node_facts import containerd_node

OLD, NEW = "535.183.01", "550.90.07"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
SERVED = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.deploy.driver": "true"}


def spec_text(targets: str = "{nodes: [n1, n2, n3, n4]}", policy: str = "") -> str:
    return f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: operator}}
targets: {targets}
changes:
  - driver-upgrade: {{version: "{NEW}", mode: operator}}
policy:
  waves: [1, 2]
  max_unavailable: 2
{policy}"""


def node(
    name: str,
    labels: Mapping[str, str] = SERVED,
    annotations: Mapping[str, str] | None = None,
    unschedulable: bool = False,
) -> NodeFacts:
    return replace(
        containerd_node(name),
        labels=dict(labels),
        annotations=dict(annotations or {}),
        unschedulable=unschedulable,
        gpus=GpuFacts(count=1, product="NVIDIA A100-SXM4-40GB", driver_version=OLD),
    )


def fleet(
    nodes: list[NodeFacts] | None = None, upgrade_policy: Mapping[str, Any] | None = None
) -> FleetFacts:
    policy = {"autoUpgrade": True, "maxParallelUpgrades": 1, "maxUnavailable": "25%"}
    policy.update(upgrade_policy or {})
    return FleetFacts(
        nodes=tuple(nodes or [node(f"n{i}") for i in range(1, 6)]),
        cluster=ClusterFacts(
            cluster_policy={"driver": {"enabled": True, "version": OLD, "upgradePolicy": policy}}
        ),
        source="unit facts",
    )


def plan_of(text: str, facts: FleetFacts) -> Plan:
    return build_plan(parse_spec(text, "plan.yaml"), "plan.yaml", facts, load_playbooks())


def test_plan_pins_every_served_node_then_changes_the_version() -> None:
    plan = plan_of(spec_text(), fleet())
    assert plan.changes == ("driver-operator",)
    pin, version, policy = plan.cluster_changes
    assert (pin.kind, version.kind, policy.kind) == (
        "driver.pin",
        "driver.version",
        "driver.upgradePolicy",
    )
    assert pin.action is not None and "n1, n2, n3, n4, n5" in pin.action
    assert "+ n5: nvidia.com/gpu-driver-upgrade.skip=true (stays pinned)" in pin.diff
    assert version.action == f"{OLD} -> {NEW}"
    assert policy.noop_reason is not None
    assert "maxParallelUpgrades 1" in policy.noop_reason
    assert "the operator's maxParallelUpgrades binds" in policy.noop_reason
    assert [[n.name for n in w.nodes] for w in plan.waves] == [["n1"], ["n2", "n3"], ["n4"]]
    for target in plan.nodes:
        acting = [s.kind for s in target.steps if s.action is not None]
        assert acting == [
            "gates.baseline", "driver.pin", "driver.release", "driver.confirm", "gpu.smoke", "gates"
        ]  # fmt: skip
        assert target.driver is not None
        assert (target.driver.before, target.driver.after) == (OLD, NEW)
    (warning,) = [w for w in plan.warnings if "n5" in w]
    assert warning.startswith("NOT UPGRADED: n5")
    assert f"kubectl label node n5 {SKIP}-" in warning


def test_plan_output_in_three_formats_says_who_stays_pinned() -> None:
    plan = plan_of(spec_text(), fleet())
    stream = io.StringIO()
    print_plan_text(plan, make_console(stream, color=False))
    text = stream.getvalue()
    markdown = plan_to_markdown(plan)
    data = json.loads(plan_to_json(plan))
    for output in (text, markdown):
        assert "NOT UPGRADED: n5" in output
        assert "driver.pin" in output and "driver.version" in output
        assert "maxParallelUpgrades 1" in output
        assert "the operator's maxParallelUpgrades binds" in output
    assert f"driver.version ClusterPolicy spec.driver.version: {OLD} -> {NEW}" in text
    assert f"| 1 | n1 | {OLD} → {NEW} (operator) |" in markdown
    kinds = [c["kind"] for c in data["cluster_changes"]]
    assert kinds == ["driver.pin", "driver.version", "driver.upgradePolicy"]
    assert any(w.startswith("NOT UPGRADED: n5") for w in data["warnings"])
    first = data["waves"][0]["nodes"][0]
    assert first["driver"]["after"] == NEW and first["driver"]["reboot"] == "no"


def test_plan_refuses_when_auto_upgrade_is_off() -> None:
    with pytest.raises(OperatorUpgradeRefused) as refused:
        plan_of(spec_text(), fleet(upgrade_policy={"autoUpgrade": False}))
    message = str(refused.value)
    assert "plan.yaml" in message and "autoUpgrade is off" in message
    assert '"autoUpgrade":true' in message and "kubectl patch clusterpolicy" in message


def test_plan_refuses_a_target_the_driver_daemonset_does_not_serve() -> None:
    nodes = [node("n1"), node("n2", labels={"nvidia.com/gpu.deploy.driver": "false"})]
    with pytest.raises(OperatorUpgradeRefused, match="n2 not served"):
        plan_of(spec_text("{nodes: [n1, n2]}"), fleet(nodes))


def test_a_skip_label_set_before_the_run_is_left_alone() -> None:
    nodes = [node("n1"), node("n2", labels={**SERVED, SKIP: "true"}), node("n3")]
    plan = plan_of(spec_text("{nodes: [n1, n2]}"), fleet(nodes))
    pin = plan.cluster_changes[0]
    assert pin.action is not None and "left alone: n2" in pin.action
    n2 = next(n for n in plan.nodes if n.name == "n2")
    release = next(s for s in n2.steps if s.kind == "driver.release")
    assert release.action is None and "before this run" in (release.noop_reason or "")
    assert any(w.startswith("n2 carried") for w in plan.warnings)
    # a skip label rollout set (a halted run) is rollout's to release
    ours = node("n2", labels={**SERVED, SKIP: "true"}, annotations={PINNED_BY_ANNOTATION: "r1"})
    plan = plan_of(spec_text("{nodes: [n1, n2]}"), fleet([node("n1"), ours]))
    n2 = next(n for n in plan.nodes if n.name == "n2")
    assert next(s for s in n2.steps if s.kind == "driver.release").action is not None


@pytest.mark.parametrize(
    ("budget", "binds"),
    [
        (Budget(2, 1, 2, 0, 2), "the operator's maxParallelUpgrades binds"),
        (Budget(1, 0, 4, 0, 3), "rollout's max_unavailable binds"),
        (Budget(3, 0, 2, 1, 3), "the operator's maxUnavailable binds"),
        (Budget(3, 4, 4, 0, 1), "the wave size binds"),
        (Budget(2, 2, 2, 0, 2), "bind"),
    ],
)
def test_the_budget_explains_which_limit_binds(budget: Budget, binds: str) -> None:
    assert binds in budget.explain()
    assert budget.at_once == min(budget.limits.values())


def test_operator_max_unavailable_counts_cordoned_served_nodes_and_rounds_up() -> None:
    nodes = [node(f"n{i}") for i in range(1, 5)] + [node("n5", unschedulable=True)]
    plan = plan_of(
        spec_text(),
        fleet(nodes, {"maxParallelUpgrades": 0, "maxUnavailable": "30%"}),
    )
    reason = plan.cluster_changes[2].noop_reason or ""
    # 30% of 5 served rounds up to 2, one of them already cordoned: 1 at once
    assert "maxUnavailable 2 with 1 served node(s) already cordoned" in reason
    assert reason.startswith("autoUpgrade true, maxParallelUpgrades unlimited")
    assert "at most 1 node(s) upgrade at once: the operator's maxUnavailable binds" in reason


def test_run_notes_say_who_stays_pinned_and_how_to_go_back() -> None:
    spec = parse_spec(spec_text(), "plan.yaml")
    plan = build_plan(spec, "plan.yaml", fleet(), load_playbooks())
    succeeded = operator_run_notes(plan, spec, "succeeded", pinned=True)
    assert len(succeeded) == 1 and succeeded[0].startswith("NOT UPGRADED: n5")
    halted = operator_run_notes(plan, spec, "halted", pinned=True)
    assert any(
        f'"version":"{OLD}"' in note and "kubectl patch clusterpolicy" in note for note in halted
    )
    # halted before its driver.pin moved the version (a saved plan's node refused): no way
    # back to offer, and patching the version back would undo someone else's change
    (untouched,) = operator_run_notes(plan, spec, "halted", pinned=False)
    assert untouched.startswith("NOT UPGRADED: n5")


def test_live_facts_read_each_nodes_kernel_for_the_plan() -> None:
    runners = {
        name: ScriptedRunner(name=name).on(["sh", "-c"], "6.1.0-28-amd64\n---\n---\n")
        for name in ("n1", "n2")
    }
    nodes = [node("n1"), node("n2")]
    spec = parse_spec(spec_text("{nodes: [n1, n2]}"), "plan.yaml")
    read = with_plan_facts(spec, runners, nodes)
    assert [n.driver_kernel.kernel if n.driver_kernel else None for n in read] == [
        "6.1.0-28-amd64",
        "6.1.0-28-amd64",
    ]
    plan = build_plan(spec, "plan.yaml", fleet([*read, node("n3")]), load_playbooks())
    assert {n.driver.kernel for n in plan.nodes if n.driver} == {"6.1.0-28-amd64"}
    # a plan without a driver change reads nothing more
    registry = parse_spec(
        spec_text().replace(
            f'driver-upgrade: {{version: "{NEW}", mode: operator}}',
            "registry: {host: docker.io, endpoints: [{url: 'https://mirror.internal:5000'}]}",
        ),
        "plan.yaml",
    )
    silent = {"n1": ScriptedRunner(name="n1")}
    assert with_plan_facts(registry, silent, [node("n1")]) == [node("n1")]
    assert silent["n1"].calls == []
