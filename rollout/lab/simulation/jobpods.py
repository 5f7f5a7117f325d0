"""The lab runs the Job pods of the rollout image for real: as a process on the lab's host.

The lab builds no OCI images, so a scheduled run's pod (`rollout schedule`'s CronJob) cannot
run in a container. Its entrypoint can: a pod of a Job whose one container runs the command
`rollout` from an image named `rollout` (`REPO/rollout@sha256:...`, as `rollout schedule
--image` takes it) is claimed here before the scheduler sees it, bound to the pseudo node
`LAB_HOST_NODE` (so no simulated kubelet touches it), and run as the lab host's own rollout
(`python -m rollout` of the interpreter running the lab) with the container's args and env,
in a private mount and UTS namespace (`unshare`) where

- the ServiceAccount's token (a TokenRequest of the pod's account), the lab CA and the
  namespace are at /var/run/secrets/kubernetes.io/serviceaccount, as the kubelet projects
  them;
- each volume is at its mountPath: a ConfigMap's or Secret's keys as files (with the volume's
  defaultMode), an emptyDir as an empty directory; a mount point missing on the host is made
  inside an overlay of its nearest existing parent (nothing is written on the host);
- the host name is the pod's name, as in a pod;
- KUBERNETES_SERVICE_HOST/PORT point at the lab API over HTTPS with the lab CA and RBAC
  (podservice.py);
- under a test's scaled clock (cronjobs.ScaledClock), the run's window checks read the same
  clock as the CronJob that started it (podclock.py).

The pod's phase follows the process (Running, then Succeeded or Failed with its exit code),
its output reaches `pods/log`, and a pod deleted while it runs (by hand, or the Job's
activeDeadlineSeconds) gets SIGTERM, then SIGKILL once its grace period has passed. The
process runs as the lab's user (root), not the pod's runAsUser.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CONFIGMAPS, PODS, SECRETS
from rollout.lab.simulation.cronjobs import ScaledClock
from rollout.lab.simulation.podclock import POD_CLOCK_DIR, POD_CLOCK_ENV
from rollout.lab.simulation.pods import is_deleting, is_terminal, node_of
from rollout.lab.simulation.podservice import PodService
from rollout.lab.simulation.podstatus import set_running, set_terminated, set_waiting

log = logging.getLogger("rollout.lab.simulation.jobpods")

# The node the claimed pods are bound to: none of the lab's nodes, so no kubelet runs them.
LAB_HOST_NODE = "rollout-lab-host"
ROLLOUT_COMMAND = "rollout"
IMAGE_NAME = "rollout"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_GRACE_S = 30.0
# a private mount namespace (the volumes) and host name (the pod's), nothing else
UNSHARE = ("unshare", "--mount", "--uts", "--propagation", "private", "--")
# A process that does not exit on SIGKILL is the kernel's business; stop waiting after this.
KILL_WAIT_S = 5.0


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


@dataclass
class _Process:
    """One running pod's process and what its end must clean up."""

    namespace: str
    name: str
    uid: str
    container: str
    popen: subprocess.Popen[bytes]
    staging: Path
    log_path: Path
    grace_s: float
    log_offset: int = 0
    term_sent_at: float | None = None
    done: bool = field(default=False)


