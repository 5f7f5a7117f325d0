"""The pod facts diagnose reads: GPU requests and limits, RuntimeClass, where it may run.

Parsed from a pod as the API returns it (recorded facts hold the manifests), or taken from
the transport's `Pod` (live facts), which reads the same parts of the spec. `spec_known` is
false only for facts recorded before the transport read the spec: requests, limits,
RuntimeClass, selectors and tolerations were then not read and are not judged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rollout.inputs.wholenumber import whole_number
from rollout.operatornames import GPU_RESOURCE as GPU_RESOURCE
from rollout.operatornames import SHARED_GPU_RESOURCE as SHARED_GPU_RESOURCE
from rollout.transports.kube import Pod
from rollout.transports.kube import Toleration as ApiToleration

# The GPU's resource names are the operator's (rollout.operatornames); with renameByDefault
# a time-sliced GPU is advertised under the shared one. MIG devices have resources of their own.
GPU_PREFIXES = (GPU_RESOURCE, "nvidia.com/mig-")


@dataclass(frozen=True)
class ContainerGpus:
    """One container's GPU resources: resource name -> quantity text, as written."""

    name: str
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Toleration(ApiToleration):
    """A toleration as the API transport reads it, with Kubernetes' rule for a taint.

    The facts leave `toleration_seconds` unset: diagnose does not judge it and recorded facts
    do not keep it.
    """

    @classmethod
    def from_api(cls, toleration: ApiToleration) -> Toleration:
        """The transport's toleration (a live pod's or DaemonSet's) as the facts keep it."""
        return cls(toleration.key, toleration.operator, toleration.value, toleration.effect)

    def tolerates(self, key: str, value: str, effect: str) -> bool:
        """Kubernetes' rule: an empty key with Exists tolerates everything."""
        if self.effect and self.effect != effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != key:
            return False
        return self.operator == "Exists" or self.value == value


@dataclass(frozen=True)
class PodFacts:
    namespace: str
    name: str
    node_name: str | None = None
    phase: str = "Pending"
    spec_known: bool = True
    runtime_class: str | None = None
    containers: tuple[ContainerGpus, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    # the PodScheduled=False message (`0/4 nodes are available: 4 Insufficient nvidia.com/gpu.`)
    unschedulable_message: str = ""
    container_reasons: tuple[str, ...] = ()
    # whole GPUs asked for (limits, else requests), summed over containers; from the transport
    gpu_request: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def gpu_resources(self) -> dict[str, str]:
        """Each GPU resource the pod asks for -> the summed quantity text (limits else requests)."""
        total: dict[str, float] = {}
        for container in self.containers:
            for resource, quantity in {**container.requests, **container.limits}.items():
                total[resource] = total.get(resource, 0.0) + quantity_value(quantity)
        return {k: _format(v) for k, v in total.items()}

    @property
    def wants_gpu(self) -> bool:
        return self.gpu_request > 0 or bool(self.gpu_resources)

    def to_manifest(self) -> dict[str, Any]:
        """The parts of a pod manifest that parse_pod_manifest reads (for `facts record`)."""
        containers = [
            {
                "name": c.name,
                "resources": {
                    k: dict(v) for k, v in (("requests", c.requests), ("limits", c.limits)) if v
                },
            }
            for c in self.containers
        ]
        if not self.spec_known and self.gpu_request:
            # only the whole GPUs were read: keep them as the limit they were read from
            limits = {GPU_RESOURCE: str(self.gpu_request)}
            containers = [{"name": "", "resources": {"limits": limits}}]
        spec: dict[str, Any] = {"containers": containers}
        if self.node_name:
            spec["nodeName"] = self.node_name
        if self.runtime_class:
            spec["runtimeClassName"] = self.runtime_class
        if self.node_selector:
            spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            spec["tolerations"] = [
                {k: v for k, v in vars(t).items() if v} for t in self.tolerations
            ]
        status: dict[str, Any] = {"phase": self.phase}
        if self.unschedulable_message:
            status["conditions"] = [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": self.unschedulable_message,
                }
            ]
        return {
            "metadata": {"namespace": self.namespace, "name": self.name},
            "spec": spec,
            "status": status,
        }


