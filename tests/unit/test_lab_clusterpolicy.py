"""The lab's GPU Operator rolls only the operands whose rendering a ClusterPolicy change
changes, as the real one's hash of each rendered DaemonSet does (object_controls.go): a
time-slicing change (spec.devicePlugin.config) rolls the device plugin, never the toolkit,
so it restarts no containerd."""

from __future__ import annotations

from typing import Any

from rollout.lab.apiserver.patches import PatchType
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CLUSTERPOLICIES, DAEMONSETS
from rollout.lab.simulation.clusterpolicy import ClusterPolicyController
from rollout.lab.simulation.gpuoperator import (
    CLUSTER_POLICY_NAME,
    DEVICE_PLUGIN,
    OPERATOR_NAMESPACE,
    TOOLKIT,
    to_cluster_policy,
    to_daemonset,
)

DRIVER_VERSION = "535.183.01"


def operator() -> tuple[Registry, ClusterPolicyController]:
    registry = Registry()
    registry.ensure_namespace(OPERATOR_NAMESPACE)
    for operand in (TOOLKIT, DEVICE_PLUGIN):
        registry.create(DAEMONSETS, OPERATOR_NAMESPACE, to_daemonset(operand, DRIVER_VERSION))
    registry.create(CLUSTERPOLICIES, None, to_cluster_policy(DRIVER_VERSION))
    controller = ClusterPolicyController(registry)
    reconcile(registry, controller)
    return registry, controller


def reconcile(registry: Registry, controller: ClusterPolicyController) -> None:
    """Two passes, each DaemonSet's status saying it rolled out (no nodes: nothing to wait
    for), so the device-plugin state is reached after the toolkit's."""
    for _ in range(2):
        controller.reconcile(registry.find(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME))
        for name in (TOOLKIT.name, DEVICE_PLUGIN.name):
            registry.mutate(DAEMONSETS, OPERATOR_NAMESPACE, name, rolled_out)


def rolled_out(daemonset: dict[str, Any]) -> None:
    generation = daemonset["metadata"].get("generation", 1)
    daemonset["status"] = {
        "observedGeneration": generation,
        "desiredNumberScheduled": 0,
        "updatedNumberScheduled": 0,
        "numberReady": 0,
    }


def generation(registry: Registry, name: str) -> int:
    daemonset = registry.find(DAEMONSETS, OPERATOR_NAMESPACE, name)
    assert daemonset is not None
    return int(daemonset["metadata"].get("generation", 1))


def patch_spec(registry: Registry, spec: dict[str, Any]) -> None:
    registry.patch(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME, PatchType.MERGE, {"spec": spec})


def plugin_env(registry: Registry) -> dict[str, str]:
    daemonset = registry.find(DAEMONSETS, OPERATOR_NAMESPACE, DEVICE_PLUGIN.name)
    assert daemonset is not None
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container.get("env") or []}


def test_a_time_slicing_change_rolls_the_device_plugin_not_the_toolkit() -> None:
    registry, controller = operator()
    toolkit, plugin = generation(registry, TOOLKIT.name), generation(registry, DEVICE_PLUGIN.name)
    patch_spec(registry, {"devicePlugin": {"config": {"name": "time-slicing", "default": ""}}})
    reconcile(registry, controller)
    assert generation(registry, TOOLKIT.name) == toolkit
    assert generation(registry, DEVICE_PLUGIN.name) == plugin + 1
    assert plugin_env(registry)["CONFIG_NAME"] == "time-slicing"


def test_a_driver_version_change_rolls_no_toolkit() -> None:
    registry, controller = operator()
    toolkit = generation(registry, TOOLKIT.name)
    patch_spec(registry, {"driver": {"version": "550.127.05"}})
    reconcile(registry, controller)
    assert generation(registry, TOOLKIT.name) == toolkit


def test_a_change_the_toolkit_is_rendered_from_rolls_it() -> None:
    registry, controller = operator()
    for spec in (
        {"toolkit": {"env": [{"name": "CONTAINERD_RESTART_MODE", "value": "systemd"}]}},
        {"cdi": {"enabled": True}},
        {"validator": {"version": "v24.9.0"}},
    ):
        before = generation(registry, TOOLKIT.name)
        patch_spec(registry, spec)
        reconcile(registry, controller)
        assert generation(registry, TOOLKIT.name) == before + 1, spec


def test_the_validator_plugins_env_is_no_input_of_the_toolkit() -> None:
    registry, controller = operator()
    toolkit = generation(registry, TOOLKIT.name)
    patch_spec(
        registry, {"validator": {"plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "true"}]}}}
    )
    reconcile(registry, controller)
    assert generation(registry, TOOLKIT.name) == toolkit
