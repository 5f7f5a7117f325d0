"""The kubelet's side of pods run through a node's CRI, with a fake node runtime: what it asks
(handler, image, command, the allocated GPUs), how a container whose image could not be pulled
waits and is pulled again in the same sandbox, and that sandboxes go with their pods. The real
CRI is in tests/lab/test_cri_smoke.py."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from kubernetes import client

from rollout.lab.controlplane import ControlPlane
from rollout.lab.cri import ContainerRequest, PodOutcome, load_protocol
from rollout.lab.cri.pods import CriCallFailed
from rollout.lab.simulation import FixedRuntimeProbe
from rollout.lab.simulation.probe import RuntimeState
from tests.lab.labapi import wait_for
from tests.lab.test_simulation import FAST, UUIDS, gpu_pod, gpus, lab_description

PULL_ERROR = 'rpc error: code = Unknown desc = failed to pull and unpack image "cuda:12.4"'


class CriProbe(FixedRuntimeProbe):
    """Nodes whose CRI answers from a script: each run_pod takes the next outcome."""

    def __init__(self, outcomes: list[PodOutcome]) -> None:
        super().__init__({node: {"runc", "nvidia"} for node in UUIDS})
        self.outcomes = outcomes
        self.requests: list[ContainerRequest] = []
        self.removed: list[str] = []
        self._cri = threading.Lock()

    def runs_pods(self, node: str) -> bool:
        return True

    def run_pod(self, node: str, request: ContainerRequest) -> PodOutcome:
        with self._cri:
            self.requests.append(request)
            outcome = self.outcomes.pop(0)
            # a try in a sandbox a failed pull left runs in it, as CriPodRunner does
            return replace(outcome, sandbox_id=request.sandbox_id or outcome.sandbox_id)

    def remove_pod_sandbox(self, node: str, sandbox_id: str) -> None:
        with self._cri:
            self.removed.append(sandbox_id)


@pytest.fixture()
def probe() -> CriProbe:
    return CriProbe(
        [
            PodOutcome("sandbox-1", reason="ErrImagePull", message=PULL_ERROR),
            PodOutcome("sandbox-2", exit_code=0, output="GPU 0: from the container\n"),
        ]
    )


@pytest.fixture()
def api_url(probe: CriProbe) -> Iterator[str]:
    """The control plane's URL, for the conftest's clients."""
    # a back-off long enough to see the pod wait in it
    timings = replace(FAST, crash_backoff_s=1.0, crash_backoff_max_s=1.0)
    with ControlPlane.start(lab_description(), probe, port=0, timings=timings) as plane:
        yield plane.url


def test_a_pull_error_waits_then_the_same_sandbox_runs_the_container(
    core: client.CoreV1Api, probe: CriProbe
) -> None:
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    command = ["sh", "-c", "nvidia-smi -L"]
    pod = gpu_pod("smoke", 1, runtimeClassName="nvidia", container={"command": command})
    core.create_namespaced_pod("default", pod)
    # until the next try: ImagePullBackOff, saying why the pull failed (kubelet 1.32+)
    waiting = wait_for(lambda: backing_off(core, "smoke"))
    assert waiting.message == f'Back-off pulling image "cuda:12.4": ErrImagePull: {PULL_ERROR}'
    wait_for(lambda: core.read_namespaced_pod("smoke", "default").status.phase == "Succeeded")
    assert core.read_namespaced_pod_log("smoke", "default") == "GPU 0: from the container\n"

    first, second = probe.requests
    assert (first.handler, first.image, list(first.command)) == ("nvidia", "cuda:12.4", command)
    assert first.env["NVIDIA_VISIBLE_DEVICES"] in UUIDS["lab-node-1"]
    # as the kubelet: the pull is tried again in the sandbox the failed pull left
    assert (first.sandbox_id, second.sandbox_id) == (None, "sandbox-1")
    assert (first.attempt, second.attempt) == (0, 0)
    assert second.env == first.env, "the same GPU on every try"
    assert probe.removed == [], "the sandbox stays while the pod runs in it"
    events = core.list_namespaced_event("default").items
    pulls = [e for e in events if e.involved_object.name == "smoke" and e.reason == "Failed"]
    assert pulls and pulls[0].message == f'Failed to pull image "cuda:12.4": {PULL_ERROR}'
    backoff = [e for e in events if e.involved_object.name == "smoke" and e.reason == "BackOff"]
    assert backoff and backoff[0].message == 'Back-off pulling image "cuda:12.4"'
    assert backoff[0].type == "Normal"

    core.delete_namespaced_pod("smoke", "default", grace_period_seconds=0)
    wait_for(lambda: probe.removed == ["sandbox-1"])


def backing_off(core: client.CoreV1Api, name: str) -> client.V1ContainerStateWaiting | None:
    statuses = core.read_namespaced_pod(name, "default").status.container_statuses or []
    waiting = statuses[0].state.waiting if statuses else None
    return waiting if waiting is not None and waiting.reason == "ImagePullBackOff" else None


def test_a_pod_without_a_runtime_class_is_not_run_through_the_cri(
    core: client.CoreV1Api, probe: CriProbe
) -> None:
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    pod = gpu_pod("plain", 1, container={"command": ["nvidia-smi", "-L"]})
    core.create_namespaced_pod("default", pod)
    wait_for(lambda: core.read_namespaced_pod("plain", "default").status.phase == "Succeeded")
    assert probe.requests == []


class FlakyRemovalProbe(CriProbe):
    """A containerd that refuses the first removal (it is restarting)."""

    def remove_pod_sandbox(self, node: str, sandbox_id: str) -> None:
        with self._cri:
            self.tries = getattr(self, "tries", 0) + 1
            if self.tries == 1:
                raise CriCallFailed("removing sandbox: connection refused")
            self.removed.append(sandbox_id)


@contextmanager
def smoke_pod_deleted(probe: CriProbe) -> Iterator[None]:
    """A smoke pod run through the CRI to its end, then deleted; the cluster runs on while
    the caller watches its sandbox go."""
    with ControlPlane.start(lab_description(), probe, port=0, timings=FAST) as plane:
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=plane.url)))
        wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
        command = ["sh", "-c", "nvidia-smi -L"]
        pod = gpu_pod("smoke", 1, runtimeClassName="nvidia", container={"command": command})
        core.create_namespaced_pod("default", pod)
        wait_for(lambda: core.read_namespaced_pod("smoke", "default").status.phase == "Succeeded")
        core.delete_namespaced_pod("smoke", "default", grace_period_seconds=0)
        yield


def test_a_removal_containerd_refused_is_tried_again() -> None:
    probe = FlakyRemovalProbe([PodOutcome("sandbox-1", exit_code=0, output="GPU 0: x\n")])
    with smoke_pod_deleted(probe):
        wait_for(lambda: probe.removed == ["sandbox-1"])
        assert probe.tries == 2


class SlowRemovalProbe(FlakyRemovalProbe):
    """... whose next removal takes several of the kubelet's passes (containerd is slow to
    come back)."""

    PASSES = 5

    def __init__(self, outcomes: list[PodOutcome]) -> None:
        super().__init__(outcomes)
        self.passes: dict[str, int] = {}  # node -> its kubelet's passes (one state read each)
        self.slow_passes = 0

    def state(self, node: str) -> RuntimeState:
        with self._cri:
            self.passes[node] = self.passes.get(node, 0) + 1
        return super().state(node)

    def remove_pod_sandbox(self, node: str, sandbox_id: str) -> None:
        if getattr(self, "tries", 0) == 1:  # the try after the refused one: slow
            start = self.passes[node]
            wait_for(lambda: self.passes[node] >= start + self.PASSES)
            self.slow_passes = self.passes[node] - start
        super().remove_pod_sandbox(node, sandbox_id)


def test_a_removal_in_flight_is_not_sent_again() -> None:
    """One removal per sandbox outstanding: the passes while a try is still running queue
    no second one behind it."""
    probe = SlowRemovalProbe([PodOutcome("sandbox-1", exit_code=0, output="GPU 0: x\n")])
    with smoke_pod_deleted(probe):
        wait_for(lambda: probe.removed)
        assert probe.slow_passes >= SlowRemovalProbe.PASSES
        # passes enough for any removal queued behind the slow one to have run
        done = sum(probe.passes.values())
        wait_for(lambda: sum(probe.passes.values()) >= done + 2 * SlowRemovalProbe.PASSES)
        assert (probe.tries, probe.removed) == (2, ["sandbox-1"])


class UnloadableCriProbe(CriProbe):
    """Nodes whose CRI client cannot load, as on a machine without the compiled CRI API (or
    grpc): each run fails the way CriPodRunner's loading does."""

    def __init__(self, api_dir: Path) -> None:
        super().__init__([])
        self.api_dir = api_dir

    def run_pod(self, node: str, request: ContainerRequest) -> PodOutcome:
        load_protocol(self.api_dir)
        raise AssertionError("the protocol loaded from an empty directory")


