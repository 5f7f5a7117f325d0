"""The one lab the lab tests share, brought up once per test process.

Each lab test module asks for it through a thin fixture of its own; the lab is started on
first use and taken down when pytest unconfigures, so several modules share one lab
without a conftest. Addresses 127.0.42.N and a free API port keep it apart from a lab a
user may have running with the defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from rollout.commands import CommandResult
from rollout.lab.cluster import (
    DEVICE_PLUGIN_GRACE_S,
    Lab,
    LabOptions,
    bring_up_lab,
    controlplane_available,
    tear_down_lab,
)
from rollout.lab.nodes import NodeSpec
from rollout.lab.prerequisites import find_missing
from rollout.transports.local import LocalRunner
from tests.conftest import require

# ROLLOUT_TEST_LAB_PREFIX lets two test runs on one machine use labs of their own.
TEST_ADDRESS_PREFIX = os.environ.get("ROLLOUT_TEST_LAB_PREFIX", "127.0.42")
# 1.6, 1.7, 2.1 for the per-series tests; the second 1.7 node is the incident's to break.
TEST_SERIES = ("1.6", "1.7", "2.1", "1.7")
TEST_GPUS = 2
INCIDENT_NODE = "lab-node-4"
# Labs a test brings up for itself (apply changes nodes for good) live on their own addresses.
OWN_ADDRESS_PREFIX = os.environ.get("ROLLOUT_TEST_APPLY_PREFIX", "127.0.45")

_state: dict[str, object] = {}


def require_lab_prerequisites() -> None:
    """Skip (fail in CI) when this machine cannot run the lab."""
    missing = find_missing()
    if missing:
        require("the lab cannot run here: " + "; ".join(str(m) for m in missing))


def lab_options(
    lab_dir: Path, containerd: tuple[str, ...], gpus: int, address_prefix: str
) -> LabOptions:
    """A test lab: a node per containerd series, on its own addresses and a free API port."""
    return LabOptions(
        lab_dir=lab_dir,
        nodes=len(containerd),
        containerd=containerd,
        gpus=gpus,
        address_prefix=address_prefix,
        api_port=0,
    )


def shared_lab(request: pytest.FixtureRequest) -> Lab:
    """The session's lab: brought up on first use, taken down at the end of the run."""
    require_lab_prerequisites()
    if "error" in _state:
        pytest.fail(f"the shared lab failed to start: {_state['error']}", pytrace=False)
    lab = _state.get("lab")
    if isinstance(lab, Lab):
        return lab
    base = request.getfixturevalue("tmp_path_factory").mktemp("lab")
    lab_dir = Path(os.environ.get("ROLLOUT_TEST_LAB_DIR") or base / "lab")
    try:
        lab = bring_up_lab(
            lab_options(lab_dir, TEST_SERIES, TEST_GPUS, TEST_ADDRESS_PREFIX), progress=_progress
        )
    except Exception as exc:
        _state["error"] = exc
        raise
    _state["lab"] = lab
    request.config.add_cleanup(lambda: tear_down_lab(lab_dir, progress=_progress))
    return lab


@contextlib.contextmanager
def own_lab(
    lab_dir: Path,
    containerd: tuple[str, ...],
    gpus: int,
    *,
    device_plugin_grace_s: int = DEVICE_PLUGIN_GRACE_S,
) -> Iterator[Lab]:
    """A lab of one test's own, a node per containerd series, taken down afterwards."""
    missing = find_missing()
    if missing or not controlplane_available():
        require("the lab cannot run here: " + "; ".join(str(m) for m in missing))
    options = lab_options(lab_dir, containerd, gpus, OWN_ADDRESS_PREFIX)
    options = dataclasses.replace(options, device_plugin_grace_s=device_plugin_grace_s)
    built = bring_up_lab(options, progress=lambda _: None)
    try:
        yield built
    finally:
        tear_down_lab(lab_dir, progress=lambda _: None)


def node_of_series(lab: Lab, series: str) -> NodeSpec:
    """The first node of the lab running containerd of that series."""
    for node in lab.nodes:
        if node.containerd == series:
            return node
    raise AssertionError(f"no {series} node in the lab")


def ssh_run(
    lab: Lab, node: NodeSpec, argv: Sequence[str], *, stdin: bytes | None = None
) -> CommandResult:
    """Run argv on a node over real SSH with the lab's key and strict known_hosts."""
    return LocalRunner().run(lab.ssh.argv(node.address, argv), stdin=stdin, timeout_s=60.0)


def ssh_check(lab: Lab, node: NodeSpec, argv: Sequence[str], *, stdin: bytes | None = None) -> str:
    """Like ssh_run, asserting success; returns stdout."""
    result = ssh_run(lab, node, argv, stdin=stdin)
    assert result.ok, f"{node.name}: {argv} exited {result.exit_code}: {result.tail()}"
    return result.stdout


def _progress(line: str) -> None:
    print(line)
