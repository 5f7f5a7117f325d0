"""The GPU Operator's footprint in the lab: label keys, operand DaemonSets, the ClusterPolicy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATOR_NAMESPACE = "gpu-operator"
CLUSTER_POLICY_NAME = "cluster-policy"
NVIDIA_HANDLER = "nvidia"

GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
DEPLOY_LABEL_PREFIX = "nvidia.com/gpu.deploy."
DEPLOY_OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
DEPLOY_COMPONENTS = (
    "driver",
    "container-toolkit",
    "device-plugin",
    "gpu-feature-discovery",
    "dcgm",
    "dcgm-exporter",
    "node-status-exporter",
    "operator-validator",
)
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
UPGRADE_REQUESTED_ANNOTATION = "nvidia.com/gpu-driver-upgrade-requested"
UPGRADE_DRAIN_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade-drain.skip"
UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION = (
    "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
)
DRIVER_VERSION_ENV = "DRIVER_VERSION"
# NVIDIADriver resources (ClusterPolicy spec.driver.useNvidiaDriverCRD): each one's DaemonSet
# carries the component label, which the upgrade controller selects driver pods by, and runs
# on the nodes the operator labelled managed-by the resource (its nodeSelector matched them).
DRIVER_COMPONENT_LABEL = "app.kubernetes.io/component"
DRIVER_COMPONENT = "nvidia-driver"
DRIVER_MANAGED_BY_LABEL = "nvidia.com/gpu.driver.managed-by"
# An NVIDIADriver without a nodeSelector serves every GPU node (GetNodeSelector).
DEFAULT_DRIVER_NODE_SELECTOR = {"nvidia.com/gpu.present": "true"}
# The nodePool OS the driver image tag and DaemonSet name carry (the lab's nodes are Debian 12)
NODE_OS_VERSION = "debian12"

# The MIG manager's mig-parted config (ClusterPolicy spec.migManager.config.name).
MIG_CONFIGMAP = "default-mig-parted-config"

# Knobs of the lab, not of the GPU Operator.
UNHEALTHY_GPUS_ANNOTATION = "lab.rollout/unhealthy-gpus"
FAIL_UPGRADE_ANNOTATION = "lab.rollout/fail-upgrade"
NOT_READY_ANNOTATION = "lab.rollout/not-ready"
# The validator's init containers never pass on the node while it is set (its value: why)
VALIDATOR_STUCK_ANNOTATION = "lab.rollout/validator-stuck"
# The device plugin pod crash-loops while set; the value is the line its log ends with.
DEVICE_PLUGIN_CRASH_ANNOTATION = "lab.rollout/device-plugin-crash"


@dataclass(frozen=True)
class Operand:
    """One operand DaemonSet of the operator."""

    name: str
    component: str
    container: str
    image: str
    runtime_class: str | None

    @property
    def deploy_label(self) -> str:
        return DEPLOY_LABEL_PREFIX + self.component


DRIVER = Operand("nvidia-driver-daemonset", "driver", "nvidia-driver-ctr", "nvidia/driver", None)
TOOLKIT = Operand(
    "nvidia-container-toolkit-daemonset",
    "container-toolkit",
    "nvidia-container-toolkit-ctr",
    "nvidia/k8s/container-toolkit:v1.16.2-ubuntu20.04",
    None,
)
DEVICE_PLUGIN = Operand(
    "nvidia-device-plugin-daemonset",
    "device-plugin",
    "nvidia-device-plugin",
    "nvidia/k8s-device-plugin:v0.16.2-ubi8",
    NVIDIA_HANDLER,
)
VALIDATOR = Operand(
    "nvidia-operator-validator",
    "operator-validator",
    "nvidia-operator-validator",
    "nvidia/cloud-native/gpu-operator-validator:v24.6.2",
    NVIDIA_HANDLER,
)
# Runs on the nodes labelled nvidia.com/gpu.deploy.mig-manager=true: the operator sets that
# only where GFD found MIG-capable GPUs (the lab: at lab up, bootstrap.to_node).
MIG_MANAGER = Operand(
    "nvidia-mig-manager",
    "mig-manager",
    "nvidia-mig-manager",
    "nvidia/cloud-native/k8s-mig-manager:v0.8.0-ubuntu20.04",
    NVIDIA_HANDLER,
)
OPERANDS = (TOOLKIT, DRIVER, DEVICE_PLUGIN, VALIDATOR, MIG_MANAGER)


def driver_image(version: str) -> str:
    return f"{DRIVER.image}:{version}-ubuntu22.04"


def to_daemonset(operand: Operand, driver_version: str) -> dict[str, Any]:
    """The operand's DaemonSet as the operator would create it."""
    container: dict[str, Any] = {"name": operand.container, "image": operand.image}
    if operand is DRIVER:
        container["image"] = driver_image(driver_version)
        container["env"] = [{"name": DRIVER_VERSION_ENV, "value": driver_version}]
    if operand is DEVICE_PLUGIN:
        container["env"] = [
            {"name": "CONFIG_NAME", "value": ""},
            {"name": "DEFAULT_CONFIG", "value": ""},
        ]
    pod_spec: dict[str, Any] = {
        "nodeSelector": {operand.deploy_label: "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-node-critical",
        "serviceAccountName": operand.name.removesuffix("-daemonset"),
        "containers": [container],
    }
    if operand.runtime_class:
        pod_spec["runtimeClassName"] = operand.runtime_class
    strategy: dict[str, Any] = (
        {"type": "OnDelete"}
        if operand is DRIVER
        else {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "1", "maxSurge": 0}}
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": operand.name,
            "namespace": OPERATOR_NAMESPACE,
            "labels": {"app": operand.name, "app.kubernetes.io/part-of": "gpu-operator"},
        },
        "spec": {
            "selector": {"matchLabels": {"app": operand.name}},
            "updateStrategy": strategy,
            "template": {
                "metadata": {
                    "labels": {"app": operand.name, "app.kubernetes.io/part-of": "gpu-operator"}
                },
                "spec": pod_spec,
            },
        },
    }


