"""The GPU Operator's reconciliation of its operand DaemonSets from the ClusterPolicy.

As the real operator does (NVIDIA/gpu-operator controllers/object_controls.go), each operand's
DaemonSet is rendered from the sections of the spec its transform reads, and written only
when that rendering changes (the `nvidia.com/last-applied-hash` annotation is a hash of the
rendered DaemonSet, `isDaemonsetSpecChanged`): a spec change rolls only the operands whose
rendering it changes.

- spec.driver.version becomes the driver image (the driver DaemonSet is OnDelete, so pods
  change only when the upgrade controller restarts them).
- The toolkit (`TransformToolkit`) renders from spec.toolkit, spec.cdi, the validator image
  of its validation init container (spec.validator), the runtime class (spec.operator) and
  the settings common to every operand DaemonSet (spec.daemonsets, `preProcessDaemonSet`).
  A change there rolls the toolkit pods, and each node's toolkit re-runs: it deletes its
  drop-in and signals containerd as the old pod stops, writes it and signals again as the
  new one starts (two containerd restarts per node).
- spec.devicePlugin.config is read by `TransformDevicePlugin` (`handleDevicePluginConfig`),
  not by the toolkit: a time-slicing change rolls the device plugin only, and restarts no
  containerd. The operator walks its states in order and stops at the first that is not
  ready, so the device plugin gets its new config once the toolkit is rolled out and ready.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.patches import PatchType
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import DAEMONSETS
from rollout.lab.simulation.gpuoperator import (
    DEVICE_PLUGIN,
    DRIVER,
    DRIVER_VERSION_ENV,
    OPERATOR_NAMESPACE,
    TOOLKIT,
    driver_image,
)

CONFIG_NAME_ENV = "CONFIG_NAME"
DEFAULT_CONFIG_ENV = "DEFAULT_CONFIG"
# On the toolkit's pod template: the ClusterPolicy sections it was rendered from.
TOOLKIT_INPUTS_ANNOTATION = "lab.rollout/toolkit-inputs-hash"
# The sections of the spec TransformToolkit (and preProcessDaemonSet) render the toolkit from.
TOOLKIT_SECTIONS = ("toolkit", "cdi", "operator", "daemonsets")
# Of spec.validator, what the toolkit's validation init container takes.
VALIDATOR_IMAGE_FIELDS = ("repository", "image", "version", "imagePullPolicy")


def toolkit_inputs(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What of the ClusterPolicy the toolkit's DaemonSet is rendered from."""
    inputs = {k: spec[k] for k in TOOLKIT_SECTIONS if k in spec}
    validator = spec.get("validator") or {}
    inputs["validator"] = {k: validator[k] for k in VALIDATOR_IMAGE_FIELDS if k in validator}
    return inputs


def toolkit_inputs_hash(spec: Mapping[str, Any]) -> str:
    text = json.dumps(toolkit_inputs(spec), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def set_container_env(
    registry: Registry, daemonset_name: str, values: dict[str, str], image: str | None = None
) -> None:
    """Set env values (and the image) of an operator DaemonSet's first container, through
    the generic patch path so the DaemonSet's generation moves, as it would; no change, no
    write."""
    daemonset = registry.find(DAEMONSETS, OPERATOR_NAMESPACE, daemonset_name)
    if daemonset is None:
        return
    containers = daemonset["spec"]["template"]["spec"]["containers"]
    changed = False
    for container in containers[:1]:
        env = container.setdefault("env", [])
        current = {e.get("name"): e.get("value") for e in env}
        for name, value in values.items():
            if current.get(name) != value:
                env[:] = [e for e in env if e.get("name") != name]
                env.append({"name": name, "value": value})
                changed = True
        if image is not None and container.get("image") != image:
            container["image"] = image
            changed = True
    if changed:
        registry.patch(
            DAEMONSETS,
            OPERATOR_NAMESPACE,
            daemonset_name,
            PatchType.MERGE,
            {"spec": {"template": {"spec": {"containers": containers}}}},
        )


@dataclass(eq=False)
class ClusterPolicyController:
    """Keeps operand DaemonSet templates in step with the ClusterPolicy."""

    registry: Registry

    def reconcile(self, cluster_policy: Mapping[str, Any] | None) -> None:
        if cluster_policy is None:
            return
        spec = cluster_policy.get("spec") or {}
        version = str((spec.get("driver") or {}).get("version") or "")
        if version:
            set_container_env(
                self.registry, DRIVER.name, {DRIVER_VERSION_ENV: version}, driver_image(version)
            )
        self._stamp_toolkit(toolkit_inputs_hash(spec))
        if not self._rolled_out(TOOLKIT.name):
            return  # the device-plugin state waits for the toolkit state
        config = (spec.get("devicePlugin") or {}).get("config") or {}
        set_container_env(
            self.registry,
            DEVICE_PLUGIN.name,
            {
                CONFIG_NAME_ENV: str(config.get("name") or ""),
                DEFAULT_CONFIG_ENV: str(config.get("default") or ""),
            },
        )

    def _stamp_toolkit(self, digest: str) -> None:
        daemonset = self.registry.find(DAEMONSETS, OPERATOR_NAMESPACE, TOOLKIT.name)
        if daemonset is None:
            return
        metadata = daemonset["spec"]["template"].get("metadata") or {}
        if (metadata.get("annotations") or {}).get(TOOLKIT_INPUTS_ANNOTATION) == digest:
            return
        patch = {"metadata": {"annotations": {TOOLKIT_INPUTS_ANNOTATION: digest}}}
        self.registry.patch(
            DAEMONSETS,
            OPERATOR_NAMESPACE,
            TOOLKIT.name,
            PatchType.MERGE,
            {"spec": {"template": patch}},
        )

    def _rolled_out(self, name: str) -> bool:
        """Every pod of the DaemonSet is of its newest template and ready."""
        daemonset = self.registry.find(DAEMONSETS, OPERATOR_NAMESPACE, name)
        if daemonset is None:
            return True
        status = daemonset.get("status") or {}
        desired = status.get("desiredNumberScheduled", 0)
        return bool(
            status.get("observedGeneration") == daemonset["metadata"].get("generation")
            and status.get("updatedNumberScheduled") == desired
            and status.get("numberReady") == desired
        )
