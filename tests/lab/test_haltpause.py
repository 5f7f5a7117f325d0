"""A halt label that appears while a step waits on the cluster ends the wait at once (issue 24),
as a new user met it: `rollout lab break upgrade-failed lab-node-3` during wave 1's
`configmap.update` of the demo plan used to wait the full 300 s for the GPU Operator to
settle, fail lab-node-1, roll it back, and never name lab-node-3. Now the run halts within
seconds naming lab-node-3 and the label; lab-node-1, not to blame, is left in flight, and one
`rollout resume` after the label is gone converges.

One lab of three nodes (lab-node-3 must exist), booted by this module alone.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
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
