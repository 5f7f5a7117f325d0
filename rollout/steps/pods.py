"""How steps read pods: one line per pod for an operator, a pod as it is now, the node's
device-plugin pods (gpu.wait waits for them, time-slicing restarts them)."""

from __future__ import annotations

from rollout.steps.base import StepContext
from rollout.transports.errors import NotFound
from rollout.transports.kube import Pod

# The GPU Operator's device-plugin DaemonSet labels its pods so (the lab copies it).
DEVICE_PLUGIN_SELECTOR = "app=nvidia-device-plugin-daemonset"


def find_device_plugin_pods(ctx: StepContext) -> list[Pod]:
    """The device-plugin pods bound to the node, in any namespace (operators vary)."""
    return ctx.kube.list_pods(
        None, label_selector=DEVICE_PLUGIN_SELECTOR, field_selector=f"spec.nodeName={ctx.node}"
    )


def describe_pod(pod: Pod) -> str:
    """One line for an operator: namespace/name, phase, readiness and whatever went wrong."""
    parts = [f"pod {pod.namespace}/{pod.name}: {pod.phase}"]
    if pod.phase == "Running":
        parts.append("ready" if pod.ready else "not ready")
    if pod.deleting:
        parts.append("terminating")
    if pod.container_reasons:
        parts.append("containers: " + ", ".join(pod.container_reasons))
    if pod.reason:
        parts.append(f"reason {pod.reason}")
    if pod.message:
        parts.append(pod.message)
    return ", ".join(parts)


def read_pod(ctx: StepContext, pod: Pod) -> Pod | None:
    """The pod as it is now; None once it is gone."""
    try:
        return ctx.kube.get_pod(pod.namespace, pod.name)
    except NotFound:
        return None


def is_pod_gone(original: Pod, current: Pod | None) -> bool:
    """Gone, or replaced: a pod of the same name with another uid is a new pod."""
    return current is None or current.uid != original.uid
