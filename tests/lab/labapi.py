"""The Kubernetes API of the shared lab for tests: the lab with its control plane, a
KubeClient on it, and polling until the simulated cluster has caught up."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

from rollout.lab.cluster import CONTEXT, Lab, controlplane_available
from rollout.transports.kube import KubeClient
from tests.conftest import require
from tests.lab.test_cluster_shared import shared_lab

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


def fleet_args(lab: Lab, kubeconfig: Path | None = None) -> list[str]:
    """The lab's inventory, kubeconfig (the admin one unless given) and context, as CLI options."""
    return [
        *("--inventory", str(lab.inventory)),
        *("--kubeconfig", str(kubeconfig or lab.kubeconfig)),
        *("--context", CONTEXT),
    ]


def apply_args(lab: Lab, plan: Path, state: Path, kubeconfig: Path | None = None) -> list[str]:
    """`rollout apply PLAN --yes` against the lab, journalling under `state`."""
    return ["apply", str(plan), *fleet_args(lab, kubeconfig), "--state-dir", str(state), "--yes"]