class JobPods:
    """Claims the rollout image's Job pods and runs each as a process on the lab host."""

    def __init__(
        self, registry: Registry, host: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.service = PodService(registry, host)
        self._running: dict[str, _Process] = {}

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
        """Start the claimed pods, follow their processes, stop those of deleted pods."""
        for pod in self.registry.list_objects(PODS):
            if node_of(pod) != LAB_HOST_NODE or is_terminal(pod) or is_deleting(pod):
                continue
            if pod["metadata"]["uid"] not in self._running:
                self._start(pod)
        for uid, process in list(self._running.items()):
            self._follow(process)
            if process.done:
                del self._running[uid]

    def close(self) -> None:
        """Stop every process (TERM, then KILL) and the pods' API endpoint."""
        for process in self._running.values():
            _signal(process, signal.SIGTERM)
        deadline = time.monotonic() + KILL_WAIT_S
        for process in self._running.values():
            try:
                process.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(process, signal.SIGKILL)
                process.popen.wait(timeout=KILL_WAIT_S)
            shutil.rmtree(process.staging, ignore_errors=True)
        self._running.clear()
        self.service.close()

    # ------------------------------------------------------------------- start

    def _start(self, pod: dict[str, Any]) -> None:
        metadata, spec = pod["metadata"], pod["spec"]
        namespace, name = metadata["namespace"], metadata["name"]
        (container,) = spec["containers"]
        staging = Path(tempfile.mkdtemp(prefix="rollout-lab-jobpod-"))
        try:
            mounts = self._stage(pod, container, staging)
            mirror = self.clock.mirror if isinstance(self.clock, ScaledClock) else None
            if mirror is not None:  # tests: the lab's clock, as it moves
                mounts.append((mirror.parent, POD_CLOCK_DIR, True))
            script = _namespace_script(name, mounts, staging)
        except _PodNotRunnable as refused:
            shutil.rmtree(staging, ignore_errors=True)
            reason, message, now = refused.reason, str(refused), self.clock()
            self._write(pod, lambda p: set_waiting(p, reason, message, now))
            return
        host, port, _ = self.service.address()
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOSTNAME": name,
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": str(port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(port),
        }
        for item in container.get("env") or []:
            if "value" in item:
                env[str(item["name"])] = str(item["value"])
        module = "rollout"
        if isinstance(self.clock, ScaledClock):  # tests: the window checks on the lab's clock
            module = "rollout.lab.simulation.podclock"
            env[POD_CLOCK_ENV] = (
                f"{POD_CLOCK_DIR}/{self.clock.mirror.name}"
                if self.clock.mirror
                else self.clock.to_text()
            )
        command = [sys.executable, "-m", module, *(container.get("command") or [])[1:]]
        command += [str(a) for a in container.get("args") or []]
        log_path = staging / "output.log"
        with log_path.open("wb") as output:
            popen = subprocess.Popen(
                [*UNSHARE, "sh", "-ec", script, "sh", *command],
                env=env,
                cwd="/",
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        grace = float(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
        self._running[metadata["uid"]] = _Process(
            namespace, name, metadata["uid"], container["name"], popen, staging, log_path, grace
        )
        log.info("job pod %s/%s: pid %d: %s", namespace, name, popen.pid, shlex.join(command))
        self._write(pod, lambda p: set_running(p, "127.0.0.1", None, self.clock()))

    def _stage(
        self, pod: Mapping[str, Any], container: Mapping[str, Any], staging: Path
    ) -> list[tuple[Path, str, bool]]:
        """The pod's files under `staging`: (source, mount path, read-only) per mount."""
        namespace, spec = pod["metadata"]["namespace"], pod["spec"]
        account = str(spec.get("serviceAccountName") or "default")
        token = self.service.issue_token(namespace, account)
        if token is None:
            raise _PodNotRunnable(
                "CreateContainerConfigError", f'serviceaccount "{account}" not found'
            )
        _, _, ca_pem = self.service.address()
        sa_dir = staging / "serviceaccount"
        _write_files(
            sa_dir,
            {"token": token.encode(), "ca.crt": ca_pem, "namespace": namespace.encode()},
            0o644,
        )
        mounts = [(sa_dir, SERVICE_ACCOUNT_DIR, True)]
        volumes = {str(v["name"]): v for v in spec.get("volumes") or []}
        for mount in container.get("volumeMounts") or []:
            volume = volumes.get(str(mount["name"]))
            if volume is None:
                raise _PodNotRunnable("CreateContainerConfigError", f"no volume {mount['name']}")
            source = staging / "volumes" / str(mount["name"])
            self._stage_volume(namespace, volume, source)
            mounts.append((source, str(mount["mountPath"]), bool(mount.get("readOnly"))))
        return mounts

    def _stage_volume(self, namespace: str, volume: Mapping[str, Any], source: Path) -> None:
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
            raise _PodNotRunnable("CreateContainerConfigError", f"volume type {kinds}: not run")
        found = self.registry.find(kind, namespace, str(name))
        if found is None:
            raise _PodNotRunnable(
                "CreateContainerConfigError", f'{kind.singular} "{name}" not found'
            )
        text = kind == CONFIGMAPS
        files = {
            k: str(v).encode() if text else base64.b64decode(v)
            for k, v in (found.get("data") or {}).items()
        }
        for key, value in (found.get("binaryData") or {}).items():
            files[key] = base64.b64decode(value)
        _write_files(source, files, int(ref.get("defaultMode", 0o644)))

    # ------------------------------------------------------------------- follow

    def _follow(self, process: _Process) -> None:
        self._pump_log(process)
        pod = self.registry.find(PODS, process.namespace, process.name)
        gone = pod is None or pod["metadata"]["uid"] != process.uid or is_deleting(pod)
        code = process.popen.poll()
        if pod is not None and is_deleting(pod):
            # a delete may shorten the grace period (kubectl delete --grace-period)
            asked = pod["metadata"].get("deletionGracePeriodSeconds")
            if asked is not None:
                process.grace_s = min(process.grace_s, float(asked))
        if code is None and gone:
            now = time.monotonic()
            if process.term_sent_at is None:
                process.term_sent_at = now
                _signal(process, signal.SIGTERM)
            elif now - process.term_sent_at >= process.grace_s:
                _signal(process, signal.SIGKILL)
            return
        if code is None:
            return
        process.done = True
        self._pump_log(process)
        shutil.rmtree(process.staging, ignore_errors=True)
        log.info("job pod %s/%s: exited %d", process.namespace, process.name, code)
        if pod is not None and not gone:
            # killed by a signal: the shell's convention, 128 + the signal
            exit_code = code if code >= 0 else 128 - code
            self._write(pod, lambda p: set_terminated(p, self.clock(), exit_code))

    def _pump_log(self, process: _Process) -> None:
        try:
            with process.log_path.open("rb") as output:
                output.seek(process.log_offset)
                data = output.read()
        except OSError:
            return
        if not data:
            return
        process.log_offset += len(data)
        text = data.decode(errors="replace")
        try:
            self.registry.write_log(process.namespace, process.name, process.container, text)
        except Exception:  # the pod may be gone: its log goes with it
            log.debug("job pod %s/%s: log not kept", process.namespace, process.name)

    def _write(self, pod: Mapping[str, Any], change: Callable[[dict[str, Any]], None]) -> None:
        metadata = pod["metadata"]
        self.registry.mutate(PODS, metadata["namespace"], metadata["name"], change)


class _PodNotRunnable(Exception):
    """What keeps a pod from starting, with the kubelet's waiting reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _write_files(directory: Path, files: Mapping[str, bytes], mode: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for key, data in files.items():
        path = directory / key
        path.write_bytes(data)
        path.chmod(mode)


def _signal(process: _Process, number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.popen.pid, number)


def _entrypoint_paths() -> list[Path]:
    """What the image's entrypoint runs from on this host (the interpreter's prefixes and the
    tree rollout is imported from), outermost only: in a pod these are the image's own files,
    never under a volume."""
    found = [Path(sys.prefix), Path(sys.base_prefix), Path(__file__).resolve().parents[3]]
    resolved = sorted({p.resolve() for p in found}, key=lambda p: len(p.parts))
    outermost: list[Path] = []
    for path in resolved:
        if not any(path == o or o in path.parents for o in outermost):
            outermost.append(path)
    return outermost


def _namespace_script(hostname: str, mounts: list[tuple[Path, str, bool]], staging: Path) -> str:
    """The shell run inside the new namespaces: host name, overlays, bind mounts, then the
    command ("$@"). A volume mounted over what the entrypoint runs from (an emptyDir at /tmp
    over a checkout under /tmp) would hide it: such a tree is held open (fd 3 up) before the
    mounts and bound back at its path after them."""
    targets = [Path(target) for _, target, _ in mounts]
    hidden = [
        path for path in _entrypoint_paths() if any(path == t or t in path.parents for t in targets)
    ][:7]
    lines = [f"hostname {shlex.quote(hostname)}"]
    lines += [f"exec {3 + i}<{shlex.quote(str(path))}" for i, path in enumerate(hidden)]
    # a mount over a source's parents (an emptyDir at /tmp) hides the sources below it:
    # those go last
    sources = [staging, *(source for source, _, _ in mounts)]
    mounts = sorted(mounts, key=lambda m: any(_is_under(s, Path(m[1])) for s in sources))
    overlays = staging / "overlays"
    lines.append(f"mkdir -p {shlex.quote(str(overlays))}")
    lines.append(f"mount -t tmpfs rollout-lab-overlays {shlex.quote(str(overlays))}")
    overlaid: list[str] = []
    for index, (source, target, read_only) in enumerate(mounts):
        parent = _existing_parent(target)
        if parent != target and not any(
            parent == o or parent.startswith(o + "/") for o in overlaid
        ):
            if parent == "/":
                raise _PodNotRunnable("CreateContainerError", f"cannot mount at {target}")
            upper, work = overlays / f"upper{index}", overlays / f"work{index}"
            lines.append(f"mkdir -p {shlex.quote(str(upper))} {shlex.quote(str(work))}")
            options = f"lowerdir={parent},upperdir={upper},workdir={work}"
            lines.append(
                f"mount -t overlay overlay -o {shlex.quote(options)} {shlex.quote(parent)}"
            )
            overlaid.append(parent)
        quoted = shlex.quote(target)
        lines.append(f"mkdir -p {quoted}")
        lines.append(f"mount --bind {shlex.quote(str(source))} {quoted}")
        if read_only:
            lines.append(f"mount -o remount,bind,ro {quoted}")
    for i, path in enumerate(hidden):
        quoted = shlex.quote(str(path))
        lines.append(f"mkdir -p {quoted}")
        # not canonicalized: the fd's link names a path the mounts above now hide
        lines.append(f"mount --no-canonicalize --bind /proc/self/fd/{3 + i} {quoted}")
        lines.append(f"exec {3 + i}<&-")
    lines.append('exec "$@"')
    return "\n".join(lines)


def _is_under(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def _existing_parent(target: str) -> str:
    """The target itself when it exists on the host, else its nearest existing ancestor
    (symbolic links resolved: /var/run is /run)."""
    path = Path(target)
    while not path.exists():
        path = path.parent
    return str(path.resolve())
