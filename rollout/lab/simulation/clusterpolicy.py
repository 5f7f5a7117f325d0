"""The GPU Operator's reconciliation of its operand DaemonSets from the ClusterPolicy.

Two ClusterPolicy fields reach the operands: spec.driver.version becomes the driver image
(the driver DaemonSet is OnDelete, so pods change only when the upgrade controller restarts
them), and spec.devicePlugin.config becomes the device plugin's config environment (a RollingUpdate
DaemonSet, so plugin pods restart and load the new config, as with the real operator).
"""

from __future__ import annotations

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
    driver_image,
)

CONFIG_NAME_ENV = "CONFIG_NAME"
DEFAULT_CONFIG_ENV = "DEFAULT_CONFIG"


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
            self._set_env(DRIVER.name, {DRIVER_VERSION_ENV: version}, image=driver_image(version))
        config = (spec.get("devicePlugin") or {}).get("config") or {}
        self._set_env(
            DEVICE_PLUGIN.name,
            {
                CONFIG_NAME_ENV: str(config.get("name") or ""),
                DEFAULT_CONFIG_ENV: str(config.get("default") or ""),
            },
        )

    def _set_env(
        self, daemonset_name: str, values: dict[str, str], image: str | None = None
    ) -> None:
        daemonset = self.registry.find(DAEMONSETS, OPERATOR_NAMESPACE, daemonset_name)
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
        if not changed:
            return
        # Through the generic patch path so the DaemonSet's generation moves, as it would.
        self.registry.patch(
            DAEMONSETS,
            OPERATOR_NAMESPACE,
            daemonset_name,
            PatchType.MERGE,
            {"spec": {"template": {"spec": {"containers": containers}}}},
        )
