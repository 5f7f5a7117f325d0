"""`driver-upgrade` with `nvidiadriver: NAME`: the spec field, the plan from facts (the CR's
version change, the ClusterPolicy's upgradePolicy, the CR's nodes as targets or pinned, the
other CRs' nodes reported), the refusals, the run notes, recorded facts, and driver.pin
patching the NVIDIADriver instead of the ClusterPolicy."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from rollout.changes.driver.model import DriverUpgradeChange
from rollout.changes.driver.operator import DriverPinStep
from rollout.changes.driver.operatorplan import OperatorUpgradeRefused, operator_run_notes
from rollout.cli.render import plan_to_json
from rollout.driver.operatorlive import read_nvidia_drivers
from rollout.errors import InputErrors
from rollout.facts import ClusterFacts, FleetFacts
from rollout.facts.live import read_plan_nvidia_drivers
from rollout.facts.recorded_cluster import load_cluster_facts
from rollout.facts.recording import _cluster_document
from rollout.plan import plan_from_data
from rollout.run import Journal
from rollout.spec import parse_spec
from rollout.steps.base import StepResultKind
from rollout.transports.errors import NotFound
from rollout.transports.kube import KubeClient
from tests.unit.test_driver_operator_plan import NEW, OLD, SERVED, SKIP, node, plan_of
from tests.unit.test_driver_operator_steps import FakeCluster, context

MANAGED_BY = "nvidia.com/gpu.driver.managed-by"
POOLS = {"n1": "pool-a", "n2": "pool-a", "n3": "pool-a", "n4": "pool-b", "n5": "pool-b"}


def spec_text(targets: str = "[n1, n2]", name: str = "pool-a", mode: str = "operator") -> str:
    return f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: pools}}
targets: {{nodes: {targets}}}
changes:
  - driver-upgrade: {{version: "{NEW}", mode: {mode}, nvidiadriver: {name}}}
policy:
  waves: [1]
  max_unavailable: 2
"""


def fleet(use_crd: bool = True, drivers: Mapping[str, str] | None = None) -> FleetFacts:
    policy = {"autoUpgrade": True, "maxParallelUpgrades": 0, "maxUnavailable": "25%"}
    versions = {"pool-a": OLD, "pool-b": OLD} if drivers is None else drivers
    return FleetFacts(
        nodes=tuple(node(n, labels={**SERVED, MANAGED_BY: p}) for n, p in POOLS.items()),
        cluster=ClusterFacts(
            cluster_policy={
                "driver": {
                    "enabled": True,
                    "version": "",
                    "useNvidiaDriverCRD": use_crd,
                    "upgradePolicy": policy,
                }
            },
            nvidia_drivers={name: {"version": v} for name, v in versions.items()},
        ),
        source="recorded facts",
    )


def test_the_field_is_a_kubernetes_name_and_only_for_mode_operator() -> None:
    change = parse_spec(spec_text(), "plan.yaml").change_of(DriverUpgradeChange)
    assert change is not None and change.nvidiadriver == "pool-a"
    with pytest.raises(InputErrors, match="`nvidiadriver` applies only to mode: operator"):
        parse_spec(spec_text(mode="host"), "plan.yaml")
    with pytest.raises(InputErrors, match="nvidiadriver: expected a Kubernetes name"):
        parse_spec(spec_text(name="Pool_A"), "plan.yaml")


def test_plan_changes_the_resources_version_and_pins_only_its_nodes() -> None:
    plan = plan_of(spec_text(), fleet())
    pin, version, policy = plan.cluster_changes
    assert pin.target == "3 node(s) the driver DaemonSet of NVIDIADriver pool-a serves"
    assert pin.action is not None and "n1, n2, n3" in pin.action and "n4" not in pin.action
    assert f"+ n3: {SKIP}=true (stays pinned)" in pin.diff
    assert (version.target, version.action) == (
        "NVIDIADriver pool-a spec.version",
        f"{OLD} -> {NEW}",
    )
    # the ClusterPolicy's upgradePolicy, its maxUnavailable over every driver node (25% of 5)
    reason = policy.noop_reason or ""
    assert reason.startswith("autoUpgrade true, maxParallelUpgrades unlimited")
    assert "operator maxParallelUpgrades unlimited, maxUnavailable 2" in reason
    warnings = "\n".join(plan.warnings)
    assert "NOT UPGRADED: n3 is served by the driver DaemonSet" in warnings
    assert f"kubectl label node n3 {SKIP}-" in warnings
    for other in ("n4", "n5"):
        assert f"NOT UPGRADED: {other} is served by NVIDIADriver pool-b, not pool-a" in warnings
    assert [n.name for n in plan.nodes] == ["n1", "n2"]


def test_plan_refuses_an_absent_resource_listing_those_present() -> None:
    with pytest.raises(OperatorUpgradeRefused) as refused:
        plan_of(spec_text(name="pool-c"), fleet())
    message = str(refused.value)
    assert "plan.yaml" in message and "recorded facts has no NVIDIADriver pool-c" in message
    assert "present: pool-a, pool-b" in message


def test_plan_refuses_when_the_operator_does_not_use_nvidiadrivers() -> None:
    with pytest.raises(OperatorUpgradeRefused, match="useNvidiaDriverCRD is not true"):
        plan_of(spec_text(), fleet(use_crd=False))


