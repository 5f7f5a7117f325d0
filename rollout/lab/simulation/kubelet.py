"""One node's kubelet: pod lifecycle, the device manager and the device plugin, node status.

What it models, from FACTS.md:
- A container starts only through the node's running containerd: none while containerd is
  down, and a pod whose runtime class names a handler the running containerd lacks fails
  at that moment (FailedCreatePodSandBox; CreateContainerError for a restart in its
  sandbox). Running containers survive a containerd restart (Debian's KillMode=process), so
  a lost `nvidia` handler shows only when the device plugin's pod next starts: a pod the
  operator rolls, a crash's restart, the node's reboot.
- A smoke pod (its container runs nvidia-smi) that names a runtime class runs for real
  through the node's containerd CRI (cripods.py): sandbox with the class's handler, image
  pulled through the node's registry config, container started by runc; its log is
  containerd's log file and containerd's errors are its waiting reasons and events.
- The toolkit pod's container is the node's toolkit unit (toolkitunit.py): its start writes
  99-nvidia.toml and restarts containerd, its end deletes the drop-in. Operand pods of the
  nvidia runtime class wait for the toolkit to have settled, as they wait for its validation.
- The device plugin registers nvidia.com/gpu a moment after its pod runs, while the driver
  is up; on disconnect allocatable drops to 0 at once, capacity stays, and the resource
  leaves the node after the grace period. The plugin takes up a sharing profile only when
  its pod (re)starts or the node's config label changes, never on a ConfigMap edit alone.
- Ready follows the node (its nspawn alive) and containerd (active); a reboot restarts
  every operand pod of the node. A crash-looping container restarts after a back-off that
  doubles up to its cap; a deleted pod goes once its containers have stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rollout.errors import RolloutError
from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.registry import DeleteOptions, Registry
from rollout.lab.apiserver.resources import CONFIGMAPS, NODES, PODS
from rollout.lab.description import GpuDescription, NodeDescription
from rollout.lab.simulation.cripods import CriPods
from rollout.lab.simulation.driverpods import driver_validates, working_driver
from rollout.lab.simulation.events import EventRecorder
from rollout.lab.simulation.gpuoperator import (
    DEVICE_PLUGIN,
    DEVICE_PLUGIN_CRASH_ANNOTATION,
    DRIVER,
    NOT_READY_ANNOTATION,
    OPERATOR_NAMESPACE,
    TOOLKIT,
    UNHEALTHY_GPUS_ANNOTATION,
    VALIDATOR,
    VALIDATOR_STUCK_ANNOTATION,
    driver_version_of,
    is_driver_pod,
    owner_daemonset,
)
from rollout.lab.simulation.kernellog import read_critical_xids
from rollout.lab.simulation.miglayouts import (
    DISABLED,
    MIG_RESOURCE_PREFIX,
    NodeLayout,
    gfd_mig_labels,
    is_plugin_resource,
    mig_strategy,
    plugin_devices,
    read_layout,
    stale_gfd_labels,
)
from rollout.lab.simulation.operandholders import holder_stopped, sync_operand_holders
from rollout.lab.simulation.pods import (
    GPU_RESOURCE,
    device_requests,
    gpu_request,
    is_deleting,
    is_ready,
    is_terminal,
    runs_nvidia_smi,
    write_pod,
)
from rollout.lab.simulation.podstatus import (
    set_crash_loop,
    set_create_error,
    set_failed,
    set_running,
    set_terminated,
    set_waiting,
    waiting_reason,
)
from rollout.lab.simulation.probe import NodeCommandOutcome, NodeRuntimeProbe, RuntimeState
from rollout.lab.simulation.profiles import (
    CONFIG_LABEL,
    NO_SHARING,
    ProfileError,
    SharingProfile,
    config_name,
    select_profile,
)
from rollout.lab.simulation.timing import SimulationTimings
from rollout.lab.simulation.toolkitunit import ToolkitUnit

log = logging.getLogger("rollout.lab.simulation")

# GFD label keys.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
GPU_SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
DRIVER_LABELS = ("major", "minor", "rev")  # GFD's deprecated nvidia.com/cuda.driver.*
DRIVER_VERSION_LABELS = ("major", "minor", "revision")
# Operands that wait for the toolkit (the GPU Operator gives them its validation init step).
AFTER_TOOLKIT = (DEVICE_PLUGIN.name, VALIDATOR.name)
WAITING_RESTART = ("CrashLoopBackOff", "CreateContainerError", "ContainerCreating")


@dataclass
class _DeviceManager:
    """The kubelet device manager's memory for nvidia.com/gpu (mutable state, one per node)."""

    loaded_pod_uid: str | None = None
    loaded_label: str | None = None
    profile: SharingProfile = NO_SHARING
    registered: bool = False
    advertised: bool | None = None
    lost_at_s: float | None = None
    # Pod uid -> the (gpu index, replica) slots allocated to it.
    allocations: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # GPU index -> the critical Xid (from the node's kernel log) that made it unhealthy.
    xids: dict[int, int] = field(default_factory=dict)
    # The node's MIG layout as the plugin last read it, the ClusterPolicy's strategy, and
    # what the plugin advertises for it (None: no GPU has MIG enabled, whole GPUs as above).
    layout: NodeLayout = DISABLED
    strategy: str = "single"
    mig_devices: dict[str, list[tuple[int, str]]] | None = None
    # Pod uid -> the (resource, MIG device or GPU UUID) allocated to it on a MIG node.
    mig_allocations: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def format_gpu_list(gpus: list[GpuDescription]) -> str:
    """`nvidia-smi -L` as seen inside a container: visible GPUs renumbered from 0."""
    return "".join(f"GPU {i}: {gpu.product} (UUID: {gpu.uuid})\n" for i, gpu in enumerate(gpus))


