"""Which operand pods the kubelet asks a node to run as module-holding processes, and when a
deleted one may leave (rollout.lab.simulation.operandholders; the node side is in
tests/lab/test_lab_driver.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout.lab.simulation.gpuoperator import DEVICE_PLUGIN, OPERATOR_NAMESPACE, TOOLKIT
from rollout.lab.simulation.operandholders import (
    RUNNING_DIR,
    WANTED_DIR,
    holder_stopped,
    sync_operand_holders,
)


def pod(name: str, owner: str, *, phase: str = "Running", **extra: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": OPERATOR_NAMESPACE,
        "ownerReferences": [{"kind": "DaemonSet", "name": owner, "uid": "u", "controller": True}],
    }
    metadata.update(extra.pop("metadata", {}))
    return {"metadata": metadata, "spec": {}, "status": {"phase": phase, **extra}}


def node_root(tmp_path: Path) -> Path:
    (tmp_path / "var/lib/rollout-lab").mkdir(parents=True)
    return tmp_path


def wanted(root: Path) -> dict[str, str]:
    return {p.name: p.read_text().strip() for p in (root / WANTED_DIR).iterdir()}


def test_running_gpu_operands_are_wanted_and_others_are_not(tmp_path: Path) -> None:
    root = node_root(tmp_path)
    waiting = {"containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
    pods = [
        pod("plugin-a", DEVICE_PLUGIN.name),
        pod("toolkit-a", TOOLKIT.name),  # no GPU client
        pod("plugin-pending", DEVICE_PLUGIN.name, phase="Pending"),
        pod("plugin-crashing", DEVICE_PLUGIN.name, **waiting),
        pod("plugin-going", DEVICE_PLUGIN.name, metadata={"deletionTimestamp": "now"}),
    ]
    sync_operand_holders(root, pods)
    assert wanted(root) == {"plugin-a": DEVICE_PLUGIN.container}
    sync_operand_holders(root, [])
    assert wanted(root) == {}


def test_a_deleted_pod_waits_for_the_nodes_process(tmp_path: Path) -> None:
    root = node_root(tmp_path)
    running = pod("plugin-a", DEVICE_PLUGIN.name)
    sync_operand_holders(root, [running])
    (root / RUNNING_DIR).mkdir()
    (root / RUNNING_DIR / "plugin-a").write_text("1\n")
    going = pod("plugin-a", DEVICE_PLUGIN.name, metadata={"deletionTimestamp": "now"})
    assert not holder_stopped(root, going)  # still wanted
    sync_operand_holders(root, [going])
    assert not holder_stopped(root, going)  # the node's process still runs
    (root / RUNNING_DIR / "plugin-a").unlink()
    assert holder_stopped(root, going)


def test_nodes_without_the_stand_in_hold_nothing(tmp_path: Path) -> None:
    sync_operand_holders(tmp_path, [pod("plugin-a", DEVICE_PLUGIN.name)])
    assert not (tmp_path / WANTED_DIR).exists()
    assert holder_stopped(None, pod("plugin-a", DEVICE_PLUGIN.name))
    assert holder_stopped(tmp_path, pod("toolkit-a", TOOLKIT.name))
