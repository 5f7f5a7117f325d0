"""Shared by the run store's tests: a ticking clock, a plan, and a node journalled through;
for the run commands' (apply, resume, status) a fleet without SSH over the API emulator and
the two places apply keeps a run in. A test module takes the fixtures with
`pytest_plugins = ("tests.unit.runfakes",)`."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import rollout.cli.apply as cli_apply
import rollout.cli.plan as cli_plan
from rollout.plan import NodePlan, Plan, StepPlan, Wave
from rollout.run import (
    BackupWritten,
    CordonedByRollout,
    Journal,
    NodeFinished,
    NodeOutcome,
    RunState,
    StepFinished,
    StepOutcome,
    StepStarted,
    Uncordoned,
    list_runs,
    read_run,
)
from rollout.run.cluster import find_run
from rollout.transports.kube import KubeClient, incluster
from tests.emulator import emulated_kube
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


# --- the run commands: apply, resume and status -----------------------------------------------

PLAN = REPO / "examples" / "plan.yaml"
STEP_KINDS = ("preflight", "cordon", "uncordon")
NAMESPACE = "rollout"  # a scheduled run's
POD = "rollout-registry-mirror-29000000-abcde"


@pytest.fixture
def kube() -> Iterator[KubeClient]:
    with emulated_kube(None, "kube-system", NAMESPACE) as client:
        yield client


@pytest.fixture
def plan() -> Plan:
    """A small plan of two nodes in two waves, as the planner would make it."""
    steps = tuple(StepPlan.acting(kind, f"{kind} it") for kind in STEP_KINDS)
    nodes = tuple(NodePlan(name, "1.7.24", steps) for name in ("gpu-a-1", "gpu-a-2"))
    return Plan(
        name="registry-mirror",
        source=str(PLAN),
        facts_source="recorded",
        changes=("registry mirror",),
        waves=(Wave(1, nodes[:1]), Wave(2, nodes[1:])),
    )


@pytest.fixture
def fleet(kube: KubeClient, plan: Plan, monkeypatch: pytest.MonkeyPatch) -> KubeClient:
    """FleetConnection without SSH, over the emulator's API; the planner gives `plan`."""

    connect = FleetWithoutSsh(kube).connect
    monkeypatch.setattr(cli_apply, "FleetConnection", connect)  # resume
    monkeypatch.setattr(cli_plan, "FleetConnection", connect)  # apply, through connect_fleet
    monkeypatch.setattr(cli_apply, "build_plan", lambda *_: plan)
    return kube


@pytest.fixture
def in_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scheduled pod's environment as rollout reads it: a service account, no kubeconfig."""
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "namespace").write_text(NAMESPACE + "\n")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("ROLLOUT_STATE_DIR", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setattr(incluster, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setattr(cli_apply.socket, "gethostname", lambda: POD)
    return account


def apply_args(tmp_path: Path, state: Path | None = None, plan_file: Path = PLAN) -> list[str]:
    """`rollout apply --yes`; without `state`, as the scheduled pod runs it (no --state-dir)."""
    inventory = tmp_path / "inventory.yaml"
    state_dir = ("--state-dir", str(state)) if state is not None else ()
    return ["apply", str(plan_file), "-i", str(inventory), *state_dir, "--yes", "--output", "json"]


@dataclass(frozen=True)
class RunPlace:
    """Where apply keeps its run, as a test finds it: the command line that runs apply there,
    the pod named in the Lease's holder, how the run's start is said, and the runs kept."""

    args: list[str]
    pod: str | None
    kept: str
    run_ids: Callable[[KubeClient], list[str]]
    read_state: Callable[[KubeClient, str], RunState]


@pytest.fixture(params=["directory", "cluster"])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> RunPlace:
    """A run directory under a state directory; or, in the scheduled pod, the cluster."""
    if request.param == "cluster":
        request.getfixturevalue("in_pod")

        def kept_runs(kube: KubeClient) -> list[str]:
            found = find_run(kube, NAMESPACE, "registry-mirror")
            return [found.run_id] if found is not None else []

        def kept_state(kube: KubeClient, run_id: str) -> RunState:
            found = find_run(kube, NAMESPACE, "registry-mirror")
            assert found is not None and found.run_id == run_id
            return found.state

        secret = f"secret {NAMESPACE}/rollout-registry-mirror-run"
        return RunPlace(apply_args(tmp_path), POD, f"kept in {secret}", kept_runs, kept_state)
    state = tmp_path / "state"
    return RunPlace(
        apply_args(tmp_path, state),
        None,
        "resume with",
        lambda _: [run.run_id for run in list_runs(state)],
        lambda _, run_id: read_run(state, run_id),
    )
