"""A lab Job pod's container followed through a node's CRI (containerruns.py), with a fake
CRI: its exit, its log as it grows, StopContainer with the grace period, containerd
restarting under it. The real path: tests/lab/test_schedule_runs.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.lab.cri import ContainerRequest, PodOutcome
from rollout.lab.cri.pods import CriCallFailed
from rollout.lab.simulation.containerruns import ContainerRun

REQUEST = ContainerRequest("ns", "pod", "uid", "rollout", "r/rollout@sha256:00", ["rollout"])


@dataclass
class FakeCri:
    """A node's CRI: the container exits when stopped (143) or when told (`exit_with`)."""

    outcome: PodOutcome = field(default_factory=lambda: PodOutcome("sb", container_id="c1"))
    log: str = ""
    exit_with: int | None = None
    unanswered: int = 0  # ContainerStatus calls refused first (containerd restarting)
    stopped_with: list[int] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def start(self, request: ContainerRequest) -> PodOutcome:
        return self.outcome

    def container_exit(self, container_id: str) -> int | None:
        if self.unanswered:
            self.unanswered -= 1
            raise CriCallFailed("rpc error: code = Unavailable desc = connection refused")
        return self.exit_with

    def stop_container(self, container_id: str, timeout_s: int) -> None:
        self.stopped_with.append(timeout_s)
        self.exit_with = 143

    def read_log(self, request: ContainerRequest) -> str:
        return self.log

    def remove_sandbox(self, sandbox_id: str) -> None:
        self.removed.append(sandbox_id)


def started(cri: FakeCri, tmp_path: Path) -> ContainerRun:
    fake: Any = cri
    return ContainerRun(fake, REQUEST, tmp_path / "staging")


def soon(probe: Callable[[], object], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_a_deleted_pod_s_container_is_stopped_with_its_grace_period(tmp_path: Path) -> None:
    cri = FakeCri()
    run = started(cri, tmp_path)
    (tmp_path / "staging").mkdir()
    assert run.exit_code() is None and run.not_started() is None
    run.stop(45.0)
    run.stop(1.0)  # asked again at every tick: the first grace period holds
    soon(lambda: run.exit_code() is not None)
    assert run.exit_code() == 143 and cri.stopped_with == [45]
    run.close()
    assert cri.removed == ["sb"] and not (tmp_path / "staging").exists()


def test_the_container_outlives_containerd_not_answering(tmp_path: Path) -> None:
    cri = FakeCri(unanswered=3)
    run = started(cri, tmp_path)
    soon(lambda: cri.unanswered == 0)
    assert run.exit_code() is None  # not taken for an exit
    cri.exit_with = 0
    soon(lambda: run.exit_code() == 0)
    assert cri.stopped_with == []


def test_the_log_is_read_a_whole_line_at_a_time(tmp_path: Path) -> None:
    cri = FakeCri()
    run = started(cri, tmp_path)
    # a record still being written (no newline yet) is left for the next read
    cri.log = "2026-01-01T00:00:00Z stdout F one\n2026-01-01T00:00:00Z stdout P tw"
    assert run.read_output() == "one\n"
    # once whole: a P record is part of a line the next record ends
    cri.log += "o\n2026-01-01T00:00:01Z stderr F three\n"
    assert run.read_output() == "twothree\n"
    assert run.read_output() == ""


def test_a_container_that_did_not_start_says_why(tmp_path: Path) -> None:
    refused = PodOutcome("sb", reason="CreateContainerError", message="no such image")
    run = started(FakeCri(outcome=refused), tmp_path)
    soon(lambda: run.not_started() is not None)
    assert run.not_started() == ("CreateContainerError", "no such image")
    assert run.exit_code() is None


def test_the_pod_s_security_context_reaches_the_cri_as_the_kubelet_merges_it() -> None:
    """The container's settings win over the pod's where both can say them (runAsUser,
    seccompProfile); capabilities, allowPrivilegeEscalation and readOnlyRootFilesystem are the
    container's alone; nothing said leaves containerd's defaults."""
    from rollout.lab.cri.pods import ContainerSecurity
    from rollout.lab.simulation.jobpods import container_security

    pod = {
        "securityContext": {
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
            "readOnlyRootFilesystem": True,  # not a pod-level field: ignored
        }
    }
    container = {
        "securityContext": {
            "runAsUser": 65532,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    }
    assert container_security(pod, container) == ContainerSecurity(
        run_as_user=65532,
        run_as_group=1000,
        read_only_root=False,
        drop_capabilities=("ALL",),
        no_new_privileges=True,
        seccomp_runtime_default=True,
    )
    unconfined = {"securityContext": {"seccompProfile": {"type": "Unconfined"}}}
    assert container_security(pod, unconfined).seccomp_runtime_default is False
    assert container_security({}, {}) == ContainerSecurity()
