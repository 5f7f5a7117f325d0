"""The Kubernetes API of the shared lab for tests: the lab with its control plane, a
KubeClient on it, polling until the simulated cluster has caught up, and watching it from
the side while a command runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client

from rollout.cli import main
from rollout.lab.cluster import CONTEXT, Lab, controlplane_available
from rollout.lab.simulation.gpuoperator import CLUSTER_POLICY_NAME
from rollout.transports.kube import KubeClient
from tests.conftest import require
from tests.lab.test_cluster_shared import shared_lab
from tests.sampler import sampling

T = TypeVar("T")


def api_lab(request: pytest.FixtureRequest) -> Lab:
    """The shared lab, which must serve the Kubernetes API (fail in CI, skip elsewhere)."""
    if not controlplane_available():
        require("rollout.lab.controlplane is not available: these tests need the Kubernetes API")
    return shared_lab(request)


@contextmanager
def lab_kube_client(lab: Lab) -> Iterator[KubeClient]:
    """A KubeClient through the lab's own kubeconfig, as a user would connect."""
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as kube:
        yield kube


@contextmanager
def watching(
    lab: Lab, sample: Callable[[KubeClient], Iterable[T]], interval_s: float
) -> Iterator[list[T]]:
    """What `sample` sees through a client of its own every `interval_s` while the block runs,
    gathered into the list yielded (complete once the block is left)."""
    with lab_kube_client(lab) as side, sampling(lambda: sample(side), interval_s) as seen:
        yield seen


def wait_for(
    probe: Callable[[], T | None],
    timeout_s: float = 5.0,
    *,
    what: str = "the condition",
    interval_s: float = 0.02,
) -> T:
    """Poll until `probe` returns something truthy and return it; fail with the last value."""
    deadline = time.monotonic() + timeout_s
    value = probe()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = probe()
    assert value, f"timed out after {timeout_s:g}s waiting for {what} (last: {value!r})"
    return value


@dataclass(frozen=True)
class Waiting:
    """A test module's pace: `wait_for` with one timeout and interval, the condition's
    description first (`settle("the node Ready", probe)`)."""

    timeout_s: float
    interval_s: float

    def __call__(self, what: str, probe: Callable[[], T | None]) -> T:
        return wait_for(probe, self.timeout_s, what=what, interval_s=self.interval_s)


def patch_cluster_policy(api_client: Any, spec: dict[str, Any]) -> None:
    """Merge `spec` into the lab's ClusterPolicy, through the official client as a user would."""
    client.CustomObjectsApi(api_client).patch_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", CLUSTER_POLICY_NAME, {"spec": spec}
    )


def fleet_args(lab: Lab, kubeconfig: Path | None = None) -> list[str]:
    """The lab's inventory, kubeconfig (the admin one unless given) and context, as CLI options."""
    return [
        *("--inventory", str(lab.inventory)),
        *("--kubeconfig", str(kubeconfig or lab.kubeconfig)),
        *("--context", CONTEXT),
    ]


def diagnose_report(
    lab: Lab, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    """`rollout diagnose` of every lab node (and `extra` options) as JSON: exit code, report."""
    capsys.readouterr()
    nodes = [n.name for n in lab.nodes]
    code = main(["diagnose", *nodes, *fleet_args(lab), "--output", "json", *extra])
    out = capsys.readouterr().out
    assert out.strip(), f"diagnose printed nothing (exit {code})"
    return code, json.loads(out)


def apply_args(lab: Lab, plan: Path, state: Path, kubeconfig: Path | None = None) -> list[str]:
    """`rollout apply PLAN --yes` against the lab, journalling under `state`."""
    return ["apply", str(plan), *fleet_args(lab, kubeconfig), "--state-dir", str(state), "--yes"]


def apply_killed_when(
    lab: Lab, plan: Path, state: Path, ready: Callable[[], bool], timeout_s: float
) -> int:
    """`rollout apply` in a subprocess, SIGKILLed once `ready()` (or after `timeout_s`); its
    exit status (negative: the signal that ended it)."""
    cmd = [sys.executable, "-m", "rollout", *apply_args(lab, plan, state)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout_s
    try:
        while proc.poll() is None and time.monotonic() < deadline and not ready():
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    return proc.returncode