def parse_pod_manifest(obj: Mapping[str, Any]) -> PodFacts:
    """A pod as the API returns it (or as recorded) -> PodFacts; missing parts are empty."""
    meta = _mapping(obj.get("metadata"))
    spec = _mapping(obj.get("spec"))
    status = _mapping(obj.get("status"))
    containers = tuple(
        ContainerGpus(
            name=str(_mapping(c).get("name", "")),
            requests=_gpu_map(_mapping(_mapping(c).get("resources")).get("requests")),
            limits=_gpu_map(_mapping(_mapping(c).get("resources")).get("limits")),
        )
        for c in _list(spec.get("containers"))
    )
    message = next(
        (
            str(_mapping(c).get("message", ""))
            for c in _list(status.get("conditions"))
            if _mapping(c).get("type") == "PodScheduled" and _mapping(c).get("status") == "False"
        ),
        "",
    )
    reasons = tuple(
        str(_mapping(state).get("reason"))
        for cs in _list(status.get("containerStatuses"))
        for state in _mapping(_mapping(cs).get("state")).values()
        if _mapping(state).get("reason")
    )
    pod = PodFacts(
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "")),
        node_name=str(spec["nodeName"]) if spec.get("nodeName") else None,
        phase=str(status.get("phase", "Pending")),
        runtime_class=str(spec["runtimeClassName"]) if spec.get("runtimeClassName") else None,
        containers=containers,
        node_selector={str(k): str(v) for k, v in _mapping(spec.get("nodeSelector")).items()},
        tolerations=tuple(
            Toleration(
                key=str(_mapping(t).get("key", "") or ""),
                operator=str(_mapping(t).get("operator", "Equal") or "Equal"),
                value=str(_mapping(t).get("value", "") or ""),
                effect=str(_mapping(t).get("effect", "") or ""),
            )
            for t in _list(spec.get("tolerations"))
        ),
        unschedulable_message=message,
        container_reasons=reasons,
    )
    whole = sum(int(quantity_value(v)) for k, v in pod.gpu_resources.items() if k == GPU_RESOURCE)
    return replace(pod, gpu_request=whole)


def pod_facts_from(pod: Pod) -> PodFacts:
    """What the transport's Pod tells, as parse_pod_manifest reads the same pod's manifest."""
    return PodFacts(
        namespace=pod.namespace,
        name=pod.name,
        node_name=pod.node_name,
        phase=pod.phase,
        runtime_class=pod.runtime_class_name,
        containers=tuple(
            ContainerGpus(name=c.name, requests=_gpu_map(c.requests), limits=_gpu_map(c.limits))
            for c in pod.resources
        ),
        node_selector=dict(pod.node_selector),
        tolerations=tuple(Toleration.from_api(t) for t in pod.tolerations),
        unschedulable_message=pod.scheduling_message
        or (pod.message if pod.reason == "Unschedulable" else ""),
        container_reasons=pod.container_reasons,
        gpu_request=pod.gpu_request,
    )


def is_gpu_resource(name: str) -> bool:
    return name.startswith(GPU_PREFIXES)


def gpu_counts(values: Mapping[str, str]) -> dict[str, int]:
    """The GPU resources (nvidia.com/gpu, .shared, mig-*) of a node's capacity or
    allocatable, as numbers (a quantity that is not a whole number counts 0)."""
    return {name: whole_number(text) or 0 for name, text in values.items() if is_gpu_resource(name)}


def advertised_now(capacity: Mapping[str, str], allocatable: Mapping[str, str]) -> dict[str, int]:
    """The GPU resources a node has now, every device counted healthy: its capacity, but 0
    for a resource none of which is allocatable. The kubelet's device manager counts an
    unhealthy device in capacity only, and a plugin that stops advertising a resource
    (a layout put back to all-disabled, a time-slicing profile renamed) turns all its devices
    unhealthy, capacity kept, for endpointStopGracePeriod (5 minutes) before the resource
    goes (FACTS.md, kubelet device manager). Capacity alone where the facts hold no
    allocatable."""
    counts = gpu_counts(capacity)
    if not allocatable:
        return counts
    offered = gpu_counts(allocatable)
    return {name: count if offered.get(name) else 0 for name, count in counts.items()}


# kube-apiserver's words when it refuses a pod's extended-resource quantities
# (pkg/apis/core/validation ValidateResourceRequirements); the key is the diagnose check.
GPU_REFUSALS = {
    "Limit must be set for non overcommitable resources": "pods.requests-without-limits",
    "must be an integer": "pods.fractional-request",
    "must be equal to nvidia.com/": "pods.request-differs-from-limit",
}


def gpu_refusal_check(message: str) -> str | None:
    """The diagnose check of an API refusal of a GPU pod's resources; None: another refusal."""
    if "nvidia.com/" not in message and "non overcommitable" not in message:
        return None
    return next((check for words, check in GPU_REFUSALS.items() if words in message), None)


def is_gpu_refusal(message: str) -> bool:
    return gpu_refusal_check(message) is not None


def quantity_value(text: str) -> float:
    """A Kubernetes quantity (`1`, `0.5`, `500m`) -> a number; unreadable -> 0."""
    text = text.strip()
    try:
        if text.endswith("m"):
            return float(text[:-1]) / 1000
        return float(text)
    except ValueError:
        return 0.0


def _format(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def _gpu_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(value).items() if is_gpu_resource(str(k))}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
