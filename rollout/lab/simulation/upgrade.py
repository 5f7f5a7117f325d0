"""The GPU Operator's driver upgrade controller (k8s-operator-libs state machine), simplified.

The driver DaemonSet follows ClusterPolicy spec.driver.version (clusterpolicy.py); its OnDelete
strategy leaves old driver pods until this controller restarts them node by node, walking the
nvidia.com/gpu-driver-upgrade-state label through the real states.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollout.lab.apiserver.disruption import scale_int_or_percent
from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import NODES, PODS
from rollout.lab.apiserver.selectors import LabelSelector
from rollout.lab.simulation.gpuoperator import (
    DRIVER,
    FAIL_UPGRADE_ANNOTATION,
    UPGRADE_DRAIN_SKIP_LABEL,
    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION,
    UPGRADE_REQUESTED_ANNOTATION,
    UPGRADE_SKIP_LABEL,
    UPGRADE_STATE_LABEL,
    VALIDATOR,
    driver_version_of,
    owner_daemonset,
)
from rollout.lab.simulation.nodelifecycle import is_node_ready
from rollout.lab.simulation.pods import gpu_request, is_deleting, is_ready, is_terminal

log = logging.getLogger("rollout.lab.simulation")


class UpgradeState(StrEnum):
    """Values of nvidia.com/gpu-driver-upgrade-state this controller sets."""

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


IN_PROGRESS = frozenset(
    {
        UpgradeState.CORDON,
        UpgradeState.WAIT_FOR_JOBS,
        UpgradeState.POD_DELETION,
        UpgradeState.DRAIN,
        UpgradeState.POD_RESTART,
        UpgradeState.VALIDATION,
        UpgradeState.UNCORDON,
    }
)


@dataclass(frozen=True)
class UpgradeTimings:
    """`dwell_s`: least time a node stays in a state; `validation_timeout_s`: then failed."""

    dwell_s: float = 1.0
    validation_timeout_s: float = 600.0


@dataclass(frozen=True)
class UpgradePolicy:
    """ClusterPolicy spec.driver.upgradePolicy, as far as the lab honours it."""

    auto_upgrade: bool
    max_parallel: int
    max_unavailable: int | str
    drain_enabled: bool
    drain_selector: LabelSelector
    wait_selector: LabelSelector | None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> UpgradePolicy:
        drain = spec.get("drain") or {}
        wait = (spec.get("waitForCompletion") or {}).get("podSelector")
        return cls(
            auto_upgrade=bool(spec.get("autoUpgrade", False)),
            max_parallel=int(spec.get("maxParallelUpgrades", 1)),
            max_unavailable=spec.get("maxUnavailable", "25%"),
            drain_enabled=bool(drain.get("enable", False)),
            drain_selector=LabelSelector.from_text(drain.get("podSelector")),
            wait_selector=LabelSelector.from_text(wait) if wait else None,
        )


@dataclass(eq=False)
class UpgradeController:
    """Walks GPU nodes through a driver upgrade when the ClusterPolicy's version moves."""

    registry: Registry
    timings: UpgradeTimings
    clock: Callable[[], float] = time.time
    _entered: dict[str, float] = field(default_factory=dict, init=False)
    _restarted: set[str] = field(default_factory=set, init=False)

    def reconcile(self, cluster_policy: Mapping[str, Any] | None) -> None:
        if cluster_policy is None:
            return
        driver = (cluster_policy.get("spec") or {}).get("driver") or {}
        target = str(driver.get("version") or "")
        policy = UpgradePolicy.from_spec(driver.get("upgradePolicy") or {})
        if not policy.auto_upgrade or not target:
            return
        nodes = [
            n
            for n in self.registry.list_objects(NODES)
            if (n["metadata"].get("labels") or {}).get(DRIVER.deploy_label) == "true"
        ]
        pods = self.registry.list_objects(PODS)
        for node in sorted(nodes, key=lambda n: str(n["metadata"]["name"])):
            try:
                self._advance(node, nodes, pods, policy, target)
            except ApiError as error:
                log.debug("upgrade of %s raced: %s", node["metadata"]["name"], error)

    # ------------------------------------------------------------------ nodes

    def _advance(
        self,
        node: dict[str, Any],
        nodes: list[dict[str, Any]],
        pods: list[dict[str, Any]],
        policy: UpgradePolicy,
        target: str,
    ) -> None:
        name = node["metadata"]["name"]
        labels = node["metadata"].get("labels") or {}
        annotations = node["metadata"].get("annotations") or {}
        if labels.get(UPGRADE_SKIP_LABEL) == "true":
            return
        state = labels.get(UPGRADE_STATE_LABEL, "")
        now = self.clock()
        if now - self._entered.get(name, 0.0) < self.timings.dwell_s:
            return
        on_node = [p for p in pods if p["spec"].get("nodeName") == name]
        drivers = [p for p in on_node if owner_daemonset(p) == DRIVER.name and not is_deleting(p)]
        requested = annotations.get(UPGRADE_REQUESTED_ANNOTATION) == "true"
        outdated = any(driver_version_of(p) != target for p in drivers)
        if state in ("", UpgradeState.DONE):
            if outdated or requested:
                self._set_state(name, UpgradeState.REQUIRED)
        elif state == UpgradeState.REQUIRED:
            if self._slot_free(node, nodes, policy):
                self._set_state(name, UpgradeState.CORDON)
        elif state == UpgradeState.CORDON:
            self._cordon(node)
            self._set_state(name, UpgradeState.WAIT_FOR_JOBS)
        elif state == UpgradeState.WAIT_FOR_JOBS:
            selector = policy.wait_selector
            busy = selector is not None and any(
                selector.matches(p["metadata"].get("labels")) and not is_terminal(p)
                for p in on_node
            )
            if not busy:
                self._set_state(name, UpgradeState.POD_DELETION)
        elif state == UpgradeState.POD_DELETION:
            for pod in on_node:
                if gpu_request(pod) and owner_daemonset(pod) is None and not _drain_skipped(pod):
                    self._delete_pod(pod)
            self._set_state(name, UpgradeState.DRAIN)
        elif state == UpgradeState.DRAIN:
            if policy.drain_enabled:
                for pod in on_node:
                    if (
                        owner_daemonset(pod) is None
                        and not _drain_skipped(pod)
                        and policy.drain_selector.matches(pod["metadata"].get("labels"))
                    ):
                        self._delete_pod(pod)
            self._set_state(name, UpgradeState.POD_RESTART)
        elif state == UpgradeState.POD_RESTART:
            self._restart_driver(name, drivers, target)
        elif state == UpgradeState.VALIDATION:
            self._validate(node, on_node, now)
        elif state == UpgradeState.UNCORDON:
            self._uncordon(node)
            self._set_state(name, UpgradeState.DONE)

    def _slot_free(
        self, node: dict[str, Any], snapshot: list[dict[str, Any]], policy: UpgradePolicy
    ) -> bool:
        # Re-read: an earlier node of this same pass may have just taken the slot.
        names = {n["metadata"]["name"] for n in snapshot}
        nodes = [n for n in self.registry.list_objects(NODES) if n["metadata"]["name"] in names]
        states = [(n["metadata"].get("labels") or {}).get(UPGRADE_STATE_LABEL) for n in nodes]
        busy = sum(1 for s in states if s in IN_PROGRESS)
        if policy.max_parallel > 0 and busy >= policy.max_parallel:
            return False
        unavailable = sum(
            1 for n in nodes if n["spec"].get("unschedulable") or not is_node_ready(n)
        )
        limit = scale_int_or_percent(policy.max_unavailable, len(nodes), round_up=True)
        already = bool(node["spec"].get("unschedulable")) or not is_node_ready(node)
        return already or unavailable < max(1, limit)

    def _restart_driver(self, name: str, drivers: list[dict[str, Any]], target: str) -> None:
        outdated = [p for p in drivers if driver_version_of(p) != target]
        if outdated and name not in self._restarted:
            for pod in outdated:
                self._delete_pod(pod)
            self._restarted.add(name)
            return
        current = [p for p in drivers if driver_version_of(p) == target]
        if any(is_ready(p) for p in current):
            self._restarted.discard(name)
            self._set_state(name, UpgradeState.VALIDATION)

    def _validate(self, node: dict[str, Any], on_node: list[dict[str, Any]], now: float) -> None:
        name = node["metadata"]["name"]
        annotations = node["metadata"].get("annotations") or {}
        if annotations.get(FAIL_UPGRADE_ANNOTATION) == "true":
            self._set_state(name, UpgradeState.FAILED)
            return
        validators = [p for p in on_node if owner_daemonset(p) == VALIDATOR.name]
        if any(is_ready(p) and not is_deleting(p) for p in validators):
            self._set_state(name, UpgradeState.UNCORDON)
        elif now - self._entered.get(name, now) >= self.timings.validation_timeout_s:
            self._set_state(name, UpgradeState.FAILED)

    def _cordon(self, node: dict[str, Any]) -> None:
        was_cordoned = bool(node["spec"].get("unschedulable"))

        def cordon(n: dict[str, Any]) -> None:
            if was_cordoned:
                n["metadata"].setdefault("annotations", {})[
                    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION
                ] = "true"
            n["spec"]["unschedulable"] = True

        self.registry.mutate(NODES, None, node["metadata"]["name"], cordon)

    def _uncordon(self, node: dict[str, Any]) -> None:
        def uncordon(n: dict[str, Any]) -> None:
            annotations = n["metadata"].setdefault("annotations", {})
            # A node cordoned before the upgrade stays cordoned after it.
            if annotations.pop(UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION, None) != "true":
                n["spec"].pop("unschedulable", None)
            annotations.pop(UPGRADE_REQUESTED_ANNOTATION, None)

        self.registry.mutate(NODES, None, node["metadata"]["name"], uncordon)

    def _delete_pod(self, pod: dict[str, Any]) -> None:
        try:
            self.registry.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError as error:
            if error.code != 404:
                raise

    def _set_state(self, name: str, state: UpgradeState) -> None:
        def label(n: dict[str, Any]) -> None:
            n["metadata"].setdefault("labels", {})[UPGRADE_STATE_LABEL] = state.value

        self.registry.mutate(NODES, None, name, label)
        self._entered[name] = self.clock()
        log.info("driver upgrade: %s -> %s", name, state.value)


def _drain_skipped(pod: Mapping[str, Any]) -> bool:
    return (pod["metadata"].get("labels") or {}).get(UPGRADE_DRAIN_SKIP_LABEL) == "true"
