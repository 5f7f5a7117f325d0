"""The GPU Operator facts: the ClusterPolicy's device-plugin config, and which pods are operands."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.facts.gpu_operator import DevicePluginConfigRef, is_operand
from rollout.facts.pods import PodFacts


def policy(config: Any) -> dict[str, Any]:
    return {"devicePlugin": {"config": config}}


def test_the_device_plugin_config_is_read_from_the_policy() -> None:
    read = DevicePluginConfigRef.from_policy(policy({"name": "profiles", "default": "any"}))
    assert read == DevicePluginConfigRef("profiles", "any")
    assert read.configmap == "gpu-operator/profiles"


@pytest.mark.parametrize("value", [5, 0, True, ["a"], {"name": "a"}, None])
def test_a_name_or_default_that_is_not_a_string_reads_as_unset(value: Any) -> None:
    read = DevicePluginConfigRef.from_policy(policy({"name": value, "default": value}))
    assert read == DevicePluginConfigRef()
    assert read.configmap == ""


@pytest.mark.parametrize(
    "spec",
    [{}, {"devicePlugin": None}, {"devicePlugin": "on"}, policy(None), policy(["name"])],
    ids=["no-device-plugin", "null", "a-string", "no-config", "config-a-list"],
)
def test_a_policy_without_a_config_mapping_names_no_configmap(spec: dict[str, Any]) -> None:
    assert DevicePluginConfigRef.from_policy(spec) == DevicePluginConfigRef()


@pytest.mark.parametrize(
    ("namespace", "name", "operand"),
    [
        ("gpu-operator", "gpu-feature-discovery-x", True),
        ("kube-system", "nvidia-device-plugin-daemonset-x", True),
        ("default", "cuda-job", False),
    ],
)
def test_an_operand_is_in_the_operator_namespace_or_named_like_its_pods(
    namespace: str, name: str, operand: bool
) -> None:
    assert is_operand(PodFacts(namespace, name)) is operand
