"""The kubelet's pods that run through the node's own containerd CRI (rollout.lab.cri).

A smoke pod naming a runtime class runs for real: sandbox with the class's handler, image
pulled through the node's registry config, container started by runc. A container that never
started waits with containerd's error and is tried again after a back-off, each try in a
sandbox of its own, but for a failed pull, which is tried again in the sandbox it left (as the
kubelet retries only the pull). A pod's sandboxes go when it ends or goes; a removal containerd
refused (it was restarting) is tried again at later passes, one removal at a time per sandbox.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rollout.errors import RolloutError
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import RUNTIMECLASSES
from rollout.lab.cri import ContainerRequest, PodOutcome
from rollout.lab.simulation.events import EventRecorder
from rollout.lab.simulation.pods import device_requests, runs_nvidia_smi, write_pod
from rollout.lab.simulation.podstatus import (
    set_running,
    set_terminated,
    set_waiting,
    waiting_reason,
)
from rollout.lab.simulation.probe import NodeRuntimeProbe
from rollout.lab.simulation.timing import SimulationTimings

log = logging.getLogger("rollout.lab.simulation")

# How many times a sandbox removal is tried before it is left to the node's next boot.
REMOVE_TRIES = 20


@dataclass(eq=False)
class CriPods:
    """One node's pods run through its CRI, in the kubelet's worker (one call at a time)."""

    registry: Registry
    probe: NodeRuntimeProbe
    node: str
    address: str
    timings: SimulationTimings
    recorder: EventRecorder
    pool: ThreadPoolExecutor
    # uid -> a pod's run through the node's CRI; its tries so far; its sandboxes on the node
    _runs: dict[str, Future[PodOutcome]] = field(default_factory=dict, init=False)
    _attempts: dict[str, int] = field(default_factory=dict, init=False)
    _sandboxes: dict[str, list[str]] = field(default_factory=dict, init=False)
    # uid -> (when its container may be tried again, the back-off that led there)
    _backoff: dict[str, tuple[float, float]] = field(default_factory=dict, init=False)
    # uid -> the sandbox a failed pull left: the next try pulls in it, as the same attempt
    _pulling_in: dict[str, str] = field(default_factory=dict, init=False)
    # sandbox id -> tries left: removals that failed (containerd restarting), tried again
    # at later passes, as the kubelet's garbage collection does
    _unremoved: dict[str, int] = field(default_factory=dict, init=False)
    # sandboxes whose removal is queued or running: a pass sends no second one meanwhile.
    # Marked by the kubelet's pass, cleared by the worker once the try has ended.
    _removing: set[str] = field(default_factory=set, init=False)

    def runs(self, pod: Mapping[str, Any]) -> bool:
        """A smoke pod naming a runtime class runs through the node's own containerd."""
        return (
            bool(pod["spec"].get("runtimeClassName"))
            and runs_nvidia_smi(pod) is not None
            and self.probe.runs_pods(self.node)
        )

    def run(self, pod: dict[str, Any], now: float, devices: Sequence[str]) -> bool:
        """One pass of the pod's run (`devices`: the UUIDs of the GPUs or MIG devices
        allocated to it); true once it ended with its container's exit status."""
        uid = pod["metadata"]["uid"]
        due, _ = self._backoff.get(uid, (now, 0.0))
        if now < due:
            if waiting_reason(pod) == "ErrImagePull":
                self._pull_backing_off(pod, now)
            return False
        run = self._runs.get(uid)
        if run is None:
            sandbox = self._pulling_in.get(uid)
            if sandbox is None:  # a new attempt, in a sandbox of its own
                self._attempts[uid] = self._attempts.get(uid, 0) + 1
            request = self._container_request(pod, self._attempts[uid] - 1, sandbox, devices)
            self._runs[uid] = self.pool.submit(self.probe.run_pod, self.node, request)
            if waiting_reason(pod) is None:
                write_pod(
                    self.registry, pod, lambda p: set_waiting(p, "ContainerCreating", "", now)
                )
            return False
        if not run.done():
            return False
        del self._runs[uid]
        try:
            outcome = run.result()
        except RolloutError as error:  # the compiled CRI API is missing on this host
            outcome = PodOutcome(None, reason="FailedCreatePodSandBox", message=str(error))
        self._pulling_in.pop(uid, None)
        self._note_sandbox(uid, outcome.sandbox_id)
        if not outcome.started:
            if outcome.reason == "ErrImagePull" and outcome.sandbox_id is not None:
                self._pulling_in[uid] = outcome.sandbox_id
            self._failed(pod, outcome, now)
            return False
        self._backoff.pop(uid, None)
        meta = pod["metadata"]
        container = str(pod["spec"]["containers"][0]["name"])
        self.registry.write_log(meta["namespace"], meta["name"], container, outcome.output)
        # the sandbox shares the node's network: the pod's IP is the node's
        write_pod(self.registry, pod, lambda p: set_running(p, self.address, self.address, now))
        write_pod(self.registry, pod, lambda p: set_terminated(p, now, outcome.exit_code))
        return True

    def remove_sandboxes(self, uid: str) -> None:
        """The pod is deleted: its sandboxes go."""
        for sandbox in self._sandboxes.pop(uid, []):
            self._remove(sandbox)

    def retry_removals(self) -> None:
        """At a pass where containerd answers: the removals it refused, tried again."""
        for sandbox in list(self._unremoved):
            self._remove(sandbox)

    def forget_gone(self, present: set[str]) -> None:
        """Pods no longer in the registry (`present`: the uids there): what their runs made
        goes with them."""
        for uid in [u for u in self._runs if u not in present and self._runs[u].done()]:
            # the pod went while its run was in flight
            self._note_sandbox(uid, _sandbox_of(self._runs.pop(uid)))
        for uid in [u for u in self._sandboxes if u not in present]:
            # the pod is gone (deleted with no grace): its sandbox goes too
            self.remove_sandboxes(uid)
        for uid in [u for u in self._attempts if u not in present]:
            del self._attempts[uid]
            self._pulling_in.pop(uid, None)
        for uid in [u for u in self._backoff if u not in present]:
            del self._backoff[uid]

    def _note_sandbox(self, uid: str, sandbox_id: str | None) -> None:
        """A sandbox the pod's run made or ran in, listed once (a retried pull reuses one)."""
        if sandbox_id is not None and sandbox_id not in self._sandboxes.get(uid, []):
            self._sandboxes.setdefault(uid, []).append(sandbox_id)

    def _pull_backing_off(self, pod: dict[str, Any], now: float) -> None:
        """After a failed pull, until the next try: ImagePullBackOff, whose message carries
        the failed pull's (kubelet 1.32 and later: "Back-off pulling image X: ErrImagePull:
        ..."), with the kubelet's BackOff event."""
        image = pod["spec"]["containers"][0].get("image", "")
        statuses = pod["status"].get("containerStatuses") or [{}]
        failed = ((statuses[0].get("state") or {}).get("waiting") or {}).get("message", "")
        backing_off = f'Back-off pulling image "{image}"'
        message = f"{backing_off}: ErrImagePull: {failed}" if failed else backing_off
        write_pod(self.registry, pod, lambda p: set_waiting(p, "ImagePullBackOff", message, now))
        self.recorder.record(pod, "Normal", "BackOff", backing_off)
        self.recorder.record(pod, "Warning", "Failed", "Error: ImagePullBackOff")

    def _container_request(
        self,
        pod: Mapping[str, Any],
        attempt: int,
        sandbox: str | None,
        devices: Sequence[str],
    ) -> ContainerRequest:
        meta, spec = pod["metadata"], pod["spec"]
        container = spec["containers"][0]
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        env = {str(e["name"]): str(e.get("value", "")) for e in container.get("env") or []}
        if device_requests(pod):
            # What the device plugin's Allocate answers: the devices given to the container.
            env["NVIDIA_VISIBLE_DEVICES"] = ",".join(devices)
        return ContainerRequest(
            namespace=str(meta["namespace"]),
            pod=str(meta["name"]),
            uid=str(meta["uid"]),
            container=str(container["name"]),
            image=str(container.get("image", "")),
            command=[str(word) for word in command],
            handler=self._handler_of(str(spec["runtimeClassName"])),
            env=env,
            attempt=attempt,
            sandbox_id=sandbox,
        )

    def _handler_of(self, runtime_class: str) -> str:
        """The runtime handler the pod's RuntimeClass names (admission checked it exists)."""
        found = self.registry.find(RUNTIMECLASSES, None, runtime_class) or {}
        return str(found.get("handler") or runtime_class)

    def _failed(self, pod: dict[str, Any], outcome: PodOutcome, now: float) -> None:
        """As the kubelet reports a container that could not start: its waiting reason and
        message, an event, a back-off before the next try."""
        uid = pod["metadata"]["uid"]
        _, previous = self._backoff.get(uid, (now, 0.0))
        delay = self.timings.crash_backoff_after(previous)
        self._backoff[uid] = (now + delay, delay)
        image = pod["spec"]["containers"][0].get("image", "")
        if outcome.reason == "FailedCreatePodSandBox":
            reason, message, event = "ContainerCreating", "", "FailedCreatePodSandBox"
            said = f"Failed to create pod sandbox: {outcome.message}"
        elif outcome.reason == "ErrImagePull":
            reason, message, event = outcome.reason, outcome.message, "Failed"
            said = f'Failed to pull image "{image}": {outcome.message}'
        else:
            reason, message, event = outcome.reason, outcome.message, "Failed"
            said = f"Error: {outcome.message}"
        write_pod(self.registry, pod, lambda p: set_waiting(p, reason, message, now))
        self.recorder.record(pod, "Warning", event, said)
        # the sandbox a failed pull left stays for the next try's pull; others go
        kept = self._pulling_in.get(uid)
        for sandbox in self._sandboxes.pop(uid, []):
            if sandbox == kept:
                self._sandboxes[uid] = [sandbox]
            else:
                self._remove(sandbox)

    def _remove(self, sandbox_id: str) -> None:
        """Queue the sandbox's removal, unless one is queued or running already."""
        if sandbox_id in self._removing:
            return
        self._removing.add(sandbox_id)
        self.pool.submit(self._remove_sandbox, sandbox_id)

    def _remove_sandbox(self, sandbox_id: str) -> None:
        """In the worker: one try; a refused one is left to a later pass, REMOVE_TRIES in all."""
        try:
            self.probe.remove_pod_sandbox(self.node, sandbox_id)
        except RolloutError as error:  # containerd restarting, or the node gone
            left = self._unremoved.get(sandbox_id, REMOVE_TRIES) - 1
            log.info("kubelet %s: sandbox %s not removed: %s", self.node, sandbox_id[:12], error)
            if left > 0:
                self._unremoved[sandbox_id] = left
            else:
                self._unremoved.pop(sandbox_id, None)
        else:
            self._unremoved.pop(sandbox_id, None)
        finally:
            # only now: the next pass may try again what this try left in _unremoved
            self._removing.discard(sandbox_id)


def _sandbox_of(run: Future[PodOutcome]) -> str | None:
    try:
        return run.result().sandbox_id
    except RolloutError:
        return None
