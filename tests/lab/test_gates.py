"""Health gates in the lab: a node that logs an Xid during its change is left cordoned with
the evidence and halts the run; an Xid logged before the change does not fail a node; a node
made unhealthy during the soak after its wave halts the run before the next wave.

The Xid lines name a PCI bus the lab's device-plugin stand-in does not watch (GPU index 2 of a
two-GPU node): they stand for an Xid the real plugin missed because it was logged before the
plugin restarted, so the node advertises its GPUs whole and only the kernel log tells. That
is the case the Xid gate exists for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lab.nodes import NodeSpec
from rollout.lab.simulation.kernellog import KERNEL_LOG_PATH, bus_of_gpu
from rollout.run import list_runs, read_run
from rollout.steps.nodemarks import EVENT_NAMESPACE, LEFT_CORDONED_ANNOTATION, STEP_ANNOTATION
from rollout.transports.kube import KubeClient
from tests.examples import PLAN
from tests.lab.labapi import apply_args, lab_kube_client, wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check
from tests.planning import time_slicing_plan

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

KERNEL_LOG = "/" + KERNEL_LOG_PATH.as_posix()
UNWATCHED_BUS = bus_of_gpu(2)
# the apply of one node takes under a minute in the lab; generous under load
APPLY_WAIT_S = 600.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("gates") / "lab", ("1.7", "1.7"), gpus=2) as built:
        yield built


def log_xid(lab: Lab, node: NodeSpec, *, seconds_ago: float) -> None:
    """Append an Xid 79 line to the node's kernel-log stand-in, stamped `seconds_ago` before
    the node's uptime now, as the kernel stamps it."""
    script = (
        f"mkdir -p $(dirname {KERNEL_LOG}) && "
        f"up=$(cut -d' ' -f1 /proc/uptime) && "
        f"stamp=$(awk -v u=$up 'BEGIN {{ printf \"%12.6f\", u - {seconds_ago} }}') && "
        f'echo "[$stamp] NVRM: Xid (PCI:{UNWATCHED_BUS}): 79, pid=0, name=kworker, '
        f'GPU has fallen off the bus." >> {KERNEL_LOG}'
    )
    ssh_check(lab, node, ["sh", "-c", script])


def test_an_xid_during_the_change_leaves_the_node_cordoned_and_an_old_one_does_not(
    lab: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second = lab.nodes
    # before the change, as far as the gate is concerned, but after the node's boot: the
    # lab's dmesg, like the kernel's, shows the current boot only (the lab booted just now)
    log_xid(lab, first, seconds_ago=1)
    injected = threading.Event()

    def inject_when_cordoned() -> None:
        # the second node's change has begun once rollout cordons it
        with lab_kube_client(lab) as side:
            wait_for(
                lambda: side.get_node(second.name).unschedulable,
                APPLY_WAIT_S,
                what=f"{second.name} cordoned",
                interval_s=0.2,
            )
        log_xid(lab, second, seconds_ago=0)
        injected.set()

    watcher = threading.Thread(target=inject_when_cordoned, daemon=True)
    watcher.start()
    capsys.readouterr()
    code = main([*apply_args(lab, PLAN, tmp_path / "state"), "--output", "json"])
    watcher.join(timeout=5)
    assert injected.is_set()
    report = json.loads(capsys.readouterr().out)
    assert code == 1, report
    assert report["outcome"] == "halted" and second.name in report["halt_reason"]
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    first_outcome = state.node(first.name).outcome
    second_outcome = state.node(second.name).outcome
    assert first_outcome is not None and first_outcome.value == "succeeded"
    assert second_outcome is not None and second_outcome.value == "left-cordoned"
    assert "Xid 79" in state.node(second.name).outcome_reason
    # the old Xid did not hold the first node back; the second stays out of service
    assert not kube.get_node(first.name).unschedulable
    node = kube.get_node(second.name)
    assert node.unschedulable
    evidence = node.annotations[LEFT_CORDONED_ANNOTATION]
    assert "health gate failed" in evidence and f"Xid 79 on PCI:{UNWATCHED_BUS}" in evidence
    events = kube.list_events(EVENT_NAMESPACE, field_selector=f"involvedObject.name={second.name}")
    warnings = [e for e in events if e.event_type == "Warning" and e.reason == "RolloutGates"]
    assert warnings and "Xid 79" in warnings[0].message


SOAK_S = 60
SOAKED = time_slicing_plan(
    name="share-gpus",
    targets="{selector: nvidia.com/gpu.present=true}",
    profile="shared-4x",
    policy=f"policy:\n  waves: [1, 1]\n  soak_s: {SOAK_S}\n",
)


def test_a_node_made_unhealthy_during_the_soak_halts_the_run_before_the_next_wave(
    lab: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # as the first test left them: both nodes schedulable again, no step marked
    for spec in lab.nodes:
        kube.set_unschedulable(spec.name, False)
        kube.patch_node_annotations(
            spec.name, {LEFT_CORDONED_ANNOTATION: None, STEP_ANNOTATION: None}
        )
    plan = tmp_path / "plan.yaml"
    plan.write_text(SOAKED)
    broken: list[str] = []

    def break_the_first_done_node() -> None:
        # the first wave's node is done once its gates passed; the soak has begun
        with lab_kube_client(lab) as side:
            done = wait_for(
                lambda: [
                    n.name
                    for n in side.list_nodes()
                    if n.annotations.get(STEP_ANNOTATION) == "gates"
                ],
                APPLY_WAIT_S,
                what="the first wave's node through its gates",
                interval_s=0.2,
            )
        lab_dir = str(lab.lab_dir)
        scenario = ["lab", "break", "unhealthy-device", done[0], "--lab-dir", lab_dir]
        subprocess.run([sys.executable, "-m", "rollout", *scenario], check=True)
        broken.append(done[0])

    watcher = threading.Thread(target=break_the_first_done_node, daemon=True)
    watcher.start()
    capsys.readouterr()
    code = main([*apply_args(lab, plan, tmp_path / "state"), "--output", "json"])
    watcher.join(timeout=5)
    report = json.loads(capsys.readouterr().out)
    (first,) = broken
    (second,) = [spec.name for spec in lab.nodes if spec.name != first]
    assert code == 1, report
    assert report["outcome"] == "halted"
    assert f"soak after wave 1: {first}" in report["halt_reason"]
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id)
    outcome = state.node(first).outcome
    assert outcome is not None and outcome.value == "left-cordoned"
    assert state.node(second).outcome is None, "the next wave never started"
    assert kube.get_node(second).labels.get("nvidia.com/device-plugin.config") != "shared-4x"
    node = kube.get_node(first)
    assert node.unschedulable
    evidence = node.annotations[LEFT_CORDONED_ANNOTATION]
    assert "during the soak" in evidence and "a device the plugin marked unhealthy" in evidence
