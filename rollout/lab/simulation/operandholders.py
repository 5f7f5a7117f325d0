"""A running GPU operand pod is a process on its node that holds the nvidia module.

The kubelet simulation runs on the host; the node runs rollout-lab-operands.service
(rollout/lab/data/nvidia-operands), which keeps one GPU-client stand-in process per file of
/var/lib/rollout-lab/operands/ (the file names the pod, its text the container) and marks
each one that runs in /var/lib/rollout-lab/operands-running/. So while a device-plugin or
validator pod's container runs on a node, `rmmod nvidia` there says "Module nvidia is in
use"; pausing the operands (their deploy label off `true`) is what frees the module.

The kubelet writes the wanted files each pass and, for a deleted pod, waits until the node
has stopped its process before the pod leaves the API, as a real kubelet deletes a pod only
once its containers have stopped. A node without the service (no operands directory under
its root) holds nothing and waits for nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rollout.lab.simulation.gpuoperator import (
    DEVICE_PLUGIN,
    OPERATOR_NAMESPACE,
    VALIDATOR,
    owner_daemonset,
)
from rollout.lab.simulation.pods import is_deleting, is_terminal
from rollout.lab.simulation.podstatus import waiting_reason

# Relative to the node's root; the node's own /var/lib/rollout-lab is made by the image.
LAB_STATE = Path("var/lib/rollout-lab")
WANTED_DIR = LAB_STATE / "operands"
RUNNING_DIR = LAB_STATE / "operands-running"
# Operand DaemonSet -> its container: the operands that open the GPU (NVML) while they run.
GPU_OPERANDS = {
    DEVICE_PLUGIN.name: DEVICE_PLUGIN.container,
    VALIDATOR.name: VALIDATOR.container,
}


def holder_container(pod: Mapping[str, Any]) -> str | None:
    """The container name of a GPU operand pod, or None for any other pod."""
    if pod["metadata"].get("namespace") != OPERATOR_NAMESPACE:
        return None
    return GPU_OPERANDS.get(owner_daemonset(pod) or "")


def container_runs(pod: Mapping[str, Any]) -> bool:
    """Running, not being deleted, and its container not waiting to (re)start."""
    if is_terminal(pod) or is_deleting(pod):
        return False
    return (pod.get("status") or {}).get("phase") == "Running" and waiting_reason(pod) is None


def sync_operand_holders(root: Path | None, pods: Iterable[Mapping[str, Any]]) -> None:
    """Make the node's wanted-holder files match its running GPU operand pods."""
    if root is None or not (root / LAB_STATE).is_dir():
        return
    wanted: dict[str, str] = {}
    for pod in pods:
        container = holder_container(pod)
        if container is not None and container_runs(pod):
            wanted[str(pod["metadata"]["name"])] = container
    directory = root / WANTED_DIR
    directory.mkdir(exist_ok=True)
    present = {p.name for p in directory.iterdir()}
    for name in present - set(wanted):
        with contextlib.suppress(FileNotFoundError):
            (directory / name).unlink()
    for name in set(wanted) - present:
        temporary = directory / f".{name}.tmp"
        temporary.write_text(wanted[name] + "\n")
        temporary.replace(directory / name)


def holder_stopped(root: Path | None, pod: Mapping[str, Any]) -> bool:
    """Whether the node runs no holder process for this pod (any more)."""
    if root is None or holder_container(pod) is None:
        return True
    name = str(pod["metadata"]["name"])
    return not (root / WANTED_DIR / name).exists() and not (root / RUNNING_DIR / name).exists()
