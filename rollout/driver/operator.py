"""The GPU Operator's driver, as the ClusterPolicy or one NVIDIADriver resource states it:
version, upgradePolicy, and which nodes the driver DaemonSet serves (FACTS.md
"Operator-managed driver upgrades").

With the ClusterPolicy's `driver.useNvidiaDriverCRD: true` each NVIDIADriver (nvidia.com/v1alpha1,
cluster-scoped) has its own `spec.version` and driver DaemonSet, which runs on the nodes the
operator labelled `nvidia.com/gpu.driver.managed-by=<name>` (those its `nodeSelector` matches)
that carry `nvidia.com/gpu.deploy.driver=true`. The upgradePolicy stays the ClusterPolicy's:
the operator's upgrade controller reads only that one, over every driver pod of the cluster
(gpu-operator controllers/upgrade_controller.go).

Pure: read from the ClusterPolicy and NVIDIADriver specs in the cluster facts and node labels.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rollout.operatornames import (
    DEPLOY_LABEL_PREFIX,
    UPGRADE_DONE,
    UPGRADE_REQUIRED,
    UPGRADE_STATE_LABEL,
)

# A driver upgrade pauses the operands by setting their deploy labels to OPERAND_PAUSED.
DRIVER_DEPLOY_LABEL = f"{DEPLOY_LABEL_PREFIX}driver"
DEPLOY_OPERANDS_LABEL = f"{DEPLOY_LABEL_PREFIX}operands"
OPERAND_PAUSED = "paused-for-driver-upgrade"
UPGRADE_SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
# Set by the operator on a node already cordoned when its upgrade starts: it stays cordoned
UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION = (
    "nvidia.com/gpu-driver-upgrade.node-initial-state.unschedulable"
)
# States in which a node is not being worked on by the upgrade controller.
IDLE_STATES = frozenset({"", UPGRADE_DONE, UPGRADE_REQUIRED})
MANAGED_BY_LABEL = "nvidia.com/gpu.driver.managed-by"
# The Helm chart's name for the ClusterPolicy, used in the commands rollout prints
DEFAULT_CLUSTER_POLICY = "cluster-policy"
# The driver pods of the ClusterPolicy's DaemonSet, and of every NVIDIADriver's
CLUSTER_POLICY_POD_SELECTOR = "app=nvidia-driver-daemonset"
NVIDIADRIVER_POD_SELECTOR = "app.kubernetes.io/component=nvidia-driver"


@dataclass(frozen=True)
class DriverSource:
    """Where the driver version is set: the ClusterPolicy (resource None) or one NVIDIADriver."""

    resource: str | None = None

    @property
    def target(self) -> str:
        if self.resource is None:
            return "ClusterPolicy spec.driver.version"
        return f"NVIDIADriver {self.resource} spec.version"

    @property
    def what(self) -> str:
        """The object, for messages."""
        return "the ClusterPolicy" if self.resource is None else f"NVIDIADriver {self.resource}"

    @property
    def pod_selector(self) -> str:
        """The label selector of the driver pods (the node's one is its DaemonSet's)."""
        if self.resource is None:
            return CLUSTER_POLICY_POD_SELECTOR
        return NVIDIADRIVER_POD_SELECTOR

    def serves(self, labels: Mapping[str, str]) -> bool:
        """Whether this source's driver DaemonSet runs a pod on a node with these labels."""
        if not served_by_driver_daemonset(labels):
            return False
        return self.resource is None or labels.get(MANAGED_BY_LABEL) == self.resource

    def version_patch(self, version: str) -> dict[str, Any]:
        """The merge patch that sets the version on this source."""
        if self.resource is None:
            return {"spec": {"driver": {"version": version}}}
        return {"spec": {"version": version}}

    def version_command(self, version: str, policy: str = DEFAULT_CLUSTER_POLICY) -> str:
        """What sets the version (to go back to the old one)."""
        patch = json.dumps(self.version_patch(version), separators=(",", ":"))
        if self.resource is None:
            return f"kubectl patch clusterpolicy {policy} --type merge -p '{patch}'"
        return f"kubectl patch nvidiadriver {self.resource} --type merge -p '{patch}'"


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
    """The operator's driver as the ClusterPolicy (or one NVIDIADriver) asks for it."""

    enabled: bool
    version: str
    policy: UpgradePolicyFacts
    source: DriverSource = DriverSource()
    # the ClusterPolicy delegates the driver to NVIDIADriver resources
    uses_driver_crd: bool = False

    @classmethod
    def from_cluster_policy(cls, spec: Mapping[str, Any]) -> OperatorDriver:
        """From a ClusterPolicy's spec (the cluster facts keep the spec only)."""
        driver = spec.get("driver") or {}
        return cls(
            enabled=driver.get("enabled", True) is not False,
            version=str(driver.get("version") or ""),
            policy=UpgradePolicyFacts.from_spec(driver.get("upgradePolicy")),
            uses_driver_crd=driver.get("useNvidiaDriverCRD") is True,
        )

    def with_nvidia_driver(self, name: str, spec: Mapping[str, Any]) -> OperatorDriver:
        """The driver as the NVIDIADriver `name` (its spec) asks for it, under this
        ClusterPolicy's upgradePolicy."""
        return replace(self, version=str(spec.get("version") or ""), source=DriverSource(name))


def served_by_driver_daemonset(labels: Mapping[str, str]) -> bool:
    """Whether the driver DaemonSet runs a pod on a node with these labels."""
    return labels.get(DRIVER_DEPLOY_LABEL) == "true" and labels.get(DEPLOY_OPERANDS_LABEL) != (
        "false"
    )


def upgrade_state(labels: Mapping[str, str]) -> str:
    return labels.get(UPGRADE_STATE_LABEL, "")


def is_pinned(labels: Mapping[str, str]) -> bool:
    return labels.get(UPGRADE_SKIP_LABEL) == "true"