def test_plan_refuses_a_target_another_resource_serves() -> None:
    with pytest.raises(OperatorUpgradeRefused, match="n4 not served by the driver DaemonSet of"):
        plan_of(spec_text("[n1, n4]"), fleet())


def test_a_resource_already_at_the_version_pins_nothing() -> None:
    plan = plan_of(spec_text(), fleet(drivers={"pool-a": NEW, "pool-b": OLD}))
    pin, version, _ = plan.cluster_changes
    assert pin.action is None and pin.noop_reason == f"NVIDIADriver pool-a already asks for {NEW}"
    assert version.action is None


def test_run_notes_go_back_by_patching_the_resource() -> None:
    # resume reads the plan back from the run's plan.json: the way back must survive it
    plan = plan_from_data(json.loads(plan_to_json(plan_of(spec_text(), fleet()))))
    halted = operator_run_notes(plan, parse_spec(spec_text(), "plan.yaml"), "halted", pinned=True)
    expected = (
        f"""kubectl patch nvidiadriver pool-a --type merge -p '{{"spec":{{"version":"{OLD}"}}}}'"""
    )
    assert any(expected in note for note in halted)
    assert any(note.startswith("NOT UPGRADED: n4") for note in halted)


def test_recorded_facts_keep_the_resources(tmp_path: Path) -> None:
    facts = fleet()
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(_cluster_document(facts)))
    loaded = load_cluster_facts(path)
    assert loaded.nvidia_drivers == {"pool-a": {"version": OLD}, "pool-b": {"version": OLD}}


class PooledCluster(FakeCluster):
    """FakeCluster whose driver is two NVIDIADrivers: n1, n2 pool-a; n3 pool-b."""

    def __init__(self) -> None:
        super().__init__()
        for name, pool in (("n1", "pool-a"), ("n2", "pool-a"), ("n3", "pool-b")):
            self.nodes[name] = self.nodes[name].__class__(
                **{**self.nodes[name].__dict__, "labels": {**SERVED, MANAGED_BY: pool}}
            )
        self.policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
        self.drivers: dict[str, dict[str, Any]] = {
            "pool-a": {"metadata": {"name": "pool-a"}, "spec": {"version": OLD}},
            "pool-b": {"metadata": {"name": "pool-b"}, "spec": {"version": OLD}},
        }

    def get_nvidia_driver(self, name: str) -> dict[str, Any]:
        return self.drivers[name]

    def patch_nvidia_driver(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self.writes.append(f"nvidiadriver {name} version {patch['spec']['version']}")
        self.drivers[name]["spec"]["version"] = patch["spec"]["version"]
        return self.drivers[name]

    def patch_cluster_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        raise AssertionError("the ClusterPolicy is not patched for an NVIDIADriver change")


def test_pin_labels_the_resources_nodes_then_patches_its_version(journal: Journal) -> None:
    cluster = PooledCluster()
    ctx = context(cluster, journal, "n1")
    ctx = type(ctx)(**{**ctx.__dict__, "spec": parse_spec(spec_text(), "unit.yaml")})
    result = DriverPinStep().apply(ctx)
    assert result.kind is StepResultKind.DONE
    assert cluster.writes == [
        f"label n1 {{'{SKIP}': 'true'}}",
        f"label n2 {{'{SKIP}': 'true'}}",
        f"nvidiadriver pool-a version {NEW}",
    ]
    assert f"NVIDIADriver pool-a spec.version {OLD} -> {NEW}" in result.detail
    assert cluster.drivers["pool-b"]["spec"]["version"] == OLD
    assert SKIP not in cluster.nodes["n3"].labels


class DriversKube:
    """list_nvidia_drivers of a cluster with these resources (None: no NVIDIADriver CRD)."""

    def __init__(self, resources: list[dict[str, Any]] | None) -> None:
        self.resources = resources
        self.lists = 0

    def list_nvidia_drivers(self) -> list[dict[str, Any]]:
        self.lists += 1
        if self.resources is None:
            raise NotFound("list", "nvidiadrivers")
        return self.resources


def test_the_engine_reads_every_resources_spec_by_name_and_none_without_the_crd() -> None:
    kube = DriversKube([{"metadata": {"name": "pool-a"}, "spec": {"version": OLD}},
                        {"metadata": {"name": "pool-b"}}])  # fmt: skip
    assert read_nvidia_drivers(cast(KubeClient, kube)) == {
        "pool-a": {"version": OLD},
        "pool-b": {},
    }
    assert read_nvidia_drivers(cast(KubeClient, DriversKube(None))) == {}


def test_live_facts_list_the_resources_only_for_a_plan_that_names_one() -> None:
    kube = DriversKube([{"metadata": {"name": "pool-a"}, "spec": {"version": OLD}}])
    named = parse_spec(spec_text(), "plan.yaml")
    assert read_plan_nvidia_drivers(named, cast(KubeClient, kube)) == {"pool-a": {"version": OLD}}
    unnamed = parse_spec(spec_text().replace(", nvidiadriver: pool-a", ""), "plan.yaml")
    assert read_plan_nvidia_drivers(unnamed, cast(KubeClient, kube)) == {}
    assert kube.lists == 1
