"""The GPU Operator's driver, as the ClusterPolicy states it: version, upgradePolicy, and which
nodes the driver DaemonSet serves (FACTS.md "Operator-managed driver upgrades").

Pure: read from the ClusterPolicy spec already in the cluster facts and from node labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DRIVER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.driver"
DEPLOY_OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
UPGRADE_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
UPGRADE_DONE = "upgrade-done"
UPGRADE_FAILED = "upgrade-failed"
UPGRADE_REQUIRED = "upgrade-required"
# Set by the operator on a node already cordoned when its upgrade starts: it stays cordoned
UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION = (
    "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
)
# States in which a node is not being worked on by the upgrade controller.
IDLE_STATES = frozenset({"", UPGRADE_DONE, UPGRADE_REQUIRED})
CLUSTER_POLICY_TARGET = "ClusterPolicy spec.driver.version"


@dataclass(frozen=True)
class UpgradePolicyFacts:
    """spec.driver.upgradePolicy with the CRD's defaults (autoUpgrade false,
    maxParallelUpgrades 1, maxUnavailable 25%)."""

    auto_upgrade: bool = False
    max_parallel: int = 1
    max_unavailable: int | str = "25%"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> UpgradePolicyFacts:
        spec = spec or {}
        unavailable = spec.get("maxUnavailable", "25%")
        return cls(
            auto_upgrade=spec.get("autoUpgrade") is True,
            max_parallel=int(spec.get("maxParallelUpgrades", 1) or 0),
            max_unavailable=unavailable if isinstance(unavailable, int) else str(unavailable),
        )

    def max_unavailable_count(self, served: int) -> int:
        """maxUnavailable as a node count of the served nodes (a percentage rounds up)."""
        if isinstance(self.max_unavailable, int):
            return self.max_unavailable
        text = self.max_unavailable.strip()
        if text.endswith("%"):
            return math.ceil(served * int(text[:-1]) / 100)
        return int(text)

    def describe(self) -> str:
        parallel = "unlimited" if self.max_parallel == 0 else str(self.max_parallel)
        return (
            f"autoUpgrade {str(self.auto_upgrade).lower()}, maxParallelUpgrades {parallel}, "
            f"maxUnavailable {self.max_unavailable}"
        )


@dataclass(frozen=True)
class OperatorDriver:
    """The operator's driver as the ClusterPolicy asks for it."""

    enabled: bool
    version: str
    policy: UpgradePolicyFacts

    @classmethod
    def from_cluster_policy(cls, spec: Mapping[str, Any]) -> OperatorDriver:
        """From a ClusterPolicy's spec (the cluster facts keep the spec only)."""
        driver = spec.get("driver") or {}
        return cls(
            enabled=driver.get("enabled", True) is not False,
            version=str(driver.get("version") or ""),
            policy=UpgradePolicyFacts.from_spec(driver.get("upgradePolicy")),
        )


def served_by_driver_daemonset(labels: Mapping[str, str]) -> bool:
    """Whether the driver DaemonSet runs a pod on a node with these labels."""
    return labels.get(DRIVER_DEPLOY_LABEL) == "true" and labels.get(DEPLOY_OPERANDS_LABEL) != (
        "false"
    )


def upgrade_state(labels: Mapping[str, str]) -> str:
    return labels.get(UPGRADE_STATE_LABEL, "")


def is_pinned(labels: Mapping[str, str]) -> bool:
    return labels.get(UPGRADE_SKIP_LABEL) == "true"
