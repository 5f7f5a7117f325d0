"""What the simulated kubelet asks of a lab node: is it up, is containerd active, which runtime
handlers the running containerd has; and the node's toolkit unit, which the kubelet starts
and stops as the toolkit pod comes and goes.

A node is alive while its systemd-nspawn runs (<node dir>/nspawn.pid, rewritten at each boot);
containerd is active while the running-config record exists (written by the containerd
unit's ExecStartPost, removed by its ExecStopPost). A node that died without stopping its
containerd leaves its record behind: the probe removes it, as the node's next boot would.
"""

from __future__ import annotations

import itertools
import logging
import threading
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from rollout.containerd.runtimehandlers import list_runtime_handlers
from rollout.lab.cri import ContainerRequest, CriPodRunner, PodOutcome
from rollout.lab.description import LabDescription
from rollout.lab.toolkit import TOOLKIT_UNIT
from rollout.transports.local import LocalRunner

log = logging.getLogger("rollout.lab.simulation")

# Written by the lab's containerd unit drop-in at each start, removed at stop: the
# `containerd config dump` of the configuration the running daemon loaded.
RUNNING_CONFIG_PATH = Path("var/lib/rollout-lab/containerd-running.toml")
# Beside the node's root (<node dir>/merged): the pid of the nspawn of the current boot.
NSPAWN_PID_NAME = "nspawn.pid"
TOOLKIT_TIMEOUT_S = 120.0
# A smoke pod's nvidia-smi answers in well under a second; a hung one is killed.
NODE_COMMAND_TIMEOUT_S = 30.0

ToolkitAction = Literal["start", "stop"]


@dataclass(frozen=True)
class RuntimeState:
    """A node as its kubelet would find it."""

    alive: bool
    containerd_active: bool
    # Changes at each boot of the node; None while it is down.
    boot: str | None = None
    # Changes at each start of containerd; None while it is not running.
    containerd_run: str | None = None


DOWN = RuntimeState(alive=False, containerd_active=False)


@dataclass(frozen=True)
class ToolkitOutcome:
    """How one `systemctl start|stop` of the node's toolkit unit ended."""

    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class NodeCommandOutcome:
    """How a container's command, run on its node, ended: exit status and what it printed."""

    exit_code: int
    output: str


class NodeRuntimeProbe(Protocol):
    """The seam between the simulation and real (or fake) node runtimes."""

    def has_handler(self, node: str, handler: str) -> bool:
        """Whether the containerd running on `node` now has runtime handler `handler`."""
        ...

    def state(self, node: str) -> RuntimeState:
        """Whether the node is up and its containerd active."""
        ...

    def run_toolkit(self, node: str, action: ToolkitAction) -> ToolkitOutcome:
        """Start or stop the node's toolkit unit; blocks until systemd has done it."""
        ...

    def run_in_node(
        self, node: str, argv: Sequence[str], env: Mapping[str, str]
    ) -> NodeCommandOutcome | None:
        """Run a container's command on its node, with the environment the container runtime
        gives it; None where there is no node to run it on (a control plane without nodes)."""
        ...

    def runs_pods(self, node: str) -> bool:
        """Whether `node` has a containerd whose CRI runs pods (run_pod)."""
        ...

    def run_pod(self, node: str, request: ContainerRequest) -> PodOutcome:
        """Run a pod's one container to its end through the node's CRI (rollout.lab.cri)."""
        ...

    def remove_pod_sandbox(self, node: str, sandbox_id: str) -> None:
        """Stop and remove a pod's sandbox on the node (its pod was deleted)."""
        ...


def handlers_in_dump(dump: Mapping[str, Any]) -> set[str]:
    """Runtime handler names in a parsed `containerd config dump` (1.x or 2.x layout)."""
    return set(list_runtime_handlers(dump))


