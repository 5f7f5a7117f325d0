"""kill -9 of the demo plan's FIRST apply (examples/lab-plan.yaml: a registry mirror and a
time-slicing profile) on a fresh lab, then ONE `rollout resume`, with no human retrying:
it converges from every point of the first node, the cluster-wide ClusterPolicy change
included (issue 22 part 6).

Each point boots a lab of its own (4 nodes, containerd 1.6/1.7/2.1/1.7, 4 GPUs each, as
`rollout lab up` does): undoing a time-slicing rollout on a lab (ConfigMap keys, the
ClusterPolicy, the operator's rollout, labels, containerd files) is neither cheap nor
faithful, and a fresh lab takes seconds. The apply is a real `rollout apply` subprocess,
SIGKILLed; the resume is another, as a user runs them.

Two points have another node NotReady while the resume starts, as the GPU Operator's
rollout leaves nodes after a ClusterPolicy change that restarts the toolkit (each toolkit
restart takes its node NotReady for containerd's RestartSec): the lab's kubelet reports
NotReady through its `lab.rollout/not-ready` annotation (what `rollout lab break not-ready`
sets), and the test heals it once the resume shows it is waiting. The resume must continue
the node it had taken down (it needs no new slot) and wait for the other, not halt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from rollout.lab.simulation.gpuoperator import NOT_READY_ANNOTATION
from rollout.operatornames import OPERATOR_NAMESPACE
from rollout.run import list_runs, read_run
from rollout.transports.kube import KubeClient
from tests.examples import REPO
from tests.lab.converged import HANDLERS, dump_of, handlers_and_config_path
from tests.lab.labapi import apply_killed_when, lab_kube_client, wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

DEMO_PLAN = REPO / "examples" / "lab-plan.yaml"
GPUS = 4
REPLICAS = 4  # the demo profile shares each GPU four ways
PROFILE_LABEL = "nvidia.com/device-plugin.config"
PROFILE = "shared-4x"
FIRST = "lab-node-1"
# Generous: the machine running the suite may be loaded; a hang fails here, not in CI's limit.
APPLY_S = 300.0
RESUME_S = 480.0


@dataclass(frozen=True)
class KillPoint:
    """Kill the apply once FIRST's `step` has started (and `after_s` more seconds)."""

    step: str
    after_s: float = 0.0
    # a node made NotReady before the resume, healed once the resume's output shows `heal_on`
    not_ready: str | None = None
    heal_on: str = ""


POINTS = {
    # killed once the drain has started, so the node is cordoned by this run (a kill at the
    # cordon's start may land before the cordon reached the API: seen under CI's load); the
    # drain is quick here (nothing to evict), so the kill lands in the drain or just after
    "cordon-drain": KillPoint("drain"),
    "containerd-write-restart": KillPoint("containerd.write"),
    # three seconds into the ClusterPolicy change, as in the issue: the GPU Operator is
    # rolling the device plugin; another node NotReady until the resume has passed the
    # budget and is back in configmap.update, which waits for every GPU node to be Ready
    "clusterpolicy-change": KillPoint(
        "configmap.update", 3.0, not_ready="lab-node-2", heal_on=f"{FIRST}: configmap.update ..."
    ),
    # the next node needs a new slot while lab-node-4 is NotReady since the change: waited for
    "gpu-wait": KillPoint("gpu.wait", not_ready="lab-node-4", heal_on="waiting for lab-node-4"),
}


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    """A fresh lab as `rollout lab up` makes it, once its GPU Operator has started every
    operand (as a user sees it before a first apply): the first apply is the one under test.
    Under CI's load the operands can still be starting when `lab up` returns."""
    with own_lab(tmp_path / "lab", ("1.6", "1.7", "2.1", "1.7"), gpus=GPUS) as built:
        with lab_kube_client(built) as kube:
            wait_for(
                lambda: all(d.ready == d.desired for d in kube.list_daemonsets(OPERATOR_NAMESPACE)),
                240.0,
                what="every GPU Operator DaemonSet ready on every node",
            )
        yield built


def journal_entries(state: Path) -> list[dict[str, Any]]:
    runs = list(state.glob("runs/*/journal.jsonl"))
    if not runs:
        return []
    entries = []
    for line in runs[0].read_text().splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a line being written
    return entries


