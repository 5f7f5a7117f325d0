"""`rollout apply FILE` of a saved plan on a lab of its own (2 nodes, containerd 1.6 and 2.1):
a node whose file was changed by hand after the save is refused untouched, naming the fact,
after the node before it is done; a save of the fleet as it is then applies, killed -9 in
the middle and resumed, to the end state `rollout apply PLAN` reaches."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.lab.cluster import Lab
from rollout.run import list_runs, read_run
from rollout.run.errors import RunIncomplete
from rollout.transports.kube import KubeClient
from tests.examples import PLAN
from tests.lab.converged import assert_converged
from tests.lab.labapi import apply_args, apply_killed_when, fleet_args
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

DROP_IN = "/etc/containerd/conf.d/99-nvidia.toml"
APPLY_S = 480.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("lab"), ("1.6", "2.1"), gpus=2) as built:
        yield built


def rollout(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rollout", *args], capture_output=True, text=True, timeout=APPLY_S
    )


def save(lab: Lab, out: Path) -> None:
    done = rollout("plan", str(PLAN), *fleet_args(lab), "--out", str(out))
    assert done.returncode == 0, done.stderr


def step_started(state: Path, node: str, kind: str) -> bool:
    runs = list_runs(state) if state.exists() else []
    if not runs:
        return False
    try:
        mine = read_run(state, runs[0].run_id).node(node)
    except RunIncomplete:  # the run's directory is there, its journal not yet
        return False
    return (mine.in_flight is not None and mine.in_flight.kind == kind) or any(
        c.kind == kind for c in mine.completed
    )


def test_a_file_changed_after_the_save_refuses_its_node(lab: Lab, tmp_path: Path) -> None:
    first, second = lab.nodes
    saved = tmp_path / "plan.saved"
    save(lab, saved)
    original = ssh_check(lab, second, ["cat", DROP_IN])
    ssh_check(lab, second, ["sh", "-c", f"echo '# changed by hand' >> {DROP_IN}"])
    state = tmp_path / "state"
    done = rollout(*apply_args(lab, saved, state))
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert f"{second.name}: conf.d/99-nvidia.toml changed since the plan was saved" in said
    assert f"({second.name} was not touched)" in said
    (run,) = list_runs(state)
    run_state = read_run(state, run.run_id)
    outcome = run_state.node(first.name).outcome
    assert outcome is not None and outcome.value == "succeeded"
    assert run_state.node(second.name).outcome is None
    assert not run_state.node(second.name).completed
    assert ssh_check(lab, second, ["cat", DROP_IN]) == original + "# changed by hand\n"
    # put back as it was, for the next test
    ssh_check(lab, second, ["sh", "-c", f"sed -i '$ d' {DROP_IN}"])
    assert ssh_check(lab, second, ["cat", DROP_IN]) == original


def test_saved_plan_killed_and_resumed_converges(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    _, second = lab.nodes
    saved = tmp_path / "plan.saved"
    save(lab, saved)
    state = tmp_path / "state"
    code = apply_killed_when(
        lab, saved, state, lambda: step_started(state, second.name, "containerd.write"), APPLY_S
    )
    assert code == -9
    (run,) = list_runs(state)
    done = rollout("resume", run.run_id, "--state-dir", str(state))
    assert done.returncode == 0, done.stdout + done.stderr
    assert_converged(lab, kube)  # what `rollout apply PLAN` reaches (tests/lab/test_apply.py)