class RunningConfigProbe:
    """Reads each node's state from this host: its nspawn, its running-config record."""

    def __init__(self, roots: Mapping[str, Path]) -> None:
        self._roots = dict(roots)

    @classmethod
    def from_lab(cls, lab: LabDescription) -> RunningConfigProbe:
        return cls({n.name: n.root for n in lab.nodes if n.root is not None})

    def has_handler(self, node: str, handler: str) -> bool:
        root = self._roots.get(node)
        if root is None:
            return False
        try:
            text = (root / RUNNING_CONFIG_PATH).read_text()
        except FileNotFoundError:
            return False  # containerd is not running
        except OSError as error:
            log.warning("cannot read the running containerd config of %s: %s", node, error)
            return False
        try:
            dump = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            # Caught mid-write by the unit drop-in; the next tick reads it whole.
            log.debug("running containerd config of %s not parseable yet: %s", node, error)
            return False
        return handler in handlers_in_dump(dump)

    def state(self, node: str) -> RuntimeState:
        root = self._roots.get(node)
        if root is None:
            return DOWN
        leader = _container_leader(root.parent / NSPAWN_PID_NAME)
        record = root / RUNNING_CONFIG_PATH
        if leader is None:
            if record.is_file():
                log.info("%s is down: removing its stale running-config record", node)
                record.unlink(missing_ok=True)
            return DOWN
        try:
            stat = record.stat()
        except FileNotFoundError:
            return RuntimeState(alive=True, containerd_active=False, boot=leader)
        return RuntimeState(
            alive=True,
            containerd_active=True,
            boot=leader,
            containerd_run=f"{stat.st_ino}:{stat.st_mtime_ns}",
        )

    def run_toolkit(self, node: str, action: ToolkitAction) -> ToolkitOutcome:
        enter = self._enter(node)
        if enter is None:
            return ToolkitOutcome(False, f"{node} is not running")
        argv = [*enter, "systemctl", action, TOOLKIT_UNIT]
        result = LocalRunner().run(argv, timeout_s=TOOLKIT_TIMEOUT_S)
        detail = (result.stderr or result.stdout).strip()
        return ToolkitOutcome(result.ok, detail[-500:])

    def run_in_node(
        self, node: str, argv: Sequence[str], env: Mapping[str, str]
    ) -> NodeCommandOutcome | None:
        if node not in self._roots:
            return None
        enter = self._enter(node)
        if enter is None:
            return NodeCommandOutcome(128, f"{node} is not running\n")
        variables = [f"{key}={value}" for key, value in env.items()]
        command = [*enter, "env", *variables, *argv]
        result = LocalRunner().run(command, timeout_s=NODE_COMMAND_TIMEOUT_S)
        return NodeCommandOutcome(result.exit_code, result.stdout + result.stderr)

    def runs_pods(self, node: str) -> bool:
        return node in self._roots

    def run_pod(self, node: str, request: ContainerRequest) -> PodOutcome:
        root = self.proc_root(node)
        if root is None:
            return PodOutcome(None, reason="FailedCreatePodSandBox", message=f"{node} is down")
        return CriPodRunner(root).run(request)

    def remove_pod_sandbox(self, node: str, sandbox_id: str) -> None:
        root = self.proc_root(node)
        if root is not None:
            CriPodRunner(root).remove_sandbox(sandbox_id)

    def proc_root(self, node: str) -> Path | None:
        """The node's root as its own processes see it (its /run is the node's tmpfs)."""
        init = self._container_init(node)
        return Path(f"/proc/{init}/root") if init else None

    def _enter(self, node: str) -> list[str] | None:
        """The nsenter words that run a command inside the node's container; None while the
        node is not running."""
        init = self._container_init(node)
        return None if init is None else ["nsenter", f"--target={init}", "--all"]

    def _container_init(self, node: str) -> str | None:
        """The pid of the init of the node's container; None while the node is not running."""
        root = self._roots.get(node)
        leader = _container_leader(root.parent / NSPAWN_PID_NAME) if root else None
        return None if leader is None else leader.split(":")[1]


def _container_leader(pid_file: Path) -> str | None:
    """ "<nspawn pid>:<container init pid>" while the node's nspawn runs its container."""
    try:
        pid = int(pid_file.read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except (OSError, ValueError):
        return None
    if b"systemd-nspawn" not in cmdline.split(b"\0")[0] or not children:
        return None
    return f"{pid}:{children[0]}"


class FixedRuntimeProbe:
    """Handlers set by hand: for tests and for a control plane run without lab nodes."""

    def __init__(self, handlers: Mapping[str, Iterable[str]] | None = None) -> None:
        self._lock = threading.Lock()
        self._handlers = {node: set(names) for node, names in (handlers or {}).items()}
        self._states: dict[str, RuntimeState] = {}
        self._runs = itertools.count(1)
        self.toolkit_calls: list[tuple[str, ToolkitAction]] = []

    @classmethod
    def with_nvidia(cls, nodes: Iterable[str]) -> FixedRuntimeProbe:
        return cls({node: {"runc", "nvidia"} for node in nodes})

    def set_handlers(self, node: str, handlers: Iterable[str]) -> None:
        with self._lock:
            self._handlers[node] = set(handlers)

    def has_handler(self, node: str, handler: str) -> bool:
        with self._lock:
            return handler in self._handlers.get(node, set())

    def set_state(self, node: str, *, alive: bool = True, containerd_active: bool = True) -> None:
        """Take a node or its containerd down or up; containerd gets a new run when it starts."""
        with self._lock:
            old = self._states.get(node) or self._default_state()
            boot = (
                old.boot if alive and old.alive else (f"boot-{next(self._runs)}" if alive else None)
            )
            active = alive and containerd_active
            run = old.containerd_run if active and old.containerd_active else None
            if active and run is None:
                run = f"run-{next(self._runs)}"
            self._states[node] = RuntimeState(alive, active, boot, run)

    def state(self, node: str) -> RuntimeState:
        with self._lock:
            return self._states.setdefault(node, self._default_state())

    def run_toolkit(self, node: str, action: ToolkitAction) -> ToolkitOutcome:
        """Like the real unit: the toolkit's SIGHUP gives containerd a new run."""
        with self._lock:
            self.toolkit_calls.append((node, action))
            old = self._states.get(node) or self._default_state()
            if not old.alive:
                return ToolkitOutcome(False, f"{node} is not running")
            self._states[node] = RuntimeState(True, True, old.boot, f"run-{next(self._runs)}")
            return ToolkitOutcome(True)

    def run_in_node(
        self, node: str, argv: Sequence[str], env: Mapping[str, str]
    ) -> NodeCommandOutcome | None:
        """No node to run it on."""
        return None

    def runs_pods(self, node: str) -> bool:
        """No node: pods run as the description says (the kubelet's stand-in)."""
        return False

    def run_pod(self, node: str, request: ContainerRequest) -> PodOutcome:
        raise NotImplementedError("FixedRuntimeProbe runs no pods (runs_pods is False)")

    def remove_pod_sandbox(self, node: str, sandbox_id: str) -> None:
        raise NotImplementedError("FixedRuntimeProbe runs no pods (runs_pods is False)")

    def _default_state(self) -> RuntimeState:
        return RuntimeState(True, True, "boot-0", f"run-{next(self._runs)}")