def started(state: Path, node: str, step: str) -> bool:
    return any(
        e["kind"] == "step-started" and e.get("node") == node and e.get("step") == step
        for e in journal_entries(state)
    )


def in_flight(state: Path) -> list[str]:
    """The steps started and not finished when the journal ends: `node/step`."""
    flying: dict[str, str] = {}
    for e in journal_entries(state):
        if e["kind"] == "step-started":
            flying[e["node"]] = e["step"]
        elif e["kind"] in ("step-finished", "step-undone"):
            flying.pop(e["node"], None)
    return [f"{node}/{step}" for node, step in sorted(flying.items())]


def resume_healing(
    run_id: str, state: Path, heal_on: str, heal: Callable[[], None]
) -> tuple[int, str]:
    """`rollout resume RUN` in a subprocess; `heal()` once a line of its output holds
    `heal_on` (never when ""); its exit status and output."""
    cmd = [sys.executable, "-m", "rollout", "resume", run_id, "--state-dir", str(state)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        healed = not heal_on
        for line in proc.stdout:
            lines.append(line)
            if not healed and heal_on in line:
                heal()
                healed = True

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=RESUME_S)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=10)
    return code, "".join(lines)


def assert_demo_converged(lab: Lab, kube: KubeClient) -> None:
    """Every node loads the mirror and keeps the nvidia handlers, runs the profile, advertises
    its GPUs shared four ways and is schedulable again."""
    for spec in lab.nodes:
        handlers, path = handlers_and_config_path(dump_of(lab, spec.name))
        assert handlers >= HANDLERS, spec.name
        assert path == "/etc/containerd/certs.d", spec.name
        ssh_check(lab, spec, ["test", "-f", "/etc/containerd/certs.d/docker.io/hosts.toml"])
        node = kube.get_node(spec.name)
        assert node.labels.get(PROFILE_LABEL) == PROFILE, spec.name
        assert not node.unschedulable, spec.name
        assert node.ready, spec.name
    wait_for(
        lambda: all(
            kube.get_node(n.name).allocatable.get("nvidia.com/gpu") == str(GPUS * REPLICAS)
            for n in lab.nodes
        ),
        30.0,
        what=f"every node advertising {GPUS * REPLICAS} nvidia.com/gpu",
    )


@pytest.mark.parametrize("point", list(POINTS), ids=list(POINTS))
def test_first_apply_killed_then_one_resume_converges(
    lab: Lab, kube: KubeClient, tmp_path: Path, point: str
) -> None:
    kill = POINTS[point]
    state = tmp_path / "state"
    killed_at: list[float] = []

    def ready() -> bool:
        if not killed_at and started(state, FIRST, kill.step):
            killed_at.append(time.monotonic() + kill.after_s)
        return bool(killed_at) and time.monotonic() >= killed_at[0]

    status = apply_killed_when(lab, DEMO_PLAN, state, ready, timeout_s=APPLY_S)
    assert status == -signal.SIGKILL, f"the apply ended by itself ({status}) before {point}"
    flying = in_flight(state)
    assert flying and all(f.startswith(f"{FIRST}/") for f in flying), flying
    assert kube.get_node(FIRST).unschedulable, "killed after the run cordoned the node"
    if kill.not_ready:
        kube.patch_node_annotations(kill.not_ready, {NOT_READY_ANNOTATION: "true"})
        wait_for(lambda: not kube.get_node(str(kill.not_ready)).ready, 30.0, what="NotReady")

    def heal() -> None:
        kube.patch_node_annotations(str(kill.not_ready), {NOT_READY_ANNOTATION: None})

    (run,) = list_runs(state)
    code, output = resume_healing(run.run_id, state, kill.heal_on, heal)
    assert code == 0, f"killed in {flying}; resume exited {code}:\n{output[-4000:]}"
    final = read_run(state, run.run_id)
    assert final.outcome is not None and final.outcome.value == "succeeded", output[-4000:]
    assert all(final.node(n.name).outcome.value == "succeeded" for n in lab.nodes)  # type: ignore[union-attr]
    if kill.heal_on:
        assert kill.heal_on in output, output[-4000:]
    assert_demo_converged(lab, kube)
