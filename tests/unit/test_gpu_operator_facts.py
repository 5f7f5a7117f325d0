"""The GPU Operator facts: the ClusterPolicy's device-plugin config, which pods are operands,
and GPU Feature Discovery's labels."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from rollout.facts import GpuFacts
from rollout.facts.gpu_operator import (
    GPU_COUNT_LABEL,
    GPU_REPLICAS_LABEL,
    DevicePluginConfigRef,
    current_replicas,
    is_operand,
    labelled_number,
    physical_gpus,
)
from rollout.facts.pods import PodFacts
from tests.node_facts import containerd_node


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


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("4", 4),
        ("1", 1),
        ("0", None),
        ("", None),
        ("-2", None),
        ("2.5", None),
        ("four", None),
        ("²", None),
        ("٣", None),
    ],
)
def test_a_gfd_label_counts_only_as_a_whole_number_above_zero(
    text: str, number: int | None
) -> None:
    assert labelled_number({GPU_REPLICAS_LABEL: text}, GPU_REPLICAS_LABEL) == number
    assert labelled_number({}, GPU_REPLICAS_LABEL) is None


@pytest.mark.parametrize(
    ("smi_count", "label", "physical"),
    [(2, "8", 2), (0, "8", 8), (0, "", 0), (0, "0", 0), (0, "many", 0)],
    ids=[
        "nvidia-smi-first",
        "gfd-label-when-smi-lists-none",
        "neither",
        "label-zero",
        "label-junk",
    ],
)
def test_physical_gpus_are_nvidia_smis_else_gfds_count(
    smi_count: int, label: str, physical: int
) -> None:
    node = replace(
        containerd_node("n1"),
        gpus=GpuFacts(count=smi_count),
        labels={GPU_COUNT_LABEL: label} if label else {},
    )
    assert physical_gpus(node) == physical


@pytest.mark.parametrize(("label", "replicas"), [("4", 4), ("1", 1), ("0", 1), ("", 1), ("²", 1)])
def test_a_node_runs_its_replicas_label_else_no_sharing(label: str, replicas: int) -> None:
    node = replace(containerd_node("n1"), labels={GPU_REPLICAS_LABEL: label} if label else {})
    assert current_replicas(node) == replicas