def gfd_product(product: str, replicas: int) -> str:
    """GFD's product label: spaces become dashes; shared GPUs say so."""
    value = "-".join(product.split())
    return f"{value}-SHARED" if replicas > 1 else value


def parse_unhealthy(annotation: str | None) -> set[int]:
    """GPU indices from the unhealthy-GPUs knob ("0,2"); junk entries are ignored."""
    return {int(p) for p in (annotation or "").split(",") if p.strip().isdigit()}


@dataclass(eq=False)
class Kubelet:
    """Runs the pods bound to one node and publishes the node's GPU resources."""

    registry: Registry
    node: NodeDescription
    node_index: int
    probe: NodeRuntimeProbe
    timings: SimulationTimings
    clock: Callable[[], float] = time.time
    _devices: _DeviceManager = field(default_factory=_DeviceManager, init=False)
    _first_seen: dict[str, float] = field(default_factory=dict, init=False)
    _running_since: dict[str, float] = field(default_factory=dict, init=False)
    _ip_counter: int = field(default=1, init=False)
    # uid -> (when its container may start again, the back-off that led there)
    _backoff: dict[str, tuple[float, float]] = field(default_factory=dict, init=False)
    # uid -> when the kubelet saw its deletion (it stops the containers, then deletes it)
    _stopping_since: dict[str, float] = field(default_factory=dict, init=False)
    # uids whose containers must start again (the node rebooted under them)
    _restart: set[str] = field(default_factory=set, init=False)
    _boot: str | None = field(default=None, init=False)
    _runtime: RuntimeState = field(init=False)
    # uid -> a smoke container's command running on the node (one at a time per node)
    _commands: dict[str, Future[NodeCommandOutcome | None]] = field(
        default_factory=dict, init=False
    )
    _pool: ThreadPoolExecutor = field(init=False)
    # smoke pods that name a runtime class: run through the node's CRI (cripods.py)
    _cri: CriPods = field(init=False)

    def __post_init__(self) -> None:
        self._recorder = EventRecorder(self.registry, "kubelet", self.node.name, self.clock)
        self.driver_version = self.node.driver_version
        self.toolkit = ToolkitUnit(self.probe, self.node.name)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pod-{self.name}")
        self._runtime = self.probe.state(self.node.name)
        self._cri = CriPods(
            self.registry,
            self.probe,
            self.node.name,
            self.node.address,
            self.timings,
            self._recorder,
            self._pool,
        )

    @property
    def name(self) -> str:
        return self.node.name

    def sync(self, cluster_policy: Mapping[str, Any] | None) -> None:
        """One pass: pods, then device plugin registration, then node status and labels."""
        node = self.registry.find(NODES, None, self.name)
        if node is None:
            return
        now = self.clock()
        runtime = self._runtime = self.probe.state(self.name)
        if not runtime.alive:
            # A dead node's kubelet posts nothing: the node controller marks it Unknown.
            self._sync_node(now)
            return
        if runtime.containerd_active:
            self._cri.retry_removals()
        pods = self._pods()
        if self._boot is not None and runtime.boot != self._boot:
            self._rebooted(pods, now)
        self._boot = runtime.boot
        self._release_finished(pods)
        self._follow_toolkit(pods)
        for pod in pods:
            try:
                self._sync_pod(pod, now)
            except ApiError as error:
                log.debug("kubelet %s: pod write raced: %s", self.name, error)
        self._sync_devices(node, self._pods(), cluster_policy, now)
        sync_operand_holders(self.node.root, self._pods())  # operandholders.py
        self._sync_node(now)

    def settled(self) -> bool:
        """Whether this node's operands run (the toolkit settled, the plugin registered)."""
        if not self._runtime.alive or not self.node.gpus:
            return True  # nothing to wait for
        return self.toolkit.settled(self._runtime) and self._devices.registered

    def close(self) -> None:
        self.toolkit.close()

    def _pods(self) -> list[dict[str, Any]]:
        return [
            p for p in self.registry.list_objects(PODS) if p["spec"].get("nodeName") == self.name
        ]

    def _rebooted(self, pods: list[dict[str, Any]], now: float) -> None:
        """Every container of the node is gone; running pods start again, sandbox and all."""
        log.info("kubelet %s: the node rebooted", self.name)
        self.toolkit.forget()
        self._devices.loaded_pod_uid = None
        for pod in pods:
            if is_terminal(pod) or is_deleting(pod):
                continue
            if (pod.get("status") or {}).get("phase") == "Running":
                self._restart.add(pod["metadata"]["uid"])
                self._write_pod(pod, lambda p: set_create_error(p, "ContainerCreating", "", now))

    # ------------------------------------------------------------------- pods

    def _handler_ok(self, pod: Mapping[str, Any]) -> bool:
        runtime_class = pod["spec"].get("runtimeClassName")
        return runtime_class is None or self.probe.has_handler(self.name, str(runtime_class))

    def _sync_pod(self, pod: dict[str, Any], now: float) -> None:
        uid = pod["metadata"]["uid"]
        if is_deleting(pod):
            self._finish_deleting(pod, now)
            return
        if is_terminal(pod):
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Pending":
            self._start_pod(pod, now)
        elif uid in self._restart:
            self._restart_pod(pod, now)
        elif phase == "Running":
            self._run_pod(pod, now)
        self._first_seen.setdefault(uid, now)

    def _can_start(self, pod: dict[str, Any], now: float, *, in_sandbox: bool) -> bool:
        """What any container start needs: containerd up, the toolkit (for operands of the
        nvidia class) and the pod's runtime handler in the running containerd."""
        if not self._runtime.containerd_active:
            return False  # the CRI does not answer; the kubelet retries
        if owner_daemonset(pod) in AFTER_TOOLKIT and not self.toolkit.settled(self._runtime):
            if waiting_reason(pod) is None:
                self._write_pod(pod, lambda p: set_waiting(p, "PodInitializing", "", now))
            return False
        if owner_daemonset(pod) == VALIDATOR.name and (
            not driver_validates(self.node.root) or self._validator_stuck()
        ):
            # its driver-validation init container reruns at every start: after a driver
            # change or a reboot it passes only once nvidia-smi works with the new driver
            # (and never while `lab break validator-stuck` holds it)
            if waiting_reason(pod) is None:
                self._write_pod(pod, lambda p: set_waiting(p, "PodInitializing", "", now))
            return False
        if self._cri.runs(pod) or self._handler_ok(pod):
            return True  # the CRI answers for the handler itself
        runtime_class = pod["spec"]["runtimeClassName"]
        error = f'failed to get sandbox runtime: no runtime for "{runtime_class}" is configured'
        if in_sandbox:
            self._write_pod(pod, lambda p: set_create_error(p, "CreateContainerError", error, now))
            self._recorder.record(pod, "Warning", "Failed", f"Error: {error}")
        else:
            self._write_pod(pod, lambda p: set_create_error(p, "ContainerCreating", "", now))
            self._recorder.record(
                pod,
                "Warning",
                "FailedCreatePodSandBox",
                f"Failed to create pod sandbox: rpc error: code = Unknown desc = {error}",
            )
        return False

    def _start_pod(self, pod: dict[str, Any], now: float) -> None:
        uid = pod["metadata"]["uid"]
        first_seen = self._first_seen.setdefault(uid, now)
        if not self._can_start(pod, now, in_sandbox=False):
            return
        if now - first_seen < self.timings.pod_start_s:
            return
        if not self._toolkit_container_started(pod, now):
            return
        mig = self._devices.mig_devices is not None
        if not (self._admit_mig(pod) if mig else self._admit_gpus(pod)):
            return
        if self._cri.runs(pod):
            if self._cri.run(pod, now, self._visible_devices(uid)):
                self._release(uid)
            return
        ip = f"10.244.{self.node_index}.{self._ip_counter % 250 + 2}"
        self._ip_counter += 1
        self._write_pod(pod, lambda p: set_running(p, self.node.address, ip, now))
        self._running_since[uid] = now
        smoke = runs_nvidia_smi(pod)
        if smoke is not None:
            # the container's command, run on the node with the GPUs the pod was given
            visible = ",".join(self._visible_devices(uid))
            self._commands[uid] = self._pool.submit(self._run_command, smoke[1], visible)

    def _restart_pod(self, pod: dict[str, Any], now: float) -> None:
        """After a reboot: a new sandbox, then the containers, one restart more."""
        uid = pod["metadata"]["uid"]
        if not self._can_start(pod, now, in_sandbox=False):
            return
        if not self._toolkit_container_started(pod, now):
            return
        self._restart.discard(uid)
        self._write_pod(pod, lambda p: set_running(p, self.node.address, None, now, restart=True))
        self._running_since[uid] = now

    def _toolkit_container_started(self, pod: dict[str, Any], now: float) -> bool:
        """The toolkit pod's container is the node's toolkit unit: true once it runs."""
        if owner_daemonset(pod) != TOOLKIT.name:
            return True
        uid = pod["metadata"]["uid"]
        if self.toolkit.pod_uid != uid:
            self.toolkit.start(uid, self._runtime)
            return False
        done = self.toolkit.outcome()
        if done is None or done[0] != "start":
            return False  # systemctl start still runs
        if not done[1].ok:
            self._recorder.record(pod, "Warning", "Failed", f"Error: {done[1].detail}")
            self.toolkit.pod_uid = None  # the next attempt starts the unit again
            return False
        return True

    def _follow_toolkit(self, pods: list[dict[str, Any]]) -> None:
        """Stop the unit once the pod that runs it is deleted or gone."""
        uid = self.toolkit.pod_uid
        if uid is None:
            return
        pod = next((p for p in pods if p["metadata"]["uid"] == uid), None)
        if pod is None or is_deleting(pod) or is_terminal(pod):
            self.toolkit.stop()

    def _finish_deleting(self, pod: dict[str, Any], now: float) -> None:
        """A deleted pod goes once its containers stopped (never later than its grace)."""
        uid = pod["metadata"]["uid"]
        since = self._stopping_since.setdefault(uid, now)
        if owner_daemonset(pod) == TOOLKIT.name:
            done = self.toolkit.outcome()
            if self.toolkit.pod_uid == uid or done is None:
                return  # the unit still runs, or its stop does
        elif now - since < self.timings.container_stop_s:
            return
        self._cri.remove_sandboxes(uid)
        if not holder_stopped(self.node.root, pod):
            return  # its operand stand-in process still runs on the node
        meta = pod["metadata"]
        try:
            self.registry.delete(
                PODS, meta["namespace"], meta["name"], DeleteOptions(grace_period_s=0)
            )
        except ApiError as error:
            log.debug("kubelet %s: pod %s already gone: %s", self.name, meta["name"], error)

    def _run_pod(self, pod: dict[str, Any], now: float) -> None:
        uid = pod["metadata"]["uid"]
        since = self._running_since.setdefault(uid, now)
        waiting = waiting_reason(pod)
        if waiting in WAITING_RESTART:
            self._retry_container(pod, now)
            return
        crash = self._plugin_crash(pod)
        if crash:
            self._crash(pod, crash, now)
            return
        smoke = runs_nvidia_smi(pod)
        if smoke is not None and now - since >= self.timings.smoke_run_s:
            command = self._commands.get(uid)
            if command is not None and not command.done():
                return
            outcome = command.result() if command is not None else None
            if outcome is None:  # a control plane without nodes: the node's description
                outcome = NodeCommandOutcome(0, format_gpu_list(self._visible_gpus(uid)))
            meta = pod["metadata"]
            self.registry.write_log(meta["namespace"], meta["name"], smoke[0], outcome.output)
            self._write_pod(pod, lambda p: set_terminated(p, now, outcome.exit_code))
            self._release(uid)

    def _crash(self, pod: dict[str, Any], line: str, now: float) -> None:
        uid = pod["metadata"]["uid"]
        _, previous = self._backoff.get(uid, (now, 0.0))
        delay = self.timings.crash_backoff_after(previous)
        self._backoff[uid] = (now + delay, delay)
        self._write_pod(pod, lambda p: set_crash_loop(p, now, delay))
        self._write_plugin_log(pod, line)

    def _retry_container(self, pod: dict[str, Any], now: float) -> None:
        """CrashLoopBackOff or CreateContainerError: start the container again after back-off."""
        uid = pod["metadata"]["uid"]
        due, _ = self._backoff.get(uid, (now, 0.0))
        if now < due:
            return
        crash = self._plugin_crash(pod)
        if crash:
            self._crash(pod, crash, now)
            return
        if not self._can_start(pod, now, in_sandbox=True):
            _, delay = self._backoff.get(uid, (now, self.timings.crash_backoff_s))
            self._backoff[uid] = (now + delay, delay)
            return
        self._backoff.pop(uid, None)
        self._write_pod(pod, lambda p: set_running(p, self.node.address, None, now))
        self._running_since[uid] = now

    def _plugin_crash(self, pod: dict[str, Any]) -> str | None:
        """The lab's crash knob for this node's device plugin: the line its log ends with."""
        if owner_daemonset(pod) != DEVICE_PLUGIN.name:
            return None
        node = self.registry.find(NODES, None, self.name) or {}
        annotations = node.get("metadata", {}).get("annotations") or {}
        return annotations.get(DEVICE_PLUGIN_CRASH_ANNOTATION) or None

    def _validator_stuck(self) -> bool:
        node = self.registry.find(NODES, None, self.name) or {}
        annotations = node.get("metadata", {}).get("annotations") or {}
        return bool(annotations.get(VALIDATOR_STUCK_ANNOTATION))

    def _write_plugin_log(self, pod: Mapping[str, Any], line: str) -> None:
        meta = pod["metadata"]
        self.registry.write_log(
            meta["namespace"], meta["name"], DEVICE_PLUGIN.container, line + "\n"
        )

    def _write_pod(self, pod: Mapping[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
        write_pod(self.registry, pod, change)

    # ---------------------------------------------------------------- devices

    def _unhealthy(self) -> set[int]:
        """GPU indices the plugin holds unhealthy: the lab's knob and critical Xids."""
        node = self.registry.find(NODES, None, self.name)
        annotations = (node or {}).get("metadata", {}).get("annotations") or {}
        return parse_unhealthy(annotations.get(UNHEALTHY_GPUS_ANNOTATION)) | set(self._devices.xids)

    def _slots(self) -> list[tuple[int, int]]:
        """Healthy (gpu index, replica) slots, replica-major so pods spread over GPUs."""
        unhealthy = self._unhealthy()
        return [
            (gpu.index, replica)
            for replica in range(self._devices.profile.replicas)
            for gpu in self.node.gpus
            if gpu.index not in unhealthy
        ]

    def _free_slots(self) -> list[tuple[int, int]]:
        if not self._devices.registered:
            return []
        taken = {s for slots in self._devices.allocations.values() for s in slots}
        return [s for s in self._slots() if s not in taken]

    def _allocate(self, uid: str, count: int) -> tuple[tuple[int, int], ...] | None:
        free = self._free_slots()
        if len(free) < count:
            return None
        self._devices.allocations[uid] = tuple(free[:count])
        return self._devices.allocations[uid]

    def _free_mig(self, resource: str) -> list[str]:
        """UUIDs of the healthy devices of `resource` on a MIG node not given to a pod."""
        state = self._devices
        if not state.registered or state.mig_devices is None:
            return []
        unhealthy = self._unhealthy()
        taken = {uuid for given in state.mig_allocations.values() for _, uuid in given}
        return [
            uuid
            for gpu, uuid in state.mig_devices.get(resource, [])
            if gpu not in unhealthy and uuid not in taken
        ]

    def _admit_gpus(self, pod: dict[str, Any]) -> bool:
        """Allocate whole GPUs (time-slicing slots) to the pod; False when it failed."""
        uid = pod["metadata"]["uid"]
        wanted = gpu_request(pod)
        if not wanted or uid in self._devices.allocations:
            return True
        if self._allocate(uid, wanted) is None:
            self._refuse(pod, GPU_RESOURCE, wanted, len(self._free_slots()))
            return False
        return True

    def _admit_mig(self, pod: dict[str, Any]) -> bool:
        """Allocate a MIG node's devices to the pod (admission); False when it failed."""
        uid = pod["metadata"]["uid"]
        if uid in self._devices.mig_allocations:
            return True
        given: list[tuple[str, str]] = []
        for resource, count in sorted(device_requests(pod).items()):
            free = self._free_mig(resource)
            if len(free) < count:
                self._refuse(pod, resource, count, len(free))
                return False
            given.extend((resource, uuid) for uuid in free[:count])
        if given:
            self._devices.mig_allocations[uid] = tuple(given)
        return True

    def _refuse(self, pod: dict[str, Any], resource: str, wanted: int, free: int) -> None:
        """The device manager's admission failure: the pod fails, an event says why."""
        message = (
            f"Allocate failed due to requested number of devices unavailable for "
            f"{resource}. Requested: {wanted}, Available: {free}, which is unexpected"
        )
        self._write_pod(pod, lambda p: set_failed(p, "UnexpectedAdmissionError", message))
        self._recorder.record(pod, "Warning", "UnexpectedAdmissionError", message)

    def _release(self, uid: str) -> None:
        self._devices.allocations.pop(uid, None)
        self._devices.mig_allocations.pop(uid, None)
        self._commands.pop(uid, None)

    def _run_command(self, argv: list[str], visible: str) -> NodeCommandOutcome | None:
        try:
            return self.probe.run_in_node(self.name, argv, {"NVIDIA_VISIBLE_DEVICES": visible})
        except RolloutError as error:  # a hung command, killed
            return NodeCommandOutcome(137, f"{error}\n")

    def _release_finished(self, pods: list[dict[str, Any]]) -> None:
        active = {p["metadata"]["uid"] for p in pods if not is_terminal(p)}
        for uid in [*self._devices.allocations, *self._devices.mig_allocations]:
            if uid not in active:
                self._release(uid)
        present = {p["metadata"]["uid"] for p in pods}
        self._cri.forget_gone(present)
        for memory in (self._first_seen, self._running_since, self._backoff):
            for uid in list(memory):
                if uid not in active:
                    del memory[uid]
        for uid in list(self._stopping_since):
            if uid not in present:
                del self._stopping_since[uid]
        self._restart &= active

    def _visible_devices(self, uid: str) -> list[str]:
        """The UUIDs the pod's container is given: its MIG devices, else its GPUs."""
        given = self._devices.mig_allocations.get(uid)
        if given is not None:
            return [uuid for _, uuid in given]
        return [g.uuid for g in self._visible_gpus(uid)]

    def _visible_gpus(self, uid: str) -> list[GpuDescription]:
        slots = self._devices.allocations.get(uid)
        if slots is None:
            return list(self.node.gpus)  # no GPU request: NVIDIA_VISIBLE_DEVICES=all images
        indices = sorted({index for index, _ in slots})
        return [g for g in self.node.gpus if g.index in indices]

    def _sync_devices(
        self,
        node: dict[str, Any],
        pods: list[dict[str, Any]],
        cluster_policy: Mapping[str, Any] | None,
        now: float,
    ) -> None:
        state = self._devices
        if state.advertised is None:
            state.advertised = GPU_RESOURCE in ((node.get("status") or {}).get("capacity") or {})
        plugin = next(
            (
                p
                for p in pods
                if owner_daemonset(p) == DEVICE_PLUGIN.name and not is_deleting(p) and is_ready(p)
            ),
            None,
        )
        self._read_xids(plugin)
        self._read_mig(cluster_policy)
        labels = node["metadata"].get("labels") or {}
        if plugin is not None and (
            plugin["metadata"]["uid"] != state.loaded_pod_uid
            or labels.get(CONFIG_LABEL) != state.loaded_label
        ):
            self._load_profile(node, plugin, cluster_policy)
        # The plugin's own gRPC registration with the kubelet: containerd and its handlers
        # play no part once the plugin's container runs.
        state.registered = (
            plugin is not None
            and now - self._running_since.get(plugin["metadata"]["uid"], now)
            >= self.timings.plugin_registration_s
            and self._driver_ready(node, pods)
            and bool(self.node.gpus)
        )
        if state.registered:
            state.advertised = True
            state.lost_at_s = None
        elif state.advertised:
            if state.lost_at_s is None:
                state.lost_at_s = now
            if now - state.lost_at_s >= self.timings.device_plugin_grace_s:
                state.advertised = False

    def _read_xids(self, plugin: dict[str, Any] | None) -> None:
        """The plugin's health check: critical Xids in the node's kernel log, each logged
        once as the real plugin logs it."""
        xids = read_critical_xids(self.node.root, [g.index for g in self.node.gpus])
        if plugin is not None:
            for index, xid in sorted(xids.items()):
                if self._devices.xids.get(index) != xid:
                    uuid = next(g.uuid for g in self.node.gpus if g.index == index)
                    self._write_plugin_log(
                        plugin,
                        f"XidCriticalError: Xid={xid} on Device={uuid}; "
                        "marking device as unhealthy.",
                    )
        self._devices.xids = xids

    def _read_mig(self, cluster_policy: Mapping[str, Any] | None) -> None:
        """The node's MIG layout (its file) and what the plugin advertises for it."""
        state = self._devices
        state.layout = read_layout(self.node.root)
        state.strategy = mig_strategy(cluster_policy)
        state.mig_devices = plugin_devices(state.layout, self.node.gpus, state.strategy)

    def _load_profile(
        self,
        node: dict[str, Any],
        plugin: dict[str, Any],
        cluster_policy: Mapping[str, Any] | None,
    ) -> None:
        state = self._devices
        labels = node["metadata"].get("labels") or {}
        state.loaded_pod_uid = plugin["metadata"]["uid"]
        state.loaded_label = labels.get(CONFIG_LABEL)
        name = config_name(cluster_policy)
        configmap = self.registry.find(CONFIGMAPS, OPERATOR_NAMESPACE, name) if name else None
        try:
            state.profile = select_profile(cluster_policy, configmap, labels)
        except ProfileError as error:
            # The real config-manager refuses the config; the plugin keeps what it had.
            self._recorder.record(node, "Warning", "DevicePluginConfigInvalid", str(error))
            return
        log.info(
            "device plugin on %s loaded %s replicas=%d",
            self.name,
            state.profile.source or "no sharing config",
            state.profile.replicas,
        )

    def _driver_ready(self, node: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
        labels = node["metadata"].get("labels") or {}
        if labels.get(DRIVER.deploy_label) != "true":
            return True  # a host-installed driver, not the operator's
        drivers = [p for p in pods if is_driver_pod(p) and not is_deleting(p)]
        ready = [p for p in drivers if is_ready(p)]
        for pod in ready:
            self.driver_version = driver_version_of(pod) or self.driver_version
        return bool(ready)

    # ------------------------------------------------------------------- node

    def _sync_node(self, now: float) -> None:
        runtime = self._runtime
        if not runtime.alive:
            self.registry.mutate(NODES, None, self.name, lambda n: _set_node_unknown(n, now))
            return
        if self.node.root is not None:
            # GFD reads the driver through NVML, whoever installed it (the driver pod or the
            # host's packages); while NVML fails (a mismatch) it relabels nothing
            self.driver_version = working_driver(self.node.root) or self.driver_version
        state = self._devices
        total = len(self.node.gpus) * state.profile.replicas
        healthy = len(self._slots()) if state.registered else 0

        def change(node: dict[str, Any]) -> None:
            status = node.setdefault("status", {})
            capacity = status.setdefault("capacity", {})
            allocatable = status.setdefault("allocatable", {})
            if state.mig_devices is not None:
                self._set_mig_resources(capacity, allocatable, state.mig_devices)
            elif state.registered:
                capacity[GPU_RESOURCE] = str(total)
                allocatable[GPU_RESOURCE] = str(healthy)
            elif state.advertised:
                capacity.setdefault(GPU_RESOURCE, str(total))
                allocatable[GPU_RESOURCE] = "0"
            else:
                capacity.pop(GPU_RESOURCE, None)
                allocatable.pop(GPU_RESOURCE, None)
            if state.mig_devices is None:
                for key in [k for k in capacity if k.startswith(MIG_RESOURCE_PREFIX)]:
                    capacity.pop(key, None)
                    allocatable.pop(key, None)
            annotations = node["metadata"].get("annotations") or {}
            not_ready = None
            if not runtime.containerd_active:
                not_ready = "container runtime is down"
            elif annotations.get(NOT_READY_ANNOTATION) == "true":
                not_ready = (
                    "container runtime network not ready: NetworkReady=false "
                    "reason:NetworkPluginNotReady"
                )
            _set_node_conditions(status, not_ready, now)
            if self.node.gpus:
                labels = node["metadata"].setdefault("labels", {})
                labels.update(self._gfd_labels())
                mig = gfd_mig_labels(state.layout, self.node.gpus, state.strategy)
                labels.update(mig)
                for key in stale_gfd_labels(labels, mig):
                    del labels[key]

        self.registry.mutate(NODES, None, self.name, change)

    def _set_mig_resources(
        self,
        capacity: dict[str, str],
        allocatable: dict[str, str],
        devices: Mapping[str, list[tuple[int, str]]],
    ) -> None:
        """A MIG node's plugin resources: each resource's devices while the plugin is
        registered (those it no longer lists go), allocatable 0 while it is gone."""
        state = self._devices
        plugin_keys = [k for k in capacity if is_plugin_resource(k)]
        if state.registered:
            unhealthy = self._unhealthy()
            for key in plugin_keys:
                if key not in devices:
                    capacity.pop(key, None)
                    allocatable.pop(key, None)
            for resource, found in devices.items():
                capacity[resource] = str(len(found))
                allocatable[resource] = str(sum(1 for gpu, _ in found if gpu not in unhealthy))
        elif state.advertised:
            for key in plugin_keys:
                allocatable[key] = "0"
        else:
            for key in plugin_keys:
                capacity.pop(key, None)
                allocatable.pop(key, None)

    def _gfd_labels(self) -> dict[str, str]:
        replicas = self._devices.profile.replicas
        first = self.node.gpus[0]
        labels = {
            GPU_COUNT_LABEL: str(len(self.node.gpus)),
            GPU_PRODUCT_LABEL: gfd_product(first.product, replicas),
            GPU_REPLICAS_LABEL: str(replicas),
            GPU_SHARING_LABEL: self._devices.profile.strategy,
            GPU_MEMORY_LABEL: str(first.memory_mib),
        }
        parts = self.driver_version.split(".")
        if len(parts) == 3:
            labels.update(
                {
                    f"nvidia.com/cuda.driver.{k}": v
                    for k, v in zip(DRIVER_LABELS, parts, strict=True)
                }
            )
            labels.update(
                {
                    f"nvidia.com/cuda.driver-version.{k}": v
                    for k, v in zip(DRIVER_VERSION_LABELS, parts, strict=True)
                }
            )
            labels["nvidia.com/cuda.driver-version.full"] = self.driver_version
        return labels


def _set_node_unknown(node: dict[str, Any], now: float) -> None:
    """What the node lifecycle controller writes when a node's kubelet stops posting."""
    status = node.setdefault("status", {})
    stamp = format_timestamp(now)
    conditions = []
    never = "Kubelet never posted node status."
    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready"):
        if not status.get("conditions"):
            conditions.append(
                {
                    "type": kind,
                    "status": "Unknown",
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                    "reason": "NodeStatusNeverUpdated",
                    "message": never,
                }
            )
    for condition in status.get("conditions") or []:
        if condition.get("status") == "Unknown":
            conditions.append(condition)
            continue
        conditions.append(
            {
                **condition,
                "status": "Unknown",
                "lastTransitionTime": stamp,
                "reason": "NodeStatusUnknown",
                "message": "Kubelet stopped posting node status.",
            }
        )
    status["conditions"] = conditions


def _set_node_conditions(status: dict[str, Any], not_ready: str | None, now: float) -> None:
    """The kubelet's four node conditions; times move only on a change, like the real one
    with node leases (no heartbeat churn in the object)."""
    stamp = format_timestamp(now)
    wanted = [
        (
            "MemoryPressure",
            "False",
            "KubeletHasSufficientMemory",
            "kubelet has sufficient memory available",
        ),
        ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        ("Ready", "False", "KubeletNotReady", not_ready)
        if not_ready
        else ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    previous = {c.get("type"): c for c in status.get("conditions") or []}
    conditions = []
    for kind, value, reason, message in wanted:
        old = previous.get(kind) or {}
        unchanged = old.get("status") == value
        same = unchanged and old.get("message") == message
        conditions.append(
            {
                "type": kind,
                "status": value,
                "lastHeartbeatTime": old.get("lastHeartbeatTime") if same else stamp,
                "lastTransitionTime": old.get("lastTransitionTime") if unchanged else stamp,
                "reason": reason,
                "message": message,
            }
        )
    status["conditions"] = conditions
