"""Shared by the run store's tests: a ticking clock, a plan, and a node journalled through."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from rollout.run import (
    BackupWritten,
    CordonedByRollout,
    Journal,
    NodeFinished,
    NodeOutcome,
    StepFinished,
    StepOutcome,
    StepStarted,
    Uncordoned,
)
from rollout.transports.kube import KubeClient
from tests.examples import REPO

PLAN_JSON = json.dumps({"name": "registry-mirror", "waves": [["gpu-1", "gpu-2"]]})
STEPS = ("cordon", "drain", "containerd.write", "systemd.restart", "uncordon")


class FakeClock:
    """A clock that ticks one second per call, so timestamps are exact in tests."""

    def __init__(self, start: datetime = datetime(2026, 11, 29, 23, 15, tzinfo=UTC)) -> None:
        self.now = start

    def __call__(self) -> datetime:
        current = self.now
        self.now += timedelta(seconds=1)
        return current


def open_journal(tmp_path: Path) -> Iterator[Journal]:
    """A fresh run, open for appending, closed after the test."""
    with Journal.create(
        tmp_path, "registry-mirror", PLAN_JSON, user="ops", host="laptop", clock=FakeClock()
    ) as j:
        yield j


def run_node(journal: Journal, node: str, steps: tuple[str, ...] = STEPS) -> None:
    """Journal a node going through all its steps successfully."""
    for index, kind in enumerate(steps):
        journal.append(StepStarted(node, index, kind, 1))
        if kind == "cordon":
            journal.append(CordonedByRollout(node))
        if kind == "containerd.write":
            journal.append(BackupWritten(node, "/etc/a.toml", "/var/backup/a.toml", "ab" * 32))
        if kind == "uncordon":
            journal.append(Uncordoned(node))
        journal.append(StepFinished(node, index, kind, 1, StepOutcome.DONE, "ok"))
    journal.append(NodeFinished(node, NodeOutcome.SUCCEEDED))


# Holds a run's journal lock in another process until its stdin closes.
LOCK_HOLDER = """
import sys
from pathlib import Path
from rollout.run import Journal

with Journal.open(Path(sys.argv[1]), sys.argv[2]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def start_lock_holder(state_dir: Path, run_id: str) -> subprocess.Popen[str]:
    """Another process holding the run's lock; returns once it holds it."""
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(state_dir), run_id],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
    return holder


def kill_lock_holder(holder: subprocess.Popen[str]) -> None:
    """kill -9 the holder, as a crash would: the kernel drops its lock."""
    holder.kill()
    holder.wait()
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.close()
    holder.stdout.close()


class FleetWithoutSsh:
    """The CLI's FleetConnection without SSH: the API through `kube`, a stand-in runner per
    node named; gathering notes the nodes it would probe and gives no facts (only the faked
    planner and executor look at them). Patch `connect` in for the class."""

    def __init__(self, kube: KubeClient, nodes: Sequence[str] = ()) -> None:
        self.kube = kube
        self.runners: dict[str, Any] = {name: f"runner of {name}" for name in nodes}
        self.inventory_path = Path("inventory.yaml")
        self.probed: list[str] | None = None

    def connect(self, inventory: Path, *_: Any, **__: Any) -> FleetWithoutSsh:
        """What FleetConnection(inventory, kubeconfig, context, ...) gives: this fleet."""
        self.inventory_path = inventory
        return self

    def gather(self, spec: Any, max_parallel: int = 8) -> object:
        self.probed = sorted(self.runners)
        return object()

    def __enter__(self) -> FleetWithoutSsh:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
