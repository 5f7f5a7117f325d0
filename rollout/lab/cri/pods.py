"""Run one pod's container through a node's containerd, as the kubelet's runtime manager does.

The sandbox shares the node's network namespace: the lab's nodes have no CNI plugin, and a
pod in the node's network needs none (the kubelet asks the same for hostNetwork pods).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.errors import RolloutError
from rollout.lab.cri.protocol import Protocol, load_protocol

SOCKET = "run/containerd/containerd.sock"
LOG_ROOT = "/var/log/pods"
RPC_TIMEOUT_S = 30.0
PULL_TIMEOUT_S = 60.0
POLL_S = 0.05
# The runtime's own stop grace for a smoke container that has not exited yet.
STOP_TIMEOUT_S = 2
# What a container stopped for running too long ends with (SIGKILL's 128 + 9).
HUNG_EXIT = 137


class CriCallFailed(RolloutError):
    """A CRI call failed (containerd down, a sandbox gone)."""


@dataclass(frozen=True)
class ContainerMount:
    """A directory of the node (host_path, as the node sees it) at container_path."""

    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSecurity:
    """A container's securityContext as the kubelet hands it to the CRI: runAsUser and
    runAsGroup (None: the image's USER), readOnlyRootFilesystem, the capabilities dropped
    (`ALL` as written), allowPrivilegeEscalation false (no_new_privs) and a RuntimeDefault
    seccomp profile; unset, each is containerd's default (none dropped, unconfined)."""

    run_as_user: int | None = None
    run_as_group: int | None = None
    read_only_root: bool = False
    drop_capabilities: tuple[str, ...] = ()
    no_new_privileges: bool = False
    seccomp_runtime_default: bool = False


@dataclass(frozen=True)
class ContainerRequest:
    """One pod with one container to run to completion."""

    namespace: str
    pod: str
    uid: str
    container: str
    image: str
    command: Sequence[str]
    # The pod's runtimeClassName (its runtime handler); None: containerd's default.
    handler: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    # A new sandbox for each try of the same pod (its name must be new to containerd) ...
    attempt: int = 0
    # ... but for a try after a failed pull, which runs in the sandbox that pull left (as the
    # kubelet retries only the pull); that sandbox's attempt is `attempt`.
    sandbox_id: str | None = None
    wait_s: float = 30.0
    security: ContainerSecurity = ContainerSecurity()
    # its volumes, staged in the node
    mounts: Sequence[ContainerMount] = ()

    @property
    def log_directory(self) -> str:
        return f"{LOG_ROOT}/{self.namespace}_{self.pod}_{self.uid}"

    @property
    def log_path(self) -> str:
        """The container's log file inside the node."""
        return f"{self.log_directory}/{self.container}/{self.attempt}.log"


@dataclass(frozen=True)
class PodOutcome:
    """How the pod's container ended, or why it never started.

    reason is the kubelet's word for a container that never started (FailedCreatePodSandBox,
    ErrImagePull, CreateContainerError, RunContainerError), with containerd's message."""

    sandbox_id: str | None
    exit_code: int = 0
    output: str = ""
    reason: str = ""
    message: str = ""
    # the started container, when it was only started (CriPodRunner.start)
    container_id: str | None = None

    @property
    def started(self) -> bool:
        return not self.reason


class CriPodRunner:
    """The CRI of one node, reached through the node's root as the host sees it."""

    def __init__(self, node_root: Path, protocol: Protocol | None = None) -> None:
        self._root = node_root
        self._protocol = protocol or load_protocol()

    def run(self, request: ContainerRequest) -> PodOutcome:
        """Sandbox, image, container, start; then wait for it to exit and read its log."""
        started = self.start(request)
        if not started.started or started.container_id is None:
            return started
        p = self._protocol
        sandbox = started.sandbox_id
        with p.grpc.insecure_channel(f"unix://{self._root / SOCKET}") as channel:
            runtime = p.services.RuntimeServiceStub(channel)
            try:
                exit_code = self._wait_exit(runtime, started.container_id, request.wait_s)
            except p.grpc.RpcError as error:
                return PodOutcome(sandbox, reason="RunContainerError", message=_rpc(error))
        output = self._read_log(request)
        if exit_code is None:
            late = f"(did not exit within {request.wait_s:g}s: stopped)\n"
            return PodOutcome(sandbox, HUNG_EXIT, output + late)
        return PodOutcome(sandbox, exit_code, output)

    def start(self, request: ContainerRequest) -> PodOutcome:
        """Sandbox, image, container, start: the outcome names the started container
        (container_id), or says why it did not start."""
        p = self._protocol
        api = p.api
        with p.grpc.insecure_channel(f"unix://{self._root / SOCKET}") as channel:
            runtime = p.services.RuntimeServiceStub(channel)
            images = p.services.ImageServiceStub(channel)
            sandbox_config = self._sandbox_config(request)
            try:
                if request.sandbox_id is not None:
                    sandbox = self._ready_sandbox(runtime, request.sandbox_id)
                else:
                    sandbox = runtime.RunPodSandbox(
                        api.RunPodSandboxRequest(
                            config=sandbox_config, runtime_handler=request.handler or ""
                        ),
                        timeout=RPC_TIMEOUT_S,
                    ).pod_sandbox_id
            except p.grpc.RpcError as error:
                return PodOutcome(None, reason="FailedCreatePodSandBox", message=_rpc(error))
            except CriCallFailed as gone:
                return PodOutcome(None, reason="FailedCreatePodSandBox", message=str(gone))
            try:
                self._ensure_image(images, request.image, sandbox_config)
            except p.grpc.RpcError as error:
                return PodOutcome(sandbox, reason="ErrImagePull", message=_rpc(error))
            try:
                container = runtime.CreateContainer(
                    api.CreateContainerRequest(
                        pod_sandbox_id=sandbox,
                        config=self._container_config(request),
                        sandbox_config=sandbox_config,
                    ),
                    timeout=RPC_TIMEOUT_S,
                ).container_id
            except p.grpc.RpcError as error:
                return PodOutcome(sandbox, reason="CreateContainerError", message=_rpc(error))
            try:
                runtime.StartContainer(
                    api.StartContainerRequest(container_id=container), timeout=RPC_TIMEOUT_S
                )
            except p.grpc.RpcError as error:
                return PodOutcome(sandbox, reason="RunContainerError", message=_rpc(error))
        return PodOutcome(sandbox, container_id=container)

    def container_exit(self, container_id: str) -> int | None:
        """The container's exit status once it has exited, None while it runs; CriCallFailed
        when containerd does not answer (restarting: the container itself runs on)."""
        p = self._protocol
        api = p.api
        with p.grpc.insecure_channel(f"unix://{self._root / SOCKET}") as channel:
            runtime = p.services.RuntimeServiceStub(channel)
            try:
                status = runtime.ContainerStatus(
                    api.ContainerStatusRequest(container_id=container_id), timeout=RPC_TIMEOUT_S
                ).status
            except p.grpc.RpcError as error:
                raise CriCallFailed(f"container {container_id[:12]}: {_rpc(error)}") from error
        return int(status.exit_code) if status.state == api.CONTAINER_EXITED else None

    def stop_container(self, container_id: str, timeout_s: int) -> None:
        """StopContainer, as the kubelet stops a deleted pod's container: SIGTERM, then
        SIGKILL once `timeout_s` (its grace period) has passed; returns once it has exited."""
        p = self._protocol
        with p.grpc.insecure_channel(f"unix://{self._root / SOCKET}") as channel:
            runtime = p.services.RuntimeServiceStub(channel)
            try:
                runtime.StopContainer(
                    p.api.StopContainerRequest(container_id=container_id, timeout=timeout_s),
                    timeout=timeout_s + RPC_TIMEOUT_S,
                )
            except p.grpc.RpcError as error:
                raise CriCallFailed(f"stopping {container_id[:12]}: {_rpc(error)}") from error

    def read_log(self, request: ContainerRequest) -> str:
        """The container's log file as written so far (the raw CRI lines); '' when absent."""
        try:
            return (self._root / request.log_path.lstrip("/")).read_text(errors="replace")
        except OSError:
            return ""

    def remove_sandbox(self, sandbox_id: str) -> None:
        """Stop and remove a pod's sandbox and its containers (the pod was deleted)."""
        p = self._protocol
        with p.grpc.insecure_channel(f"unix://{self._root / SOCKET}") as channel:
            runtime = p.services.RuntimeServiceStub(channel)
            try:
                runtime.StopPodSandbox(
                    p.api.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=RPC_TIMEOUT_S
                )
                runtime.RemovePodSandbox(
                    p.api.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id),
                    timeout=RPC_TIMEOUT_S,
                )
            except p.grpc.RpcError as error:
                raise CriCallFailed(f"removing sandbox {sandbox_id[:12]}: {_rpc(error)}") from error

    def _ready_sandbox(self, runtime: Any, sandbox_id: str) -> str:
        """`sandbox_id`, while containerd still has it ready (a restart or a reboot took it
        down: the kubelet then starts over in a new one)."""
        api = self._protocol.api
        status = runtime.PodSandboxStatus(
            api.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id), timeout=RPC_TIMEOUT_S
        ).status
        if status.state != api.SANDBOX_READY:
            raise CriCallFailed(f"sandbox {sandbox_id[:12]} is no longer ready")
        return sandbox_id

    def _sandbox_config(self, request: ContainerRequest) -> Any:
        api = self._protocol.api
        node_network = api.NamespaceOption(network=api.NODE, pid=api.CONTAINER, ipc=api.POD)
        return api.PodSandboxConfig(
            metadata=api.PodSandboxMetadata(
                name=request.pod,
                uid=request.uid,
                namespace=request.namespace,
                attempt=request.attempt,
            ),
            log_directory=request.log_directory,
            labels={
                "io.kubernetes.pod.name": request.pod,
                "io.kubernetes.pod.namespace": request.namespace,
                "io.kubernetes.pod.uid": request.uid,
            },
            linux=api.LinuxPodSandboxConfig(
                security_context=api.LinuxSandboxSecurityContext(namespace_options=node_network)
            ),
        )

    def _container_config(self, request: ContainerRequest) -> Any:
        api = self._protocol.api
        return api.ContainerConfig(
            metadata=api.ContainerMetadata(name=request.container, attempt=request.attempt),
            image=api.ImageSpec(image=request.image),
            command=list(request.command),
            envs=[api.KeyValue(key=k, value=v.encode()) for k, v in request.env.items()],
            log_path=f"{request.container}/{request.attempt}.log",
            labels={"io.kubernetes.container.name": request.container},
            mounts=[
                api.Mount(
                    container_path=m.container_path, host_path=m.host_path, readonly=m.read_only
                )
                for m in request.mounts
            ],
            linux=api.LinuxContainerConfig(security_context=self._security_context(request)),
        )

    def _security_context(self, request: ContainerRequest) -> Any:
        api, security = self._protocol.api, request.security
        context = api.LinuxContainerSecurityContext(
            readonly_rootfs=security.read_only_root,
            no_new_privs=security.no_new_privileges,
            capabilities=api.Capability(drop_capabilities=list(security.drop_capabilities)),
        )
        if security.run_as_user is not None:
            context.run_as_user.value = security.run_as_user
        if security.run_as_group is not None:
            context.run_as_group.value = security.run_as_group
        if security.seccomp_runtime_default:
            context.seccomp.profile_type = api.SecurityProfile.RuntimeDefault
        return context

    def _ensure_image(self, images: Any, image: str, sandbox_config: Any) -> None:
        """PullImage unless present (the pod's imagePullPolicy: IfNotPresent)."""
        api = self._protocol.api
        spec = api.ImageSpec(image=image)
        status = images.ImageStatus(api.ImageStatusRequest(image=spec), timeout=RPC_TIMEOUT_S)
        if status.image.id:
            return
        images.PullImage(
            api.PullImageRequest(image=spec, sandbox_config=sandbox_config),
            timeout=PULL_TIMEOUT_S,
        )

    def _wait_exit(self, runtime: Any, container: str, wait_s: float) -> int | None:
        """The container's exit status; None when it ran past wait_s and was stopped."""
        api = self._protocol.api
        deadline = time.monotonic() + wait_s
        stopped = False
        while True:
            status = runtime.ContainerStatus(
                api.ContainerStatusRequest(container_id=container), timeout=RPC_TIMEOUT_S
            ).status
            if status.state == api.CONTAINER_EXITED:
                return None if stopped else int(status.exit_code)
            if time.monotonic() > deadline:
                if stopped:
                    return None
                runtime.StopContainer(
                    api.StopContainerRequest(container_id=container, timeout=STOP_TIMEOUT_S),
                    timeout=RPC_TIMEOUT_S,
                )
                stopped = True
                deadline = time.monotonic() + RPC_TIMEOUT_S
            time.sleep(POLL_S)

    def _read_log(self, request: ContainerRequest) -> str:
        try:
            text = (self._root / request.log_path.lstrip("/")).read_text(errors="replace")
        except OSError as error:
            return f"(no container log: {error})\n"
        return read_cri_log(text)


def read_cri_log(text: str) -> str:
    """The container's output from a CRI log file: `<time> <stream> <P|F> <line>` per line,
    P a partial line that the next one continues."""
    output: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        content = parts[3] if len(parts) == 4 else ""
        output.append(content if parts[2] == "P" else content + "\n")
    return "".join(output)


def _rpc(error: Any) -> str:
    """A gRPC error as the kubelet prints it: `rpc error: code = Unknown desc = ...`."""
    code = "".join(word.capitalize() for word in error.code().name.split("_"))
    return f"rpc error: code = {code} desc = {error.details()}"
