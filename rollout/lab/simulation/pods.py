"""Facts about pods that the scheduler, kubelet and controllers all read the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import PODS
from rollout.lab.quantity import parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
TERMINAL_PHASES = ("Succeeded", "Failed")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def is_deleting(pod: Mapping[str, Any]) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def is_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """Summed container requests (limits where requests are unset), by resource name."""
    totals: dict[str, Fraction] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        for name, quantity in merged.items():
            try:
                totals[name] = totals.get(name, Fraction(0)) + parse_quantity(quantity)
            except ValueError:
                continue
    return totals


def gpu_request(pod: Mapping[str, Any]) -> int:
    return int(pod_requests(pod).get(GPU_RESOURCE, Fraction(0)))


def device_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """What the pod asks of the NVIDIA device plugin: whole GPUs and MIG devices, by resource."""
    return {
        name: int(quantity)
        for name, quantity in pod_requests(pod).items()
        if (name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)) and int(quantity) > 0
    }


def runs_nvidia_smi(pod: Mapping[str, Any]) -> tuple[str, list[str]] | None:
    """The container whose command runs nvidia-smi (a smoke pod) or dcgmi (a DCGM gate's
    pod), if any: its name and its command and arguments."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        given = [*(container.get("command") or []), *(container.get("args") or [])]
        words = [str(w) for w in given]
        if any("nvidia-smi" in w or w == "dcgmi" for w in words):
            return str(container["name"]), words
    return None


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    return str(pod["metadata"].get("namespace") or ""), str(pod["metadata"]["name"])


def write_pod(
    registry: Registry, pod: Mapping[str, Any], change: Callable[[dict[str, Any]], None]
) -> None:
    """Apply `change` to the stored pod (the one `pod` was read from)."""
    registry.mutate(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"], change)
