"""MIG as a node's state, met by a change that is not MIG's: someone else put the node's GPUs
in MIG mode, the way an operator does (real kubectl labels the node with a layout and waits
for the MIG manager's `success`), then `rollout apply` of a registry mirror, the README's first
change, converges there. gpu.wait waits for the devices the node advertises (MIG devices are
not GPUs x replicas), the smoke pod asks for one of them and its `nvidia-smi -L` lists a MIG-
UUID, and the node's layout is left as it was. Both strategies, and back to whole GPUs.

One lab of its own: one containerd 1.7 node of two A100-SXM4-40GB.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_lab_mig import advertises, configure, set_strategy, settle
from tests.lab.test_mig import journal_results

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
MIG_UUID = re.compile(r"\bMIG-[0-9a-f][0-9a-f-]+")
GPU_UUID = re.compile(r"\bGPU-[0-9a-f][0-9a-f-]+")


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("migstate") / "lab", ("1.7",), gpus=2) as built:
        yield built


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kubectl-home")


def mirror_plan(path: Path, node: str, mirror: str) -> Path:
    """A registry mirror for docker.io on `node`: the README's first change, nothing of MIG."""
    path.write_text(
        "apiVersion: rollout/v1\nkind: Plan\nmetadata: {name: mirror-on-mig}\n"
        f"targets: {{nodes: [{node}]}}\n"
        "changes:\n"
        "  - registry:\n"
        "      host: docker.io\n"
        "      server: https://registry-1.docker.io\n"
        "      endpoints:\n"
        f"        - url: https://{mirror}\n"
        "          capabilities: [pull, resolve]\n"
        "policy:\n  waves: [1]\n  max_unavailable: 1\n  on_failure: rollback\n"
        "  verify: {gpu_wait_timeout_s: 120, smoke_timeout_s: 120}\n"
    )
    return path


def node_state(kube: KubeClient, lab: Lab) -> dict[str, Any]:
    """What a MIG layout is on the node: its MIG labels and the GPU resources it advertises."""
    node = kube.get_node(lab.nodes[0].name)
    labels = {k: v for k, v in node.labels.items() if k.startswith("nvidia.com/mig")}
    labels["nvidia.com/gpu.product"] = node.labels.get("nvidia.com/gpu.product", "")
    advertised = {k: v for k, v in node.allocatable.items() if k.startswith("nvidia.com/")}
    return {"labels": labels, "allocatable": advertised}


def mig_label(kube: KubeClient, lab: Lab, name: str) -> str:
    return str(kube.get_node(lab.nodes[0].name).labels.get(f"nvidia.com/mig.{name}", ""))


def apply_mirror(lab: Lab, tmp_path: Path, name: str, mirror: str) -> list[dict[str, Any]]:
    """`rollout apply` of a mirror plan on the node; must converge. gpu.wait's and gpu.smoke's
    journal entries."""
    plan = mirror_plan(tmp_path / f"{name}.yaml", lab.nodes[0].name, mirror)
    state = tmp_path / f"{name}-state"
    assert main(apply_args(lab, plan, state)) == 0
    return [*journal_results(state, "gpu.wait"), *journal_results(state, "gpu.smoke")]


def test_a_mirror_on_a_node_someone_put_in_mixed_mig_mode_and_back(
    lab: Lab, kube: KubeClient, home: Path, tmp_path: Path
) -> None:
    set_strategy(lab, home, "mixed")
    try:
        configure(lab, kube, home, "all-1g.5gb")
        advertises(kube, lab, {"nvidia.com/mig-1g.5gb": "14"})
        settle("GFD's MIG labels", lambda: mig_label(kube, lab, "strategy") == "mixed")
        before = node_state(kube, lab)
        waited, smoked = apply_mirror(lab, tmp_path, "mixed", "mirror.registry.internal:5000")
        assert waited["outcome"] == "done" and "nvidia.com/mig-1g.5gb" in waited["detail"]
        assert "one nvidia.com/mig-1g.5gb" in smoked["detail"], smoked
        assert MIG_UUID.search(smoked["detail"]), smoked
        assert node_state(kube, lab) == before, "the layout is the operator's, left as it was"

        configure(lab, kube, home, "all-disabled")
        advertises(kube, lab, {"nvidia.com/gpu": "2"})
        settle("GFD's MIG labels gone", lambda: mig_label(kube, lab, "strategy") == "")
        waited, smoked = apply_mirror(lab, tmp_path, "whole", "mirror2.registry.internal:5000")
        assert "one nvidia.com/gpu" in smoked["detail"], smoked
        assert GPU_UUID.search(smoked["detail"]) and not MIG_UUID.search(smoked["detail"])
        assert kube.get_node(lab.nodes[0].name).labels[CONFIG] == "all-disabled"
    finally:
        set_strategy(lab, home, "single")


def test_a_mirror_on_a_node_someone_put_in_single_mig_mode(
    lab: Lab, kube: KubeClient, home: Path, tmp_path: Path
) -> None:
    set_strategy(lab, home, "single")
    try:
        configure(lab, kube, home, "all-1g.5gb")
        advertises(kube, lab, {"nvidia.com/gpu": "14"})
        settle("GFD's MIG labels", lambda: mig_label(kube, lab, "strategy") == "single")
        before = node_state(kube, lab)
        assert before["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
        waited, smoked = apply_mirror(lab, tmp_path, "single", "mirror3.registry.internal:5000")
        assert "nvidia.com/gpu = 14" in waited["detail"], waited
        assert "one nvidia.com/gpu" in smoked["detail"], smoked
        assert MIG_UUID.search(smoked["detail"]), smoked
        assert node_state(kube, lab) == before, "the layout is the operator's, left as it was"
    finally:
        configure(lab, kube, home, "all-disabled")
        advertises(kube, lab, {"nvidia.com/gpu": "2"})
