"""The GPU Operator as the cluster shows it: its namespace, which pods are its operands, the
labels its GPU Feature Discovery puts on each GPU node, and the device-plugin config its
ClusterPolicy names.

Pure: read from pods and from the ClusterPolicy's spec as the API returns them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from rollout.inputs.wholenumber import whole_number
from rollout.operatornames import OPERATOR_NAMESPACE

if TYPE_CHECKING:
    from rollout.facts.model import NodeFacts

# The operator names its operand pods nvidia-<operand>-...
OPERAND_NAME_PREFIX = "nvidia-"
# The RuntimeClass the operator creates for GPU pods (its handler is the toolkit's runtime)
OPERATOR_RUNTIME_CLASS = "nvidia"
# What GPU Feature Discovery labels a GPU node with: that it has GPUs, how many, and the
# time-slicing replicas its device plugin runs (1: no sharing)
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
# The operator's validator pod, one per GPU node (app=nvidia-operator-validator): its init
# containers validate the stack in order and it is Ready only once every one has passed
VALIDATOR_APP = "nvidia-operator-validator"
VALIDATIONS = ("driver-validation", "toolkit-validation", "cuda-validation", "plugin-validation")


def labelled_number(labels: Mapping[str, str], key: str) -> int | None:
    """A GFD label's value when it is a whole number above 0; None when absent or not one."""
    number = whole_number(labels.get(key, ""))
    return number if number else None


def current_replicas(node: NodeFacts) -> int:
    """The replicas the node's device plugin runs now: GFD's gpu.replicas label, else 1."""
    return labelled_number(node.labels, GPU_REPLICAS_LABEL) or 1


def physical_gpus(node: NodeFacts) -> int:
    """The node's GPUs: nvidia-smi's count, else GFD's count label (nvidia-smi lists none while
    a driver is being replaced); 0 when neither says."""
    return node.gpus.count or labelled_number(node.labels, GPU_COUNT_LABEL) or 0


class NamedPod(Protocol):
    """A pod as far as telling an operand takes: the transport's Pod and PodFacts alike."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...


def is_validator(labels: Mapping[str, str]) -> bool:
    """Whether a pod with these labels is the operator's validator pod."""
    return labels.get("app") == VALIDATOR_APP


def is_operand(pod: NamedPod) -> bool:
    """Whether the pod is one of the GPU Operator's: in its namespace, or named like its pods."""
    return pod.namespace == OPERATOR_NAMESPACE or pod.name.startswith(OPERAND_NAME_PREFIX)


@dataclass(frozen=True)
class DevicePluginConfigRef:
    """The ClusterPolicy's spec.devicePlugin.config: the ConfigMap (in the operator's
    namespace) the device plugin loads profiles from, and the key an unlabelled node loads.
    "" where unset."""

    name: str = ""
    default: str = ""

    @classmethod
    def from_policy(cls, policy: Mapping[str, Any]) -> DevicePluginConfigRef:
        """Read from a ClusterPolicy's spec. The CRD allows only strings in these fields;
        anything else (a number, a list, a mapping where one is expected) reads as unset."""
        plugin = policy.get("devicePlugin")
        config = plugin.get("config") if isinstance(plugin, Mapping) else None
        if not isinstance(config, Mapping):
            return cls()
        name, default = config.get("name"), config.get("default")
        return cls(
            name=name if isinstance(name, str) else "",
            default=default if isinstance(default, str) else "",
        )

    @property
    def configmap(self) -> str:
        """The ConfigMap as namespace/name (the key of ClusterFacts.configmaps); "" if none."""
        return f"{OPERATOR_NAMESPACE}/{self.name}" if self.name else ""
