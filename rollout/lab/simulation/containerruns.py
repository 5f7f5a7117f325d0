"""A Job pod of the rollout image run as the image's container in a lab node's containerd.

As the kubelet runs it, through the node's CRI (rollout.lab.cri): a sandbox with the node's
`nvidia` handler (runc alone cannot start a sandbox in a lab node: docs/lab.md), the image
(pulled into the node through the lab's registry beforehand), the container with the pod's
command, environment, runAsUser/runAsGroup and readOnlyRootFilesystem, and its volumes bound
from the pod's staging in the node (/var/lib/rollout-lab/jobpods/<uid>). The sandbox shares
the node's network (the lab has no pod network); the node's runtime gives the container a
UTS namespace of its own with the pod's name as host name (ROLLOUT_LAB_POD_HOSTNAME), as a
pod has.

A thread per container follows it: ContainerStatus until it exits (an unanswered call, while
the run restarts the node's containerd, is asked again: the container runs on), and, once
the pod is deleted, StopContainer with the grace period as its timeout (SIGTERM, SIGKILL
when it passes). Its output is read from the CRI log file as it grows.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rollout.errors import RolloutError
from rollout.lab.cri import ContainerRequest, CriPodRunner, PodOutcome, read_cri_log
from rollout.lab.cri.pods import ContainerMount
from rollout.lab.simulation.jobpodspec import JobPodLaunch, PodNotRunnable

log = logging.getLogger("rollout.lab.simulation.jobpods")

# Where, in the node, a pod's files are staged (not /tmp: a node's /tmp is its own tmpfs).
JOBPODS_DIR = "var/lib/rollout-lab/jobpods"
# The handler the lab's pods run with (the toolkit's `nvidia`, as the smoke pods).
HANDLER = "nvidia"
POLL_S = 0.5
# At the lab's end: what a container still running gets before SIGKILL.
CLOSE_GRACE_S = 5
ENV_HOSTNAME = "ROLLOUT_LAB_POD_HOSTNAME"


class ContainerRunner:
    """Starts Job pods as containers in one lab node (`node_root`: its root as its own
    processes see it, None while it is down)."""

    def __init__(self, node: str, node_root: Callable[[], Path | None]) -> None:
        self.node = node
        self._node_root = node_root

    def staging(self, uid: str) -> Path:
        root = self._node_root()
        if root is None:
            raise PodNotRunnable("ContainerCreating", f"node {self.node} is not running")
        staging = root / JOBPODS_DIR / uid
        staging.mkdir(parents=True, exist_ok=True)
        return staging

    def start(self, launch: JobPodLaunch) -> ContainerRun:
        root = self._node_root()
        if root is None:
            raise PodNotRunnable("ContainerCreating", f"node {self.node} is not running")
        in_node = f"/{JOBPODS_DIR}/{launch.uid}"
        mounts = tuple(
            ContainerMount(
                m.target, f"{in_node}/{m.source.relative_to(launch.staging)}", m.read_only
            )
            for m in launch.mounts
        )
        request = ContainerRequest(
            namespace=launch.namespace,
            pod=launch.name,
            uid=launch.uid,
            container=launch.container,
            image=launch.image,
            command=list(launch.command),
            handler=HANDLER,
            env={**launch.env, ENV_HOSTNAME: launch.name},
            security=launch.security,
            mounts=mounts,
        )
        log.info("job pod %s/%s: a container in %s", launch.namespace, launch.name, self.node)
        return ContainerRun(CriPodRunner(root), request, launch.staging)


class ContainerRun:
    """One pod's container, followed by a thread of its own."""

    def __init__(self, cri: CriPodRunner, request: ContainerRequest, staging: Path) -> None:
        self._cri = cri
        self._request = request
        self._staging = staging
        self._outcome: PodOutcome | None = None
        self._exit: int | None = None
        self._stop_grace_s: float | None = None
        self._log_offset = 0
        self._thread = threading.Thread(
            target=self._follow, name=f"jobpod-{request.pod}", daemon=True
        )
        self._thread.start()

    def exit_code(self) -> int | None:
        return self._exit

    def not_started(self) -> tuple[str, str] | None:
        outcome = self._outcome
        if outcome is None or outcome.started:
            return None
        return outcome.reason, outcome.message

    def read_output(self) -> str:
        raw = self._cri.read_log(self._request)[self._log_offset :]
        complete = raw[: raw.rfind("\n") + 1]  # a line still being written waits
        self._log_offset += len(complete)
        return read_cri_log(complete)

    def stop(self, grace_s: float) -> None:
        if self._stop_grace_s is None:
            self._stop_grace_s = grace_s

    def close(self) -> None:
        if self._thread.is_alive():
            self.stop(CLOSE_GRACE_S)
            self._thread.join(timeout=CLOSE_GRACE_S + 30)
        outcome = self._outcome
        if outcome is not None and outcome.sandbox_id is not None:
            try:
                self._cri.remove_sandbox(outcome.sandbox_id)
            except RolloutError as error:  # containerd restarting, the node gone
                log.info("job pod %s: sandbox not removed: %s", self._request.pod, error)
        shutil.rmtree(self._staging, ignore_errors=True)

    def _follow(self) -> None:
        try:
            outcome = self._cri.start(self._request)
        except RolloutError as error:  # the compiled CRI API is missing on this host
            outcome = PodOutcome(None, reason="RunContainerError", message=str(error))
        self._outcome = outcome
        container = outcome.container_id
        if not outcome.started or container is None:
            return
        stopped = False
        while True:
            grace = self._stop_grace_s
            try:
                if grace is not None and not stopped:
                    # returns once the container has exited, SIGKILLed after the timeout
                    self._cri.stop_container(container, max(0, round(grace)))
                    stopped = True
                code = self._cri.container_exit(container)
            except RolloutError as error:  # containerd restarting: the container runs on
                log.debug("job pod %s: %s", self._request.pod, error)
                code = None
            if code is not None:
                self._exit = code
                return
            time.sleep(POLL_S)
