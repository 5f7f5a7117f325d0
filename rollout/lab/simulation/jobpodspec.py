"""What the lab starts for a Job pod of the rollout image, whatever runs it (jobpods.py): the
pod's command, environment, securityContext and staged volumes, and the runners' seam."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rollout.lab.cri.pods import ContainerSecurity


class PodNotRunnable(Exception):
    """What keeps a pod from starting, with the kubelet's waiting reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class StagedMount:
    """A staged directory (on the lab host, under the pod's staging) at the pod's path."""

    source: Path
    target: str
    read_only: bool


@dataclass(frozen=True)
class JobPodLaunch:
    """One pod's container to start: its files are staged under `staging` already."""

    namespace: str
    name: str
    uid: str
    container: str
    image: str
    # the container's command and args, as one argv (command[0] is `rollout`)
    command: Sequence[str]
    env: Mapping[str, str]
    mounts: tuple[StagedMount, ...]
    staging: Path
    security: ContainerSecurity


class PodRun(Protocol):
    """A started pod's container, followed by the lab's tick."""

    def exit_code(self) -> int | None:
        """Its exit status once it has ended (128 + a signal that killed it), else None."""
        ...

    def not_started(self) -> tuple[str, str] | None:
        """(the kubelet's waiting reason, the runtime's message) when it could not start."""
        ...

    def read_output(self) -> str:
        """Its output since the last call."""
        ...

    def stop(self, grace_s: float) -> None:
        """The pod was deleted: SIGTERM, then SIGKILL once `grace_s` has passed (called at
        every tick until it has exited)."""
        ...

    def close(self) -> None:
        """Stop it if it still runs, and remove what its start left (staging, sandbox)."""
        ...


class PodRunner(Protocol):
    """Where the lab's Job pods run."""

    def staging(self, uid: str) -> Path:
        """A new directory, on the lab host, for the pod's files (mounted into it)."""
        ...

    def start(self, launch: JobPodLaunch) -> PodRun: ...
