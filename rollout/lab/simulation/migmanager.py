"""The GPU Operator's MIG manager on each lab node (FACTS.md "MIG manager"; NVIDIA/mig-parted
deployments/gpu-operator/reconfigure-mig.sh), a simulated operand like the driver containers.

When a node's `nvidia.com/mig.config` label names a layout other than the one it last handled,
the manager sets `nvidia.com/mig.config.state=pending`, checks the name against the mig-parted
ConfigMap (unknown, or a layout the GPUs cannot hold: `failed`), and when the GPUs already are
that layout sets `success` at once. Otherwise it sets the node's device-plugin, GFD,
dcgm-exporter and validator deploy labels that are `true` to `paused-for-mig-change`, waits
for the device plugin's and validator's pods to leave the node, applies the layout (the
node's layout file, miglayouts.py), puts the labels back to `true` and sets `success`.

- A node with the reboot knob (`lab break mig-mode-needs-reboot`: REBOOT_KNOB_FILE on the
  node) cannot switch MIG mode without a reboot: the manager sets `rebooting`, writes the new
  mode to the node's layout file (no devices: a reboot leaves none), reboots the node for real
  (`systemctl reboot` in it), and makes the devices once the node runs a new boot with
  containerd up. A manager started again meanwhile finds the mode switched: no second reboot.
- A node annotated FAILED_ANNOTATION (`lab break mig-manager-failed`) fails every layout that
  changes its GPUs, leaving them as they were: the labels are restored and the state is
  `failed`; a layout the GPUs already have still gives `success`.

The manager works only while its pod (the `nvidia-mig-manager` DaemonSet's, on the nodes
labelled nvidia.com/gpu.deploy.mig-manager=true) is Ready on a Ready node: a pod deleted, or
a node NotReady, and nothing is taken up or applied until it is back. Each step is written to
that pod's log in the real manager's words (migmanagerlog.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CONFIGMAPS, NODES, PODS
from rollout.lab.description import NodeDescription
from rollout.lab.simulation import migmanagerlog
from rollout.lab.simulation.events import EventRecorder
from rollout.lab.simulation.gpuoperator import (
    DEPLOY_LABEL_PREFIX,
    DEVICE_PLUGIN,
    MIG_MANAGER,
    OPERATOR_NAMESPACE,
    VALIDATOR,
    owner_daemonset,
)
from rollout.lab.simulation.miglayouts import (
    CONFIG_LABEL,
    MIG_CONFIG_KEY,
    REBOOT_KNOB_FILE,
    STATE_LABEL,
    GpuLayout,
    LayoutError,
    apply_layout,
    configmap_name,
    mode_changes,
    parse_config,
    read_layout,
    same_gpus,
    write_layout,
)
from rollout.lab.simulation.nodelifecycle import is_node_ready
from rollout.lab.simulation.pods import is_deleting, is_ready, node_of
from rollout.lab.simulation.probe import NodeCommandOutcome, NodeRuntimeProbe

log = logging.getLogger("rollout.lab.simulation")

PAUSED = "paused-for-mig-change"
PAUSED_OPERANDS = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "operator-validator")
# The operand pods that must be gone before the GPUs change (the lab runs no GFD or DCGM pods).
PAUSED_PODS = (DEVICE_PLUGIN.name, VALIDATOR.name)
# Lab knob: the node's MIG manager fails any layout that changes its GPUs (value: why).
FAILED_ANNOTATION = "lab.rollout/mig-manager-failed"


class Phase(Enum):
    PAUSING = "pausing"
    APPLYING = "applying"
    REBOOTING = "rebooting"


@dataclass
class _Job:
    """One reconfiguration in progress on a node (mutable, the manager's own)."""

    config: str
    wanted: dict[int, GpuLayout]
    phase: Phase
    since_s: float
    paused: list[str] = field(default_factory=list)
    boot: str | None = None
    reboot: Future[NodeCommandOutcome | None] | None = None


@dataclass(eq=False)
class MigManager:
    """Plays every node's MIG manager: one reconfiguration at a time per node."""

    registry: Registry
    nodes: Sequence[NodeDescription]
    probe: NodeRuntimeProbe
    step_s: float = 1.0
    clock: Callable[[], float] = time.time
    _handled: dict[str, str] = field(default_factory=dict, init=False)
    _jobs: dict[str, _Job] = field(default_factory=dict, init=False)
    _pool: ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self._recorder = EventRecorder(self.registry, "nvidia-mig-manager", clock=self.clock)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mig-reboot")

    def sync(self, cluster_policy: Mapping[str, Any] | None) -> None:
        pods = self._manager_pods()
        for description in self.nodes:
            if description.root is None or not description.gpus:
                continue  # no node files to hold a layout: MIG stays disabled
            node = self.registry.find(NODES, None, description.name)
            pod = pods.get(description.name)
            if node is None or pod is None or not is_node_ready(node):
                continue  # the manager runs in its pod: none running, nothing applies
            try:
                self._sync_node(description, node, pod, cluster_policy)
            except ApiError as error:
                log.debug("mig manager %s raced: %s", description.name, error)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _sync_node(
        self,
        description: NodeDescription,
        node: dict[str, Any],
        pod: str,
        cluster_policy: Mapping[str, Any] | None,
    ) -> None:
        name = description.name
        job = self._jobs.get(name)
        if job is not None:
            self._advance(description, node, pod, job)
            return
        wanted_name = (node["metadata"].get("labels") or {}).get(CONFIG_LABEL)
        if not wanted_name or self._handled.get(name) == wanted_name:
            return
        self._handled[name] = wanted_name
        self._start(description, node, pod, wanted_name, cluster_policy)

    def _start(
        self,
        description: NodeDescription,
        node: dict[str, Any],
        pod: str,
        config: str,
        cluster_policy: Mapping[str, Any] | None,
    ) -> None:
        name = description.name
        assert description.root is not None
        current = read_layout(description.root)
        indices = [g.index for g in description.gpus]
        self._say(pod, migmanagerlog.to_start_lines(config))
        try:
            text = self._config_text(cluster_policy)
            wanted = parse_config(text, config, description.gpus, current)
        except LayoutError as error:
            self._say(pod, migmanagerlog.to_invalid_lines(config, str(error)))
            self._set_state(name, "failed")
            self._recorder.record(node, "Warning", "MigConfigInvalid", str(error))
            log.info("mig manager %s: %s", name, error)
            return
        applied = same_gpus(current, wanted, indices)
        self._say(pod, migmanagerlog.to_valid_lines(applied))
        if applied:
            if current.config != config:
                write_layout(description.root, apply_layout(current, config, wanted, indices))
            self._say(pod, migmanagerlog.to_success_lines(config, restarted_clients=False))
            self._set_state(name, "success")
            return
        self._say(pod, migmanagerlog.to_pausing_lines())
        self._set_state(name, "pending")
        job = _Job(config, wanted, Phase.PAUSING, self.clock())
        job.paused = self._pause(node)
        self._jobs[name] = job
        log.info("mig manager %s: applying %s", name, config)

    def _advance(
        self, description: NodeDescription, node: dict[str, Any], pod: str, job: _Job
    ) -> None:
        name = description.name
        assert description.root is not None
        now = self.clock()
        if now - job.since_s < self.step_s:
            return
        if job.phase is Phase.PAUSING:
            if not self._operands_gone(name):
                return
            job.phase, job.since_s = Phase.APPLYING, now
            self._say(pod, migmanagerlog.to_applying_lines())
            return
        if job.phase is Phase.APPLYING:
            current = read_layout(description.root)
            annotations = node["metadata"].get("annotations") or {}
            failure = annotations.get(FAILED_ANNOTATION)
            if failure:
                self._recorder.record(node, "Warning", "MigConfigFailed", failure)
                self._say(pod, migmanagerlog.to_failed_lines(job.config, failure))
                self._finish(name, job, "failed")
                return
            if mode_changes(current, job.wanted) and (description.root / REBOOT_KNOB_FILE).exists():
                self._say(pod, migmanagerlog.to_reboot_lines())
                self._reboot(description, job)
                return
        elif job.phase is Phase.REBOOTING and not self._rebooted(name, job):
            return
        current = read_layout(description.root)
        indices = [g.index for g in description.gpus]
        write_layout(description.root, apply_layout(current, job.config, job.wanted, indices))
        lines = migmanagerlog.to_success_lines(job.config, restarted_clients=bool(job.paused))
        self._say(pod, lines)
        self._finish(name, job, "success")

    def _manager_pods(self) -> dict[str, str]:
        """Node -> the name of its MIG manager pod, where that pod is Ready."""
        return {
            node_of(p): str(p["metadata"]["name"])
            for p in self.registry.list_objects(PODS, OPERATOR_NAMESPACE)
            if owner_daemonset(p) == MIG_MANAGER.name and is_ready(p) and not is_deleting(p)
        }

    def _say(self, pod: str, lines: Sequence[str]) -> None:
        """Write the lines to the manager pod's log (its container's output)."""
        text = "".join(line + "\n" for line in lines)
        self.registry.write_log(OPERATOR_NAMESPACE, pod, MIG_MANAGER.container, text)

    def _reboot(self, description: NodeDescription, job: _Job) -> None:
        """Switch the GPUs' MIG mode (the devices come after the boot) and reboot the node."""
        name = description.name
        assert description.root is not None
        current = read_layout(description.root)
        modes = {i: GpuLayout(layout.enabled) for i, layout in job.wanted.items()}
        indices = [g.index for g in description.gpus]
        write_layout(description.root, apply_layout(current, current.config, modes, indices))
        job.boot = self.probe.state(name).boot
        self._set_state(name, "rebooting")
        job.phase, job.since_s = Phase.REBOOTING, self.clock()
        log.info("mig manager %s: MIG mode change needs a reboot: rebooting", name)
        job.reboot = self._pool.submit(self.probe.run_in_node, name, ["systemctl", "reboot"], {})

    def _rebooted(self, name: str, job: _Job) -> bool:
        state = self.probe.state(name)
        return state.alive and state.containerd_active and state.boot not in (None, job.boot)

    def _finish(self, name: str, job: _Job, outcome: str) -> None:
        if job.paused:
            self._patch_labels(name, {key: "true" for key in job.paused})
        self._set_state(name, outcome)
        del self._jobs[name]
        log.info("mig manager %s: %s %s", name, job.config, outcome)

    def _pause(self, node: dict[str, Any]) -> list[str]:
        """Set the operands' deploy labels that are `true` to paused; the keys it paused
        (with those a MIG change cut short, by a restart of the control plane, left paused)."""
        labels = node["metadata"].get("labels") or {}
        keys = [
            DEPLOY_LABEL_PREFIX + operand
            for operand in PAUSED_OPERANDS
            if labels.get(DEPLOY_LABEL_PREFIX + operand) in ("true", PAUSED)
        ]
        if keys:
            self._patch_labels(node["metadata"]["name"], {key: PAUSED for key in keys})
        return keys

    def _operands_gone(self, name: str) -> bool:
        return not any(
            p["spec"].get("nodeName") == name and owner_daemonset(p) in PAUSED_PODS
            for p in self.registry.list_objects(PODS, OPERATOR_NAMESPACE)
        )

    def _config_text(self, cluster_policy: Mapping[str, Any] | None) -> str:
        name = configmap_name(cluster_policy)
        configmap = self.registry.find(CONFIGMAPS, OPERATOR_NAMESPACE, name)
        if configmap is None:
            raise LayoutError(f"ConfigMap {OPERATOR_NAMESPACE}/{name} not found")
        return str((configmap.get("data") or {}).get(MIG_CONFIG_KEY) or "")

    def _set_state(self, name: str, state: str) -> None:
        self._patch_labels(name, {STATE_LABEL: state})

    def _patch_labels(self, name: str, labels: Mapping[str, str]) -> None:
        def change(node: dict[str, Any]) -> None:
            node["metadata"].setdefault("labels", {}).update(labels)

        self.registry.mutate(NODES, None, name, change)