def to_cluster_policy(driver_version: str, use_driver_crd: bool = False) -> dict[str, Any]:
    """A ClusterPolicy like the operator's Helm chart installs, with auto-upgrade on; with
    `use_driver_crd` the driver is left to NVIDIADriver resources (and their upgradePolicy is
    still this one's: the upgrade controller reads only the ClusterPolicy)."""
    policy: dict[str, Any] = {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": CLUSTER_POLICY_NAME},
        "spec": {
            "operator": {"defaultRuntime": "containerd"},
            "daemonsets": {"updateStrategy": "RollingUpdate"},
            "driver": {
                "enabled": True,
                "image": "driver",
                "version": driver_version,
                "upgradePolicy": {
                    "autoUpgrade": True,
                    "maxParallelUpgrades": 1,
                    "maxUnavailable": "25%",
                    "podDeletion": {"force": False, "timeoutSeconds": 300, "deleteEmptyDir": False},
                    "waitForCompletion": {"timeoutSeconds": 0},
                    "drain": {
                        "enable": False,
                        "force": False,
                        "timeoutSeconds": 300,
                        "deleteEmptyDir": False,
                    },
                },
            },
            "toolkit": {"enabled": True},
            "devicePlugin": {"enabled": True, "config": {"name": "", "default": ""}},
            "gfd": {"enabled": True},
            "mig": {"strategy": "single"},
            "migManager": {"enabled": True, "config": {"name": MIG_CONFIGMAP}},
            "validator": {"plugin": {"env": [{"name": "WITH_WORKLOAD", "value": "false"}]}},
        },
    }
    if use_driver_crd:
        policy["spec"]["driver"]["useNvidiaDriverCRD"] = True
    return policy


def uses_driver_crd(cluster_policy: Mapping[str, Any] | None) -> bool:
    """The ClusterPolicy delegates the driver to NVIDIADriver resources."""
    driver = ((cluster_policy or {}).get("spec") or {}).get("driver") or {}
    return driver.get("useNvidiaDriverCRD") is True


def to_nvidia_driver(
    name: str, version: str, node_selector: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """An NVIDIADriver resource as a user writes one (the CRD's defaults filled in)."""
    spec: dict[str, Any] = {
        "driverType": "gpu",
        "image": "driver",
        "repository": "nvcr.io/nvidia",
        "version": version,
        "kernelModuleType": "auto",
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": name},
        "spec": spec,
    }


def is_driver_pod(pod: Mapping[str, Any]) -> bool:
    """A pod of the ClusterPolicy's driver DaemonSet or of an NVIDIADriver's."""
    labels = pod["metadata"].get("labels") or {}
    return owner_daemonset(pod) == DRIVER.name or labels.get(DRIVER_COMPONENT_LABEL) == (
        DRIVER_COMPONENT
    )


def driver_version_of(pod: Mapping[str, Any]) -> str | None:
    """The driver version a driver pod runs (from its container env)."""
    for container in pod.get("spec", {}).get("containers") or []:
        for env in container.get("env") or []:
            if env.get("name") == DRIVER_VERSION_ENV:
                return str(env.get("value"))
    return None


def owner_daemonset(pod: Mapping[str, Any]) -> str | None:
    """The name of the DaemonSet controlling a pod, if one does."""
    for reference in pod["metadata"].get("ownerReferences") or []:
        if reference.get("kind") == "DaemonSet" and reference.get("controller"):
            return str(reference.get("name"))
    return None
