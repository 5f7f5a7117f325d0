"""The upgrade controller's vocabulary: states, the upgradePolicy, a node's snapshot, and
the judgements it makes (in sync, ready, failing, slots available)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollout.lab.apiserver.disruption import scale_int_or_percent
from rollout.lab.apiserver.selectors import LabelSelector
from rollout.lab.simulation.daemonsets import REVISION_HASH_LABEL, _template_hash
from rollout.lab.simulation.gpuoperator import UPGRADE_STATE_LABEL
from rollout.lab.simulation.nodelifecycle import is_node_ready
from rollout.lab.simulation.pods import is_deleting, is_ready, pod_requests

# When a node entered a waiting state, as k8s-operator-libs records it (unix seconds).
VALIDATION_START_ANNOTATION = "nvidia.com/gpu-driver-upgrade-validation-start-time"
WAIT_START_ANNOTATION = "nvidia.com/gpu-driver-upgrade-wait-for-pod-completion-start-time"
POD_DELETION_START_ANNOTATION = "lab.rollout/driver-upgrade-pod-deletion-start-time"
DRAIN_START_ANNOTATION = "lab.rollout/driver-upgrade-drain-start-time"
# A driver container restarted more than this often is failing (isDriverPodFailing).
MAX_DRIVER_RESTARTS = 10


class UpgradeState(StrEnum):
    """Values of nvidia.com/gpu-driver-upgrade-state."""

    UNKNOWN = ""
    DONE = "upgrade-done"
    REQUIRED = "upgrade-required"
    CORDON = "cordon-required"
    WAIT_FOR_JOBS = "wait-for-jobs-required"
    POD_DELETION = "pod-deletion-required"
    DRAIN = "drain-required"
    POD_RESTART = "pod-restart-required"
    VALIDATION = "validation-required"
    UNCORDON = "uncordon-required"
    FAILED = "upgrade-failed"


# Not in progress: the rest (upgrade-failed included) take a parallel slot.
IDLE_STATES = frozenset({UpgradeState.UNKNOWN, UpgradeState.DONE, UpgradeState.REQUIRED})


@dataclass(frozen=True)
class UpgradeTimings:
    """`dwell_s`: least time between two reconciles; `validation_timeout_s`: then failed;
    `resync_s`: the periodic reconcile (the operator's is 120 s)."""

    dwell_s: float = 1.0
    validation_timeout_s: float = 600.0
    resync_s: float = 120.0


@dataclass(frozen=True)
class UpgradePolicy:
    """ClusterPolicy spec.driver.upgradePolicy, with the CRD's defaults."""

    auto_upgrade: bool
    max_parallel: int
    max_unavailable: int | str
    force: bool = False
    delete_empty_dir: bool = False
    pod_deletion_timeout_s: float = 300.0
    drain_enabled: bool = False
    drain_force: bool = False
    drain_delete_empty_dir: bool = False
    drain_selector: LabelSelector = field(default_factory=lambda: LabelSelector.from_text(None))
    drain_timeout_s: float = 300.0
    wait_selector: LabelSelector | None = None
    wait_timeout_s: float = 0.0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> UpgradePolicy:
        deletion = spec.get("podDeletion") or {}
        drain = spec.get("drain") or {}
        wait = spec.get("waitForCompletion") or {}
        return cls(
            auto_upgrade=bool(spec.get("autoUpgrade", False)),
            max_parallel=int(spec.get("maxParallelUpgrades", 1)),
            max_unavailable=spec.get("maxUnavailable", "25%"),
            force=bool(deletion.get("force", False)),
            delete_empty_dir=bool(deletion.get("deleteEmptyDir", False)),
            pod_deletion_timeout_s=float(deletion.get("timeoutSeconds", 300)),
            drain_enabled=bool(drain.get("enable", False)),
            drain_force=bool(drain.get("force", False)),
            drain_delete_empty_dir=bool(drain.get("deleteEmptyDir", False)),
            drain_selector=LabelSelector.from_text(drain.get("podSelector")),
            drain_timeout_s=float(drain.get("timeoutSeconds", 300)),
            wait_selector=(
                LabelSelector.from_text(wait["podSelector"]) if wait.get("podSelector") else None
            ),
            wait_timeout_s=float(wait.get("timeoutSeconds", 0)),
        )


@dataclass(frozen=True)
class NodeState:
    """One managed node in a reconcile's snapshot: the node, its driver pod, its pods."""

    node: Mapping[str, Any]
    driver_pod: Mapping[str, Any]
    pods: tuple[Mapping[str, Any], ...]
    # the newest revision of the DaemonSet that owns the driver pod
    revision: str

    @property
    def name(self) -> str:
        return str(self.node["metadata"]["name"])

    @property
    def labels(self) -> Mapping[str, str]:
        return self.node["metadata"].get("labels") or {}

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.node["metadata"].get("annotations") or {}

    @property
    def state(self) -> UpgradeState:
        value = self.labels.get(UPGRADE_STATE_LABEL, "")
        try:
            return UpgradeState(value)
        except ValueError:
            return UpgradeState.UNKNOWN

    @property
    def unschedulable(self) -> bool:
        return bool(self.node.get("spec", {}).get("unschedulable"))

    @property
    def unavailable(self) -> bool:
        return self.unschedulable or not is_node_ready(self.node)


def current_revision(daemonset: Mapping[str, Any]) -> str:
    """The DaemonSet's newest revision: the hash its controller gives pods of this template."""
    return _template_hash(daemonset["spec"]["template"])


def pod_in_sync(pod: Mapping[str, Any], revision: str) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(REVISION_HASH_LABEL) == revision


def driver_pod_ready(pod: Mapping[str, Any]) -> bool:
    return is_ready(pod) and not is_deleting(pod)


def driver_pod_failing(pod: Mapping[str, Any]) -> bool:
    """A container not ready after more than MAX_DRIVER_RESTARTS restarts."""
    status = pod.get("status") or {}
    entries = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    return any(
        not e.get("ready") and int(e.get("restartCount") or 0) > MAX_DRIVER_RESTARTS
        for e in entries
    )


def uses_gpu(pod: Mapping[str, Any]) -> bool:
    """Whether the pod requests nvidia.com/gpu* or nvidia.com/mig-* (what pod deletion removes)."""
    return any(
        name.startswith(("nvidia.com/gpu", "nvidia.com/mig-")) and amount > 0
        for name, amount in pod_requests(pod).items()
    )


def upgrades_available(states: list[NodeState], policy: UpgradePolicy) -> int:
    """GetUpgradesAvailable: parallel slots left, capped by maxUnavailable."""
    in_progress = sum(1 for s in states if s.state not in IDLE_STATES)
    if policy.max_parallel == 0:
        available = sum(1 for s in states if s.state is UpgradeState.REQUIRED)
    else:
        available = policy.max_parallel - in_progress
    limit = scale_int_or_percent(policy.max_unavailable, len(states), round_up=True)
    unavailable = sum(1 for s in states if s.unavailable)
    if unavailable >= limit:
        return 0
    return min(available, limit - unavailable)
