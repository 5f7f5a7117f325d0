"""The lab runs the Job pods of the rollout image for real.

A pod of a Job whose one container runs the command `rollout` from an image named `rollout`
(`REPO/rollout@sha256:...`, as `rollout schedule --image` takes it) is claimed here before
the scheduler sees it and bound to the pseudo node `LAB_HOST_NODE`: no simulated kubelet
touches it, and no drain of a lab node evicts the run that drains it (a cluster runs it on a
node it does not change). A runner starts it:

- in a lab with nodes, as the image's container in the last node's containerd, through its
  CRI (containerruns.py): the pod's read-only root file system, runAsUser/runAsGroup, host
  networking (the lab has no pod network);
- in a lab without nodes (the Job controller's fast tests), as a process of the lab host
  under `unshare` (processruns.py).

Either way the pod's files are staged as the kubelet stages them: the ServiceAccount's token
(a TokenRequest of the pod's account), the lab CA and the namespace at
/var/run/secrets/kubernetes.io/serviceaccount; each volume at its mountPath (a ConfigMap's
or Secret's keys as files with the volume's defaultMode, group-owned by the pod's fsGroup;
an emptyDir as an empty directory). KUBERNETES_SERVICE_HOST/PORT point at the lab API over
HTTPS with the lab CA and RBAC (podservice.py). Under a test's scaled clock
(cronjobs.ScaledClock) the run's window checks read the same clock as the CronJob that
started it: the clock is kept in a file mounted read-only into the pod and named by
$ROLLOUT_TEST_CLOCK_FILE (rollout/testclock.py, the product's test-only seam).

The pod's phase follows the container (Running, then Succeeded or Failed with its exit code),
its output reaches `pods/log`, and a pod deleted while it runs (by hand, or the Job's
activeDeadlineSeconds) gets SIGTERM, then SIGKILL once its grace period has passed.
"""

from __future__ import annotations

import base64
import functools
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CONFIGMAPS, PODS, SECRETS
from rollout.lab.cri.pods import ContainerSecurity
from rollout.lab.description import LabDescription
from rollout.lab.simulation.containerruns import ContainerRunner
from rollout.lab.simulation.cronjobs import ScaledClock
from rollout.lab.simulation.jobpodspec import (
    JobPodLaunch,
    PodNotRunnable,
    PodRun,
    PodRunner,
    StagedMount,
)
from rollout.lab.simulation.pods import is_deleting, is_terminal, node_of
from rollout.lab.simulation.podservice import PodService
from rollout.lab.simulation.podstatus import set_running, set_terminated, set_waiting
from rollout.lab.simulation.probe import NodeRuntimeProbe, RunningConfigProbe
from rollout.lab.simulation.processruns import ProcessRunner
from rollout.testclock import CLOCK_FILE_ENV

log = logging.getLogger("rollout.lab.simulation.jobpods")

# The node the claimed pods are bound to: none of the lab's nodes, so no kubelet runs them.
LAB_HOST_NODE = "rollout-lab-host"
ROLLOUT_COMMAND = "rollout"
IMAGE_NAME = "rollout"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# where a pod finds the test's clock file, mounted read-only (tests only)
CLOCK_DIR = "/run/rollout-test-clock"
CLOCK_FILE = "now"
DEFAULT_GRACE_S = 30.0
# A pod whose container could not start is tried again after this long, as the kubelet does.
RETRY_S = 10.0


def is_rollout_job_pod(pod: Mapping[str, Any]) -> bool:
    """A pod of a Job whose one container runs `rollout` from an image named rollout."""
    owners = pod["metadata"].get("ownerReferences") or []
    containers = (pod.get("spec") or {}).get("containers") or []
    if not any(o.get("kind") == "Job" for o in owners) or len(containers) != 1:
        return False
    (container,) = containers
    return (container.get("command") or [])[:1] == [ROLLOUT_COMMAND] and image_name(
        str(container.get("image") or "")
    ) == IMAGE_NAME


