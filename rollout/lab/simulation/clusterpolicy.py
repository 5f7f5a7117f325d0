"""The GPU Operator's reconciliation of its operand DaemonSets from the ClusterPolicy.

spec.driver.version becomes the driver image (the driver DaemonSet is OnDelete, so pods
change only when the upgrade controller restarts them). Any other change of the spec is
rendered into the toolkit's DaemonSet (a hash of the spec in its template), so the toolkit
pods roll and each node's toolkit re-runs: the seed incident's "time-slicing made the toolkit
re-run". The operator walks its states in order and stops at the first that is not ready,
so spec.devicePlugin.config reaches the device plugin's config environment (plugin pods
restart and load it) only once the toolkit DaemonSet has rolled out and is ready.
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
# On the toolkit's pod template: the ClusterPolicy spec (less the driver) it was rendered from.
POLICY_HASH_ANNOTATION = "lab.rollout/cluster-policy-hash"


def policy_hash(spec: Mapping[str, Any]) -> str:
    """What of the ClusterPolicy the toolkit is rendered from: all but the driver section."""
    rest = {k: v for k, v in spec.items() if k != "driver"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()[:16]


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
        self._stamp_toolkit(policy_hash(spec))
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
        if (metadata.get("annotations") or {}).get(POLICY_HASH_ANNOTATION) == digest:
            return
        patch = {"metadata": {"annotations": {POLICY_HASH_ANNOTATION: digest}}}
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
