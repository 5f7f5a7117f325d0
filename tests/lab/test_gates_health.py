"""Health gates in the lab, the rest of them: a device the plugin marks unhealthy during a
node's change, a validator that never becomes Ready again, DCGM's diagnostics failing on a
node (the stand-in dcgmi, following the node's stand-in GPU state) and passing on a healthy
one.

Each test applies its own registry-mirror change (a mirror of its own, so every apply acts)
and leaves the lab as it found it: scenarios healed, nodes schedulable and unmarked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lab.nodes import NodeSpec
from rollout.lab.scenarios import LabAccess, break_lab, find_scenario, open_lab
from rollout.lab.simulation.kernellog import bus_of_gpu
from rollout.run import list_runs, read_run
from rollout.steps.nodemarks import EVENT_NAMESPACE, LEFT_CORDONED_ANNOTATION, STEP_ANNOTATION
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args, wait_for
from tests.lab.test_cluster_shared import own_lab

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

# the apply of one node takes under a minute in the lab; generous under load
APPLY_WAIT_S = 600.0
KERNEL_LOG = "/var/log/rollout-lab/kern.log"
DCGM_LEVEL_1 = "  verify:\n    gates:\n      dcgm: {level: 1}\n"


def mirror_plan(mirror: str, targets: str, policy: str = "") -> str:
    """docker.io pulled through `mirror`, on `targets` (YAML), one node per wave."""
    return (
        "apiVersion: rollout/v1\nkind: Plan\nmetadata: {name: gates-health}\n"
        f"targets: {targets}\n"
        "changes:\n  - registry:\n      host: docker.io\n"
        "      server: https://registry-1.docker.io\n"
        f"      endpoints:\n        - url: https://{mirror}.registry.internal:5000\n"
        "          capabilities: [pull, resolve]\n"
        "policy:\n  waves: [1, 1]\n  max_unavailable: 1\n  on_failure: rollback\n" + policy
    )


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("health") / "lab", ("1.7", "1.7"), gpus=2) as built:
        yield built


@pytest.fixture
def restored(lab: Lab, kube: KubeClient) -> Iterator[Lab]:
    """The lab as the test found it afterwards: scenarios healed, nodes schedulable again."""
    yield lab
    assert main(["lab", "heal", "--lab-dir", str(lab.lab_dir)]) == 0
    for spec in lab.nodes:
        kube.set_unschedulable(spec.name, False)
        kube.patch_node_annotations(
            spec.name, {LEFT_CORDONED_ANNOTATION: None, STEP_ANNOTATION: None}
        )


def lab_break(lab: Lab, scenario: str, node: str) -> None:
    argv = ["lab", "break", scenario, node, "--lab-dir", str(lab.lab_dir)]
    subprocess.run([sys.executable, "-m", "rollout", *argv], check=True)


def during(
    lab: Lab, step: str, inject: Callable[[LabAccess, NodeSpec], None], done: list[str]
) -> threading.Thread:
    """A thread that runs `inject` on the first node marked with `step` and appends that
    node's name to `done`. A step's rollout.dev/step mark is written when it ends: a node
    marked `gpu.wait` runs gpu.smoke, seconds before its gates. Done in this process, its
    client ready: `rollout lab break` can take longer than that to start on a loaded machine."""

    def run() -> None:
        with open_lab(lab.lab_dir) as access:
            (name,) = wait_for(
                lambda: [
                    n.name
                    for n in access.kube.list_nodes()
                    if n.annotations.get(STEP_ANNOTATION) == step
                ],
                APPLY_WAIT_S,
                what=f"a node marked {step}",
                interval_s=0.1,
            )
            inject(access, lab.find_node(name))
        done.append(name)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def break_scenario(scenario: str) -> Callable[[LabAccess, NodeSpec], None]:
    return lambda access, node: break_lab(access, find_scenario(scenario), node)


def apply_json(
    lab: Lab, plan_text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, object]]:
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text)
    capsys.readouterr()
    code = main([*apply_args(lab, plan, tmp_path / "state"), "--output", "json"])
    return code, json.loads(capsys.readouterr().out)


def gate_warnings(kube: KubeClient, node: str) -> list[str]:
    events = kube.list_events(EVENT_NAMESPACE, field_selector=f"involvedObject.name={node}")
    return [e.message for e in events if e.event_type == "Warning" and e.reason == "RolloutGates"]


def test_the_dcgm_gate_passes_a_healthy_node_and_journals_each_test(
    restored: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = restored.nodes[0].name
    plan = mirror_plan("mirror-a", f"{{nodes: [{node}]}}", DCGM_LEVEL_1)
    code, report = apply_json(restored, plan, tmp_path, capsys)
    assert code == 0, report
    assert not kube.get_node(node).unschedulable
    journal = "".join(p.read_text() for p in (tmp_path / "state").rglob("*") if p.is_file())
    assert "dcgm level 1 (software Pass (GPU 0, 1))" in journal
    pods = [p.name for p in kube.list_pods("default") if p.name.startswith("rollout-dcgm-")]
    assert pods == [], "the diagnostic's pod is gone"


def test_a_failing_dcgm_test_leaves_the_node_cordoned_naming_it_and_halts(
    restored: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # both nodes: whichever goes first fails, and the second never starts
    for spec in restored.nodes:
        lab_break(restored, "row-remap-pending", spec.name)
    plan = mirror_plan("mirror-b", "{selector: nvidia.com/gpu.present=true}", DCGM_LEVEL_1)
    code, report = apply_json(restored, plan, tmp_path, capsys)
    assert code == 1, report
    assert report["outcome"] == "halted"
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    outcomes = {s.name: state.node(s.name).outcome for s in restored.nodes}
    (failed,) = [name for name, o in outcomes.items() if o is not None]
    (untouched,) = [name for name in outcomes if name != failed]
    assert outcomes[failed] is not None and outcomes[failed].value == "left-cordoned"
    assert outcomes[untouched] is None, "the run halted before the next node"
    assert failed in str(report["halt_reason"])
    node = kube.get_node(failed)
    assert node.unschedulable
    evidence = node.annotations[LEFT_CORDONED_ANNOTATION]
    assert "dcgm level 1 failed: software: Fail on GPU 1" in evidence
    assert "row remapping is pending" in evidence
    assert any("software: Fail on GPU 1" in m for m in gate_warnings(kube, failed))
    assert not kube.get_node(untouched).unschedulable


def test_a_device_made_unhealthy_during_the_change_leaves_the_node_cordoned_and_halts(
    restored: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # once gpu.wait saw every GPU advertised: only the smoke pod and the gates stand between
    # the node and its return to service. The Xid `lab break unhealthy-device` logs, written
    # straight into the node's kernel-log stand-in: its four SSH round trips can outlast a
    # smoke pod of three seconds.
    logs = {spec.name: restored.node_dirs(spec).host_path(KERNEL_LOG) for spec in restored.nodes}
    before = {name: path.read_text() if path.exists() else None for name, path in logs.items()}

    def log_xid(access: LabAccess, node: NodeSpec) -> None:
        uptime = float(Path("/proc/uptime").read_text().split()[0])  # the nodes' kernel
        line = (
            f"[{uptime:12.6f}] NVRM: Xid (PCI:{bus_of_gpu(1)}): 79, pid=0, name=kworker, "
            "GPU has fallen off the bus.\n"
        )
        logs[node.name].parent.mkdir(parents=True, exist_ok=True)
        with logs[node.name].open("a") as log:
            log.write(line)

    broken: list[str] = []
    watcher = during(restored, "gpu.wait", log_xid, broken)
    plan = mirror_plan("mirror-c", "{selector: nvidia.com/gpu.present=true}")
    try:
        code, report = apply_json(restored, plan, tmp_path, capsys)
        watcher.join(timeout=30)
    finally:
        for name, text in before.items():
            if text is None:
                logs[name].unlink(missing_ok=True)
            else:
                logs[name].write_text(text)
    (failed,) = broken
    (untouched,) = [s.name for s in restored.nodes if s.name != failed]
    assert code == 1, report
    assert report["outcome"] == "halted" and failed in str(report["halt_reason"])
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    outcome = state.node(failed).outcome
    assert outcome is not None and outcome.value == "left-cordoned"
    assert state.node(untouched).outcome is None, "the run halted before the next node"
    node = kube.get_node(failed)
    assert node.unschedulable
    evidence = node.annotations[LEFT_CORDONED_ANNOTATION]
    assert "nvidia.com/gpu capacity 2, allocatable 1 (a device the plugin marked unhealthy)" in (
        evidence
    )
    assert any("allocatable 1" in m for m in gate_warnings(kube, failed))


def test_a_validator_that_never_becomes_ready_fails_the_validator_gate(
    restored: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = restored.nodes[0].name
    # gpu.wait saw the validator Ready; it restarts and never passes again before the gates
    # read it (the smoke pod runs between them)
    broken: list[str] = []
    watcher = during(restored, "gpu.wait", break_scenario("validator-stuck"), broken)
    plan = mirror_plan("mirror-d", f"{{nodes: [{node}]}}")
    code, report = apply_json(restored, plan, tmp_path, capsys)
    watcher.join(timeout=60)
    assert broken == [node]
    assert code == 1, report
    (run,) = list_runs(tmp_path / "state")
    outcome = read_run(tmp_path / "state", run.run_id).node(node).outcome
    assert outcome is not None and outcome.value == "left-cordoned"
    evidence = kube.get_node(node).annotations[LEFT_CORDONED_ANNOTATION]
    assert "health gate failed" in evidence
    assert "the GPU Operator's validator (app=nvidia-operator-validator) was not Ready" in evidence
    assert any("validator" in m for m in gate_warnings(kube, node))
