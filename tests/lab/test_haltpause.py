"""Halts and pauses on a lab of this module's own.

A halt label that appears while a step waits on the cluster ends the wait at once (issue 24),
as a new user met it: `rollout lab break upgrade-failed lab-node-3` during wave 1's
`configmap.update` of the demo plan used to wait the full 300 s for the GPU Operator to
settle, fail lab-node-1, roll it back, and never name lab-node-3. Now the run halts within
seconds naming lab-node-3 and the label; lab-node-1, not to blame, is left in flight, and one
`rollout resume` after the label is gone converges.

`rollout pause RUN` during a parallel wave: the two nodes in flight finish, the third never
starts, the run exits 5 and `status` says who paused it; a resume clears it; paused again
and killed with SIGKILL mid-node, the run stays paused (status says so) and one more resume
converges.

One lab of three nodes (lab-node-3 must exist), booted by this module alone; the halt test
leaves it converged on the demo plan, the pause test then runs a different profile on it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.run import list_runs, read_run
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args
from tests.lab.test_cluster_shared import own_lab
from tests.lab.test_resume_timeslicing import DEMO_PLAN, started

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

NODES = ("lab-node-1", "lab-node-2", "lab-node-3")
FIRST = "lab-node-1"
BROKEN = "lab-node-3"
LABEL = "nvidia.com/gpu-driver-upgrade-state=upgrade-failed"
# the demo plan's policy.verify.gpu_wait_timeout_s: the wait the bug sat out in full
SETTLE_TIMEOUT_S = 300.0
# Generous: the machine running the suite may be loaded; a hang fails here, not in CI's limit.
APPLY_S = 480.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("haltpause") / "lab", ("1.7", "1.7", "1.7"), 2) as built:
        yield built


def test_upgrade_failed_during_configmap_update_halts_at_once_naming_the_node(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    cmd = [sys.executable, "-m", "rollout", *apply_args(lab, DEMO_PLAN, state)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + APPLY_S
        while not started(state, FIRST, "configmap.update"):
            assert proc.poll() is None, f"the apply ended early:\n{proc.communicate()[0]}"
            assert time.monotonic() < deadline, "configmap.update never started"
            time.sleep(0.1)
        assert main(["lab", "break", "upgrade-failed", BROKEN, "--lab-dir", str(lab.lab_dir)]) == 0
        broken_at = time.monotonic()
        output, _ = proc.communicate(timeout=APPLY_S)
        waited_s = time.monotonic() - broken_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, output[-4000:]
    assert f"halt label on {BROKEN} ({LABEL})" in output, output[-4000:]
    assert f"seen while {FIRST} waited in configmap.update" in output, output[-4000:]
    # the wait ended on the label, not on its timeout (the bug waited all of it)
    assert waited_s < SETTLE_TIMEOUT_S, output[-4000:]
    (run,) = list_runs(state)
    record = read_run(state, run.run_id)
    assert record.node(FIRST).outcome is None  # in flight, not failed, not rolled back
    assert "undone" not in output and "rolled-back" not in output, output[-4000:]
    assert kube.get_node(FIRST).unschedulable  # still taken down, for the resume to finish

    # the label gone, one resume finishes what the halt left
    assert main(["lab", "heal", BROKEN, "--lab-dir", str(lab.lab_dir)]) == 0
    resumed = subprocess.run(
        [sys.executable, "-m", "rollout", "resume", run.run_id, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=APPLY_S,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    final = read_run(state, run.run_id)
    assert all(final.node(n.name).outcome.value == "succeeded" for n in lab.nodes)  # type: ignore[union-attr]
    assert not any(kube.get_node(n.name).unschedulable for n in lab.nodes)


def parallel_plan(directory: Path) -> Path:
    """The demo plan with another profile, two nodes at once in its first wave."""
    text = DEMO_PLAN.read_text()
    for old, new in (
        ("shared-4x", "shared-2x"),
        ("replicas: 4", "replicas: 2"),
        ('waves: [1, "50%"]', "waves: [2, 1]"),
        ("max_unavailable: 1", "max_unavailable: 2"),
    ):
        assert old in text, f"the demo plan no longer holds {old!r}"
        text = text.replace(old, new)
    path = directory / "parallel.yaml"
    path.write_text(text)
    return path


def started_nodes(state: Path) -> set[str]:
    return {name for name in NODES if started(state, name, "preflight")}


def at(state: Path) -> list[str]:
    return ["--state-dir", str(state)]


def rollout(*args: str, timeout_s: float = APPLY_S) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "rollout", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def wait_until(probe: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + APPLY_S
    while not probe():
        assert proc.poll() is None, f"ended before {what}:\n{proc.communicate()[0][-4000:]}"
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


def test_pause_in_a_parallel_wave_lets_nodes_in_flight_finish_and_survives_kill_9(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    plan = parallel_plan(tmp_path)
    cmd = [sys.executable, "-m", "rollout", *apply_args(lab, plan, state)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: {"lab-node-1", "lab-node-2"} <= started_nodes(state), proc, "wave 1")
        (run,) = list_runs(state)
        # in this process: no interpreter start between seeing the wave and pausing it
        assert main(["pause", run.run_id, "--reason", "vendor ticket", *at(state)]) == 0
        output, _ = proc.communicate(timeout=APPLY_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 5, output[-4000:]
    assert "paused by " in output and "vendor ticket" in output, output[-4000:]
    record = read_run(state, run.run_id)
    for name in ("lab-node-1", "lab-node-2"):  # in flight when paused: finished
        outcome = record.node(name).outcome
        assert outcome is not None and outcome.value == "succeeded", name
        assert not kube.get_node(name).unschedulable, name
    assert "lab-node-3" not in started_nodes(state)  # no node started after the pause
    assert not kube.get_node("lab-node-3").unschedulable
    status = rollout("status", run.run_id, "--state-dir", str(state))
    assert f"run {run.run_id}: paused by " in status.stdout, status.stdout

    # resume clears the pause; paused again mid-node and killed: still paused after the kill
    resume = [sys.executable, "-m", "rollout", "resume", run.run_id, "--state-dir", str(state)]
    proc = subprocess.Popen(resume, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: "lab-node-3" in started_nodes(state), proc, "lab-node-3 started")
        assert main(["pause", run.run_id, "--reason", "again", *at(state)]) == 0
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    status = rollout("status", run.run_id, "--state-dir", str(state))
    assert f"run {run.run_id}: paused by " in status.stdout and ": again;" in status.stdout
    final = rollout("resume", run.run_id, "--state-dir", str(state))
    assert final.returncode == 0, (final.stdout + final.stderr)[-4000:]
    assert "unpaused: the run was paused by " in final.stderr
    record = read_run(state, run.run_id)
    assert all(record.node(n.name).outcome.value == "succeeded" for n in lab.nodes)  # type: ignore[union-attr]
    assert not any(kube.get_node(n.name).unschedulable for n in lab.nodes)