def image_name(image: str) -> str:
    """The last path component of an image reference, without tag or digest."""
    repository = image.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def job_runner(lab: LabDescription, probe: NodeRuntimeProbe) -> PodRunner | None:
    """Where a lab runs its Job pods: as containers in its last node that runs pods; None
    (processes of the lab host) in a lab without one."""
    if not isinstance(probe, RunningConfigProbe):
        return None
    node = next((n.name for n in reversed(lab.nodes) if probe.runs_pods(n.name)), None)
    if node is None:
        return None
    return ContainerRunner(node, functools.partial(probe.proc_root, node))


@dataclass
class _Tracked:
    """One started pod's run and what the lab follows of it."""

    namespace: str
    name: str
    uid: str
    container: str
    run: PodRun
    staging: Path
    grace_s: float
    clock_text: str = ""


class JobPods:
    """Claims the rollout image's Job pods and runs each with `runner` (default: a process of
    the lab host, for a lab without nodes)."""

    def __init__(
        self,
        registry: Registry,
        host: str,
        clock: Callable[[], float] = time.time,
        runner: PodRunner | None = None,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.runner: PodRunner = runner or ProcessRunner()
        self.service = PodService(registry, host)
        self._running: dict[str, _Tracked] = {}
        # uid -> when a pod whose container did not start may be tried again
        self._retry_at: dict[str, float] = {}

    def claim(self) -> None:
        """Bind the new rollout Job pods to the lab host (before the scheduler runs)."""
        for pod in self.registry.list_objects(PODS):
            if node_of(pod) or is_deleting(pod) or not is_rollout_job_pod(pod):
                continue

            def bind(obj: dict[str, Any]) -> None:
                obj["spec"]["nodeName"] = LAB_HOST_NODE

            metadata = pod["metadata"]
            self.registry.mutate(PODS, metadata["namespace"], metadata["name"], bind)

    def sync(self) -> None:
        """Start the claimed pods, follow their runs, stop those of deleted pods."""
        now = time.monotonic()
        for pod in self.registry.list_objects(PODS):
            if node_of(pod) != LAB_HOST_NODE or is_terminal(pod) or is_deleting(pod):
                continue
            uid = pod["metadata"]["uid"]
            if uid not in self._running and self._retry_at.get(uid, now) <= now:
                self._start(pod)
        for uid, tracked in list(self._running.items()):
            if self._follow(tracked):
                del self._running[uid]

    def close(self) -> None:
        """Stop every run (TERM, then KILL) and the pods' API endpoint."""
        for tracked in self._running.values():
            tracked.run.close()
        self._running.clear()
        self.service.close()

    # ------------------------------------------------------------------- start

    def _start(self, pod: dict[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        namespace, name, uid = metadata["namespace"], metadata["name"], metadata["uid"]
        (container,) = spec["containers"]
        staging: Path | None = None
        try:
            staging = self.runner.staging(uid)
            launch = self._launch(pod, container, staging)
            run = self.runner.start(launch)
        except PodNotRunnable as refused:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            reason, message, now = refused.reason, str(refused), self.clock()
            self._write(pod, lambda p: set_waiting(p, reason, message, now))
            return
        grace = float(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
        tracked = _Tracked(namespace, name, uid, container["name"], run, staging, grace)
        self._running[uid] = tracked
        self._keep_clock(tracked)
        log.info("job pod %s/%s: started: %s", namespace, name, " ".join(launch.command))
        self._write(pod, lambda p: set_running(p, "127.0.0.1", None, self.clock()))

    def _launch(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], staging: Path
    ) -> JobPodLaunch:
        """The pod's container with its files staged under `staging`."""
        metadata, spec = pod["metadata"], pod["spec"]
        host, port, _ = self.service.address()
        env = {
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": str(port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        }
        for item in container.get("env") or []:
            if "value" in item:
                env[str(item["name"])] = str(item["value"])
        mounts = self._stage(pod, container, staging)
        if isinstance(self.clock, ScaledClock):  # tests: the window checks on the lab's clock
            clock_dir = staging / "clock"
            clock_dir.mkdir(mode=0o755)
            mounts.append(StagedMount(clock_dir, CLOCK_DIR, True))
            env[CLOCK_FILE_ENV] = f"{CLOCK_DIR}/{CLOCK_FILE}"
        return JobPodLaunch(
            namespace=str(metadata["namespace"]),
            name=str(metadata["name"]),
            uid=str(metadata["uid"]),
            container=str(container["name"]),
            image=str(container.get("image") or ""),
            command=[*(container.get("command") or []), *(container.get("args") or [])],
            env=env,
            mounts=tuple(mounts),
            staging=staging,
            security=container_security(spec, container),
        )

    def _stage(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], staging: Path
    ) -> list[StagedMount]:
        """The pod's files under `staging`, a mount for each."""
        namespace, spec = pod["metadata"]["namespace"], pod["spec"]
        account = str(spec.get("serviceAccountName") or "default")
        token = self.service.issue_token(namespace, account)
        if token is None:
            raise PodNotRunnable(
                "CreateContainerConfigError", f'serviceaccount "{account}" not found'
            )
        _, _, ca_pem = self.service.address()
        sa_dir = staging / "serviceaccount"
        files = {"token": token.encode(), "ca.crt": ca_pem, "namespace": namespace.encode()}
        _write_files(sa_dir, files, 0o644, None)
        mounts = [StagedMount(sa_dir, SERVICE_ACCOUNT_DIR, True)]
        volumes = {str(v["name"]): v for v in spec.get("volumes") or []}
        fs_group = (spec.get("securityContext") or {}).get("fsGroup")
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(str(mount["name"]))
            if volume is None:
                raise PodNotRunnable("CreateContainerConfigError", f"no volume {mount['name']}")
            source = staging / "volumes" / str(mount["name"])
            self._stage_volume(namespace, volume, source, fs_group)
            mounts.append(StagedMount(source, str(mount["mountPath"]), bool(mount.get("readOnly"))))
        return mounts

    def _stage_volume(
        self, namespace: str, volume: Mapping[str, Any], source: Path, fs_group: int | None
    ) -> None:
        if "emptyDir" in volume:
            source.mkdir(parents=True)
            source.chmod(0o777)
            return
        # a ConfigMap's data is text, its binaryData and a Secret's data base64
        if "configMap" in volume:
            ref, kind, name = volume["configMap"], CONFIGMAPS, volume["configMap"]["name"]
        elif "secret" in volume:
            ref, kind, name = volume["secret"], SECRETS, volume["secret"]["secretName"]
        else:
            kinds = ", ".join(sorted(k for k in volume if k != "name"))
            raise PodNotRunnable("CreateContainerConfigError", f"volume type {kinds}: not run")
        found = self.registry.find(kind, namespace, str(name))
        if found is None:
            raise PodNotRunnable(
                "CreateContainerConfigError", f'{kind.singular} "{name}" not found'
            )
        text = kind == CONFIGMAPS
        files = {
            k: str(v).encode() if text else base64.b64decode(v)
            for k, v in (found.get("data") or {}).items()
        }
        for key, value in (found.get("binaryData") or {}).items():
            files[key] = base64.b64decode(value)
        _write_files(source, files, int(ref.get("defaultMode", 0o644)), fs_group)

    # ------------------------------------------------------------------- follow

    def _follow(self, tracked: _Tracked) -> bool:
        """One look at a started pod's run; true once it is over (its pod told)."""
        self._pump_log(tracked)
        self._keep_clock(tracked)
        pod = self.registry.find(PODS, tracked.namespace, tracked.name)
        gone = pod is None or pod["metadata"]["uid"] != tracked.uid or is_deleting(pod)
        if pod is not None and is_deleting(pod):
            # a delete may shorten the grace period (kubectl delete --grace-period)
            asked = pod["metadata"].get("deletionGracePeriodSeconds")
            if asked is not None:
                tracked.grace_s = min(tracked.grace_s, float(asked))
        refused = tracked.run.not_started()
        code = tracked.run.exit_code()
        if refused is None and code is None:
            if gone:
                tracked.run.stop(tracked.grace_s)
            return False
        self._pump_log(tracked)
        tracked.run.close()
        if pod is None or gone:
            return True
        if refused is not None:
            reason, message = refused
            self._retry_at[tracked.uid] = time.monotonic() + RETRY_S
            log.info("job pod %s/%s: %s: %s", tracked.namespace, tracked.name, reason, message)
            self._write(pod, lambda p: set_waiting(p, reason, message, self.clock()))
            return True
        log.info("job pod %s/%s: exited %d", tracked.namespace, tracked.name, code)
        exit_code = int(code or 0)
        self._write(pod, lambda p: set_terminated(p, self.clock(), exit_code))
        return True

    def _keep_clock(self, tracked: _Tracked) -> None:
        """The lab's scaled clock, as it moves, in the pod's clock file (written whole)."""
        if not isinstance(self.clock, ScaledClock):
            return
        text = self.clock.to_text()
        if text == tracked.clock_text:
            return
        staged = tracked.staging / "clock" / f".{CLOCK_FILE}.new"
        try:
            staged.write_text(text + "\n")
            staged.chmod(0o644)
            staged.replace(staged.with_name(CLOCK_FILE))
        except OSError as error:  # the node went down under the pod: its run says so
            log.info("job pod %s: clock not kept: %s", tracked.name, error)
            return
        tracked.clock_text = text

    def _pump_log(self, tracked: _Tracked) -> None:
        text = tracked.run.read_output()
        if not text:
            return
        try:
            self.registry.write_log(tracked.namespace, tracked.name, tracked.container, text)
        except Exception:  # the pod may be gone: its log goes with it
            log.debug("job pod %s/%s: log not kept", tracked.namespace, tracked.name)

    def _write(self, pod: Mapping[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
        metadata = pod["metadata"]
        self.registry.mutate(PODS, metadata["namespace"], metadata["name"], change)


def _write_files(
    directory: Path, files: Mapping[str, bytes], mode: int, fs_group: int | None
) -> None:
    """The files, with `mode`; group-owned by the pod's fsGroup when it has one, as the
    kubelet leaves a volume (so a non-root container reads a 0440 Secret)."""
    directory.mkdir(parents=True, exist_ok=True)
    for key, data in files.items():
        path = directory / key
        path.write_bytes(data)
        path.chmod(mode)
        if fs_group is not None:
            os.chown(path, 0, int(fs_group))
    if fs_group is not None:
        os.chown(directory, 0, int(fs_group))


def container_security(spec: Mapping[str, Any], container: Mapping[str, Any]) -> ContainerSecurity:
    """The container's securityContext over its pod's, as the kubelet merges them for the
    CRI: runAsUser/runAsGroup and seccompProfile from either (the container's first);
    readOnlyRootFilesystem, capabilities and allowPrivilegeEscalation are the container's."""
    pod_context = spec.get("securityContext") or {}
    own = container.get("securityContext") or {}

    def setting(key: str) -> Any:
        return own.get(key, pod_context.get(key))

    def number(key: str) -> int | None:
        value = setting(key)
        return None if value is None else int(value)

    seccomp = setting("seccompProfile") or {}
    return ContainerSecurity(
        run_as_user=number("runAsUser"),
        run_as_group=number("runAsGroup"),
        read_only_root=bool(own.get("readOnlyRootFilesystem")),
        drop_capabilities=tuple(str(c) for c in (own.get("capabilities") or {}).get("drop") or ()),
        no_new_privileges=own.get("allowPrivilegeEscalation") is False,
        seccomp_runtime_default=seccomp.get("type") == "RuntimeDefault",
    )