def test_a_cri_client_that_cannot_load_is_the_pods_warning_and_the_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The pod waits as the kubelet reports a sandbox it could not make (ContainerCreating,
    no message) with a FailedCreatePodSandBox Warning saying why, which the control plane
    also logs: no pod stays ContainerCreating with the cause nowhere a user looks."""
    probe = UnloadableCriProbe(tmp_path)
    cause = f"the compiled CRI API is missing ({tmp_path / 'api_pb2.py'})"
    with (
        caplog.at_level(logging.WARNING, logger="rollout.lab.simulation"),
        ControlPlane.start(lab_description(), probe, port=0, timings=FAST) as plane,
    ):
        core = client.CoreV1Api(client.ApiClient(client.Configuration(host=plane.url)))
        wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
        pod = gpu_pod(
            "smoke",
            1,
            runtimeClassName="nvidia",
            container={"command": ["sh", "-c", "nvidia-smi -L"]},
        )
        core.create_namespaced_pod("default", pod)

        def warned() -> list[client.CoreV1Event]:
            events = core.list_namespaced_event("default").items
            return [e for e in events if e.involved_object.name == "smoke" and e.type == "Warning"]

        (warning, *_) = wait_for(warned)
        assert warning.reason == "FailedCreatePodSandBox"
        assert warning.message.startswith(f"Failed to create pod sandbox: {cause}: run scripts/")
        read = core.read_namespaced_pod("smoke", "default").status
        waiting = read.container_statuses[0].state.waiting
        assert (read.phase, waiting.reason, waiting.message) == (
            "Pending",
            "ContainerCreating",
            None,
        )
    logged = [r.getMessage() for r in caplog.records if "FailedCreatePodSandBox" in r.getMessage()]
    assert logged and logged[0].startswith(
        f"kubelet lab-node-1: pod default/smoke: FailedCreatePodSandBox: Failed to create pod "
        f"sandbox: {cause}"
    )
