"""The GPU Operator's driver upgrade controller (k8s-operator-libs' state machine), as FACTS.md
"Operator-managed driver upgrades" describes it.

- The driver DaemonSet is OnDelete: a version change restarts nothing by itself. A node is out
  of date when its driver pod's `controller-revision-hash` differs from the newest revision
  of the DaemonSet that owns the pod (here: the hash the DaemonSet controller gives pods of
  the current template); it then goes to `upgrade-required`, as it does when annotated
  upgrade-requested.
- With NVIDIADriver resources (ClusterPolicy `driver.useNvidiaDriverCRD`) the driver pods are
  those labelled `app.kubernetes.io/component=nvidia-driver`, of one DaemonSet per resource;
  the ClusterPolicy's upgradePolicy still governs them all, in one state over every managed
  node (controllers/upgrade_controller.go), each pod judged by its own DaemonSet's revision.
- Each reconcile builds one snapshot and moves each node at most one state, in the real order
  (done/unknown, required, cordon, wait-for-jobs, pod-deletion, drain, pod-restart, failed,
  validation, uncordon).
- The skip label is read only when a node leaves `upgrade-required`; the requested annotation
  is removed there too.
- Slots: maxParallelUpgrades minus nodes in progress (0: unlimited), capped by maxUnavailable
  (a percentage of the managed nodes, rounded up) minus cordoned or NotReady nodes. A node
  already cordoned proceeds when no slot is free. Order is the API's list order.
- It reconciles when a node's state or skip label changes, when the ClusterPolicy changes, and
  every `resync_s` (the operator's 2 minutes; the lab shortens it), and when a driver
  DaemonSet's generation moves; annotations are not watched.
- Pod deletion and drain evict (PodDisruptionBudgets answer 429) and give up after their
  timeout with `upgrade-failed`; a driver container restarted more than 10 times fails the
  node too; `upgrade-failed` clears itself once the driver pod is in sync and Ready.
- autoUpgrade=false strips every state label.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import DAEMONSETS, NODES, PODS
from rollout.lab.apiserver.selectors import LabelSelector
from rollout.lab.simulation.gpuoperator import (
    DEPLOY_OPERANDS_LABEL,
    DRIVER,
    DRIVER_COMPONENT,
    DRIVER_COMPONENT_LABEL,
    OPERATOR_NAMESPACE,
    UPGRADE_DRAIN_SKIP_LABEL,
    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION,
    UPGRADE_REQUESTED_ANNOTATION,
    UPGRADE_SKIP_LABEL,
    UPGRADE_STATE_LABEL,
    VALIDATOR,
    owner_daemonset,
    uses_driver_crd,
)
from rollout.lab.simulation.pods import is_deleting, is_ready, is_terminal
from rollout.lab.simulation.upgradestate import (
    DRAIN_START_ANNOTATION,
    POD_DELETION_START_ANNOTATION,
    VALIDATION_START_ANNOTATION,
    WAIT_START_ANNOTATION,
    NodeState,
    UpgradePolicy,
    UpgradeState,
    UpgradeTimings,
    current_revision,
    driver_pod_failing,
    driver_pod_ready,
    pod_in_sync,
    upgrades_available,
    uses_gpu,
)

log = logging.getLogger("rollout.lab.simulation")


@dataclass(eq=False)
class UpgradeController:
    """Walks the nodes the driver DaemonSet serves through a driver upgrade."""

    registry: Registry
    timings: UpgradeTimings
    clock: Callable[[], float] = time.time
    _trigger: tuple[Any, ...] | None = field(default=None, init=False)
    _last_s: float | None = field(default=None, init=False)

    def reconcile(self, cluster_policy: Mapping[str, Any] | None) -> None:
        """Reconcile when a watched change happened or the resync period passed."""
        if cluster_policy is None:
            return
        driver = (cluster_policy.get("spec") or {}).get("driver") or {}
        policy = UpgradePolicy.from_spec(driver.get("upgradePolicy") or {})
        daemonsets = driver_daemonsets(self.registry, cluster_policy)
        if not daemonsets or driver.get("enabled") is False:
            return
        if not policy.auto_upgrade:
            self._strip_states()
            return
        nodes = self.registry.list_objects(NODES)
        trigger = (
            cluster_policy.get("metadata", {}).get("generation"),
            repr(driver),
            tuple(
                (
                    n["metadata"]["name"],
                    (n["metadata"].get("labels") or {}).get(UPGRADE_STATE_LABEL),
                    (n["metadata"].get("labels") or {}).get(UPGRADE_SKIP_LABEL),
                )
                for n in nodes
            ),
            tuple((d["metadata"]["name"], d["metadata"].get("generation")) for d in daemonsets),
        )
        now = self.clock()
        if self._last_s is not None:
            if now - self._last_s < self.timings.dwell_s:
                return
            if trigger == self._trigger and now - self._last_s < self.timings.resync_s:
                return
        self._trigger, self._last_s = trigger, now
        self.apply_state(self.build_state(daemonsets, nodes), policy)

    def build_state(
        self, daemonsets: list[dict[str, Any]], nodes: list[dict[str, Any]]
    ) -> list[NodeState]:
        """The managed nodes: those where a driver DaemonSet has a pod, in list order, each
        with the newest revision of its pod's DaemonSet."""
        pods = self.registry.list_objects(PODS)
        by_node: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            by_node.setdefault(str(pod["spec"].get("nodeName") or ""), []).append(pod)
        revisions = {d["metadata"]["uid"]: current_revision(d) for d in daemonsets}
        states = []
        for node in nodes:
            name = node["metadata"]["name"]
            if (node["metadata"].get("labels") or {}).get(DEPLOY_OPERANDS_LABEL) == "false":
                continue
            on_node = by_node.get(name, [])
            drivers = [p for p in on_node if _owner_uid(p) in revisions]
            if drivers:
                live = [p for p in drivers if not is_deleting(p)] or drivers
                revision = revisions[_owner_uid(live[0])]
                states.append(NodeState(node, live[0], tuple(on_node), revision))
        return states

    def apply_state(self, states: list[NodeState], policy: UpgradePolicy) -> None:
        """One pass over the snapshot: each node moves at most one state."""
        by_state: dict[UpgradeState, list[NodeState]] = {}
        for state in states:
            by_state.setdefault(state.state, []).append(state)
        slots = upgrades_available(states, policy)
        now = self.clock()
        for s in by_state.get(UpgradeState.UNKNOWN, []) + by_state.get(UpgradeState.DONE, []):
            requested = s.annotations.get(UPGRADE_REQUESTED_ANNOTATION) == "true"
            if not pod_in_sync(s.driver_pod, s.revision) or requested:
                self._set_state(s.name, UpgradeState.REQUIRED)
            elif s.state is UpgradeState.UNKNOWN:
                self._set_state(s.name, UpgradeState.DONE)
        for s in by_state.get(UpgradeState.REQUIRED, []):
            if s.annotations.get(UPGRADE_REQUESTED_ANNOTATION) == "true":
                self._annotate(s.name, {UPGRADE_REQUESTED_ANNOTATION: None})
            if s.labels.get(UPGRADE_SKIP_LABEL) == "true":
                continue
            if slots <= 0 and not s.unschedulable:
                continue  # no slot; a node already cordoned proceeds anyway
            if s.unschedulable:
                self._annotate(s.name, {UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: "true"})
            self._set_state(s.name, UpgradeState.CORDON)
            slots -= 1
        for s in by_state.get(UpgradeState.CORDON, []):
            self._set_unschedulable(s.name, True)
            self._set_state(s.name, UpgradeState.WAIT_FOR_JOBS)
        for s in by_state.get(UpgradeState.WAIT_FOR_JOBS, []):
            self._wait_for_jobs(s, policy, now)
        for s in by_state.get(UpgradeState.POD_DELETION, []):
            self._delete_gpu_pods(s, policy, now)
        for s in by_state.get(UpgradeState.DRAIN, []):
            self._drain(s, policy, now)
        for s in by_state.get(UpgradeState.POD_RESTART, []):
            self._restart_driver(s)
        for s in by_state.get(UpgradeState.FAILED, []):
            if pod_in_sync(s.driver_pod, s.revision) and driver_pod_ready(s.driver_pod):
                self._finish(s)
        for s in by_state.get(UpgradeState.VALIDATION, []):
            self._validate(s, now)
        for s in by_state.get(UpgradeState.UNCORDON, []):
            self._set_unschedulable(s.name, False)
            self._set_state(s.name, UpgradeState.DONE)

    # ----------------------------------------------------------------- states

    def _wait_for_jobs(self, s: NodeState, policy: UpgradePolicy, now: float) -> None:
        selector = policy.wait_selector
        busy = selector is not None and any(
            selector.matches(p["metadata"].get("labels")) and not is_terminal(p) for p in s.pods
        )
        if busy:
            started = self._started(s, WAIT_START_ANNOTATION, now)
            if policy.wait_timeout_s <= 0 or now - started < policy.wait_timeout_s:
                return
        self._annotate(s.name, {WAIT_START_ANNOTATION: None})
        self._set_state(s.name, UpgradeState.POD_DELETION)

    def _delete_gpu_pods(self, s: NodeState, policy: UpgradePolicy, now: float) -> None:
        doomed = [p for p in s.pods if uses_gpu(p) and owner_daemonset(p) is None]
        if self._evict_all(
            s,
            doomed,
            policy.force,
            policy.delete_empty_dir,
            now,
            policy.pod_deletion_timeout_s,
            POD_DELETION_START_ANNOTATION,
        ):
            nxt = UpgradeState.DRAIN if policy.drain_enabled else UpgradeState.POD_RESTART
            self._set_state(s.name, nxt)

    def _drain(self, s: NodeState, policy: UpgradePolicy, now: float) -> None:
        if not policy.drain_enabled:
            self._set_state(s.name, UpgradeState.POD_RESTART)
            return
        doomed = [
            p
            for p in s.pods
            if owner_daemonset(p) is None  # drain ignores DaemonSet pods
            and (p["metadata"].get("labels") or {}).get(UPGRADE_DRAIN_SKIP_LABEL) != "true"
            and policy.drain_selector.matches(p["metadata"].get("labels"))
        ]
        if self._evict_all(
            s,
            doomed,
            policy.drain_force,
            policy.drain_delete_empty_dir,
            now,
            policy.drain_timeout_s,
            DRAIN_START_ANNOTATION,
        ):
            self._set_state(s.name, UpgradeState.POD_RESTART)

    def _evict_all(
        self,
        s: NodeState,
        pods: list[Mapping[str, Any]],
        force: bool,
        delete_empty_dir: bool,
        now: float,
        timeout_s: float,
        annotation: str,
    ) -> bool:
        """Evict each pod (a budget may refuse: 429); True once they are all gone.

        Like kubectl drain: a pod no controller manages needs `force`, one with an emptyDir
        needs `deleteEmptyDir`; either refusal, or the timeout, fails the node.
        """
        pending = [p for p in pods if not is_terminal(p)]
        refused = [
            p["metadata"]["name"]
            for p in pending
            if (not force and not p["metadata"].get("ownerReferences"))
            or (not delete_empty_dir and _uses_empty_dir(p))
        ]
        if refused:
            log.info("driver upgrade: %s: cannot delete %s", s.name, ", ".join(refused))
            self._fail(s.name)
            return False
        if not pending:
            self._annotate(s.name, {annotation: None})
            return True
        started = self._started(s, annotation, now)
        for pod in pending:
            if is_deleting(pod):
                continue
            try:
                self.registry.evict(
                    pod["metadata"]["namespace"], pod["metadata"]["name"], {"metadata": {}}
                )
            except ApiError as error:
                if error.code == 404:
                    continue
                if error.code != 429:
                    raise
                log.info("driver upgrade: %s: eviction refused: %s", s.name, error)
        if now - started >= timeout_s:
            self._fail(s.name)
        return False

    def _restart_driver(self, s: NodeState) -> None:
        pod = s.driver_pod
        if not pod_in_sync(pod, s.revision):
            if not is_deleting(pod):
                self._delete_pod(pod)
            return
        if driver_pod_ready(pod):
            self._annotate(s.name, {VALIDATION_START_ANNOTATION: None})
            self._set_state(s.name, UpgradeState.VALIDATION)
        elif driver_pod_failing(pod):
            self._fail(s.name)

    def _validate(self, s: NodeState, now: float) -> None:
        validators = [p for p in s.pods if owner_daemonset(p) == VALIDATOR.name]
        if any(is_ready(p) and not is_deleting(p) for p in validators):
            self._annotate(s.name, {VALIDATION_START_ANNOTATION: None})
            self._finish(s)
            return
        started = self._started(s, VALIDATION_START_ANNOTATION, now)
        if now - started >= self.timings.validation_timeout_s:
            self._fail(s.name)

    def _finish(self, s: NodeState) -> None:
        """Uncordon next, or straight to done where the node was cordoned before the upgrade."""
        if s.annotations.get(UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION) == "true":
            self._annotate(s.name, {UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION: None})
            self._set_state(s.name, UpgradeState.DONE)
        else:
            self._set_state(s.name, UpgradeState.UNCORDON)

    # ----------------------------------------------------------------- writes

    def _started(self, s: NodeState, annotation: str, now: float) -> float:
        """When the node started waiting, recorded on it the first time."""
        try:
            return float(s.annotations[annotation])
        except (KeyError, ValueError):
            self._annotate(s.name, {annotation: str(int(now))})
            return now

    def _strip_states(self) -> None:
        for node in self.registry.list_objects(NODES):
            if UPGRADE_STATE_LABEL in (node["metadata"].get("labels") or {}):
                self._mutate(node["metadata"]["name"], _drop_state_label)

    def _set_unschedulable(self, name: str, value: bool) -> None:
        def change(n: dict[str, Any]) -> None:
            if value:
                n["spec"]["unschedulable"] = True
            else:
                n["spec"].pop("unschedulable", None)

        self._mutate(name, change)

    def _annotate(self, name: str, values: Mapping[str, str | None]) -> None:
        def change(n: dict[str, Any]) -> None:
            annotations = n["metadata"].setdefault("annotations", {})
            for key, value in values.items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value

        self._mutate(name, change)

    def _delete_pod(self, pod: Mapping[str, Any]) -> None:
        try:
            self.registry.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])
        except ApiError as error:
            if error.code != 404:
                raise

    def _fail(self, name: str) -> None:
        self._set_state(name, UpgradeState.FAILED)

    def _set_state(self, name: str, state: UpgradeState) -> None:
        def label(n: dict[str, Any]) -> None:
            n["metadata"].setdefault("labels", {})[UPGRADE_STATE_LABEL] = state.value

        self._mutate(name, label)
        log.info("driver upgrade: %s -> %s", name, state.value)

    def _mutate(self, name: str, change: Callable[[dict[str, Any]], None]) -> None:
        try:
            self.registry.mutate(NODES, None, name, change)
        except ApiError as error:
            # raced with a client's write; the next reconcile sees the new state
            log.debug("driver upgrade of %s raced: %s", name, error)


def driver_daemonsets(
    registry: Registry, cluster_policy: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The driver DaemonSets the upgrade controller manages: the ClusterPolicy's, or with
    NVIDIADriver resources every DaemonSet labelled as the nvidia-driver component."""
    if uses_driver_crd(cluster_policy):
        selector = LabelSelector.from_text(f"{DRIVER_COMPONENT_LABEL}={DRIVER_COMPONENT}")
        return registry.list_objects(DAEMONSETS, OPERATOR_NAMESPACE, selector)
    found = registry.find(DAEMONSETS, OPERATOR_NAMESPACE, DRIVER.name)
    return [] if found is None else [found]


def _owner_uid(pod: Mapping[str, Any]) -> str | None:
    """The uid of the controller that owns the pod."""
    for reference in pod["metadata"].get("ownerReferences") or []:
        if reference.get("controller"):
            return str(reference.get("uid"))
    return None


def _drop_state_label(node: dict[str, Any]) -> None:
    (node["metadata"].get("labels") or {}).pop(UPGRADE_STATE_LABEL, None)


def _uses_empty_dir(pod: Mapping[str, Any]) -> bool:
    return any("emptyDir" in v for v in (pod.get("spec") or {}).get("volumes") or [])
