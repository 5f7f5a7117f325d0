"""MIG as a node's state, met by a change that is not MIG's: someone else put the node's GPUs
in MIG mode, the way an operator does (real kubectl labels the node with a layout and waits
for the MIG manager's `success`), then `rollout apply` of a registry mirror, the README's first
change, converges there. gpu.wait waits for the devices the node advertises (MIG devices are
not GPUs x replicas), the smoke pod asks for one of them and its `nvidia-smi -L` lists a MIG-
UUID, DCGM's diagnostics are skipped by name, and the node's layout is left as it was. Both
strategies, and back to whole GPUs (where the diagnostics run).

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
DCGM_SKIPPED = "dcgm skipped: the node's GPUs are in MIG mode"


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
        "  verify:\n    gpu_wait_timeout_s: 120\n    smoke_timeout_s: 120\n"
        "    gates: {dcgm: {level: 1}}\n"
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


def put_in_mig_mode(
    lab: Lab, kube: KubeClient, home: Path, strategy: str, advertised: dict[str, str]
) -> dict[str, Any]:
    """The node in all-1g.5gb under `strategy`, as an operator puts it there with kubectl, once
    it advertises `advertised` and GFD labels the strategy: its MIG state."""
    set_strategy(lab, home, strategy)
    configure(lab, kube, home, "all-1g.5gb")
    advertises(kube, lab, advertised)
    settle("GFD's MIG labels", lambda: mig_label(kube, lab, "strategy") == strategy)
    return node_state(kube, lab)


def apply_mirror(lab: Lab, tmp_path: Path, name: str, mirror: str) -> list[str]:
    """`rollout apply` of a mirror plan on the node; must converge. What gpu.wait, gpu.smoke
    and the gates said, in the journal."""
    plan = mirror_plan(tmp_path / f"{name}.yaml", lab.nodes[0].name, mirror)
    state = tmp_path / f"{name}-state"
    assert main(apply_args(lab, plan, state)) == 0
    said = [journal_results(state, step) for step in ("gpu.wait", "gpu.smoke", "gates")]
    assert [len(entries) for entries in said] == [1, 1, 1], said
    assert all(entries[0]["outcome"] == "done" for entries in said), said
    return [str(entries[0]["detail"]) for entries in said]


def test_a_mirror_on_a_node_someone_put_in_mixed_mig_mode_and_back(
    lab: Lab, kube: KubeClient, home: Path, tmp_path: Path
) -> None:
    try:
        before = put_in_mig_mode(lab, kube, home, "mixed", {"nvidia.com/mig-1g.5gb": "14"})
        waited, smoked, gated = apply_mirror(
            lab, tmp_path, "mixed", "mirror.registry.internal:5000"
        )
        assert "allocatable nvidia.com/mig-1g.5gb = 14" in waited
        assert "(one nvidia.com/mig-1g.5gb)" in smoked and MIG_UUID.search(smoked), smoked
        assert f"{DCGM_SKIPPED} (mixed strategy)" in gated and "dcgm level" not in gated
        assert node_state(kube, lab) == before, "the layout is the operator's, left as it was"

        configure(lab, kube, home, "all-disabled")
        advertises(kube, lab, {"nvidia.com/gpu": "2"})
        settle("GFD's MIG labels gone", lambda: mig_label(kube, lab, "strategy") == "")
        waited, smoked, gated = apply_mirror(
            lab, tmp_path, "whole", "mirror2.registry.internal:5000"
        )
        assert "allocatable nvidia.com/gpu = 2" in waited
        assert "(one nvidia.com/gpu)" in smoked, smoked
        assert GPU_UUID.search(smoked) and not MIG_UUID.search(smoked), smoked
        assert "dcgm level 1 (software Pass (GPU 0, 1))" in gated and DCGM_SKIPPED not in gated
        assert kube.get_node(lab.nodes[0].name).labels[CONFIG] == "all-disabled"
    finally:
        set_strategy(lab, home, "single")


def test_a_mirror_on_a_node_someone_put_in_single_mig_mode(
    lab: Lab, kube: KubeClient, home: Path, tmp_path: Path
) -> None:
    try:
        before = put_in_mig_mode(lab, kube, home, "single", {"nvidia.com/gpu": "14"})
        assert before["labels"]["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
        waited, smoked, gated = apply_mirror(
            lab, tmp_path, "single", "mirror3.registry.internal:5000"
        )
        assert "allocatable nvidia.com/gpu = 14" in waited
        assert "(one nvidia.com/gpu)" in smoked and MIG_UUID.search(smoked), smoked
        assert f"{DCGM_SKIPPED} (single strategy)" in gated and "dcgm level" not in gated
        assert node_state(kube, lab) == before, "the layout is the operator's, left as it was"
    finally:
        configure(lab, kube, home, "all-disabled")
        advertises(kube, lab, {"nvidia.com/gpu": "2"})
