"""The unattended-wave guards of issue 24 for every change kind a GPU node takes besides
containerd's: a time-slicing profile, a host-installed driver (`mode: host`) and the GPU
Operator's driver (`mode: operator`). For each kind, on one 2-node lab of this module's own,
waves [1, 1]:

- gate: an Xid logged on the first node once its change began leaves it cordoned with that
  Xid, and only that one, in rollout.dev/left-cordoned (an Xid logged on every node just
  before the run does not count), and the run halts before the second node. The host driver
  reboots here: the Xid comes after the reboot, and the one from before must not count on
  the new boot (the lab's dmesg, like the kernel's, shows the current boot only);
- soak: the first node made unhealthy (`lab break unhealthy-device`) after its gates passed,
  during the soak, halts the run before wave 2 with the evidence;
- pause: `rollout pause` while the first node is in flight lets it finish, starts no other,
  exits 5; `rollout resume` converges both nodes.
The host driver's soak and pause reload its modules (quicker than a reboot).

Time-slicing's soak and pause are tested already (tests/lab/test_gates.py,
tests/lab/test_haltpause.py: both run time-slicing plans); its gate case is here.

The cases run in order on the one lab; each picks a target neither node is on (a driver
version, a profile), and the fixture puts back what a case broke (heals the lab, clears the
Xid lines it logged, uncordons, removes rollout's marks). Operator mode runs before host
mode: a host-installed driver makes the operator's driver pods stand down for good.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab import image
from rollout.lab.cluster import Lab
from rollout.lab.nodes import NodeSpec
from rollout.lab.simulation.kernellog import KERNEL_LOG_PATH, bus_of_gpu
from rollout.operatornames import OPERATOR_NAMESPACE
from rollout.run import list_runs, read_run
from rollout.steps.nodemarks import LEFT_CORDONED_ANNOTATION, STEP_ANNOTATION
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args, lab_kube_client, wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check
from tests.lab.test_driver_host import package, smi
from tests.lab.test_resume_timeslicing import journal_entries
from tests.planning import time_slicing_plan

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

KERNEL_LOG = "/" + KERNEL_LOG_PATH.as_posix()
# GPU index 2 of a two-GPU node: a bus the device-plugin stand-in does not watch, so only the
# kernel log tells (tests/lab/test_gates.py says why that is the Xid gate's case)
UNWATCHED_BUS = bus_of_gpu(2)
XID_TAG = "name=unattended-kinds"
# Generous: one node's change takes about a minute in the lab; the machine may be loaded.
APPLY_S = 600.0
SOAK_S = 45
# versions the lab's operator driver pods install on request; host mode installs the lab's
# apt repository's versions
OPERATOR_VERSIONS = ("560.35.03", "565.57.01", "570.86.15")
HOST_VERSIONS = image.DRIVER_VERSIONS
DEPLOY_DRIVER = "nvidia.com/gpu.deploy.driver"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("kinds") / "lab", ("1.7", "1.7"), gpus=2) as built:
        with lab_kube_client(built) as kube:
            wait_for(
                lambda: all(d.ready == d.desired for d in kube.list_daemonsets(OPERATOR_NAMESPACE)),
                240.0,
                what="every GPU Operator DaemonSet ready on every node",
            )
        yield built


@dataclass(frozen=True)
class Case:
    kind: str
    scenario: str

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.scenario}"


KINDS = ("driver-operator", "driver-host", "time-slicing")
SCENARIOS = ("gate", "soak", "pause")
CASES = [
    Case(kind, scenario)
    for kind in KINDS
    for scenario in SCENARIOS
    if kind != "time-slicing" or scenario == "gate"
]
# the step after which the first node's change has begun, for the Xid to come during it: the
# host driver's gate case reboots, and its Xid comes after the reboot
XID_AFTER = {"driver-operator": "gates.baseline", "driver-host": "driver.reload"}


def pick(versions: tuple[str, ...], taken: set[str]) -> str:
    free = [v for v in versions if v not in taken]
    assert free, f"every version of {versions} is on a node already: {taken}"
    return free[0]


def policy(case: Case) -> str:
    soak = f"  soak_s: {SOAK_S}\n" if case.scenario == "soak" else ""
    return f"policy:\n  waves: [1, 1]\n  max_unavailable: 1\n{soak}"


def plan_text(case: Case, lab: Lab, target: str) -> str:
    names = ", ".join(n.name for n in lab.nodes)
    targets = f"{{nodes: [{names}]}}"
    head = f"apiVersion: rollout/v1\nkind: Plan\nmetadata: {{name: kinds-{case.id}}}\n"
    if case.kind == "time-slicing":
        replicas = 2 + SCENARIOS.index(case.scenario)
        return time_slicing_plan(
            name=f"kinds-{case.id}",
            targets=targets,
            profile=target,
            replicas=replicas,
            policy=policy(case),
        )
    if case.kind == "driver-operator":
        change = f'{{version: "{target}", mode: operator, upgrade_timeout_s: 180}}'
        extra = ""
    else:
        change = f'{{version: "{target}", mode: host, packages: [{image.DRIVER_PACKAGE}]}}'
        reload = "reboot, reboot_timeout_s: 180" if case.scenario == "gate" else "modules"
        extra = f"  driver: {{reload: {reload}, operands_timeout_s: 120}}\n"
    return (
        f"{head}targets: {targets}\nchanges:\n  - driver-upgrade: {change}\n{policy(case)}{extra}"
    )


def choose_target(case: Case, lab: Lab) -> str:
    """A driver version or profile neither node is on: both nodes have a change."""
    if case.kind == "time-slicing":
        return f"kinds-{case.scenario}"
    on_nodes = {smi(lab, n) for n in lab.nodes}
    if case.kind == "driver-operator":
        return pick(OPERATOR_VERSIONS, on_nodes)
    installed = {package(lab, n).split("-")[0] for n in lab.nodes}
    return pick(HOST_VERSIONS, on_nodes | installed)


def log_xid(lab: Lab, node: NodeSpec) -> None:
    """An Xid 79 line in the node's kernel-log stand-in, stamped with its uptime now."""
    script = (
        f"mkdir -p $(dirname {KERNEL_LOG}) && "
        f"stamp=$(cut -d' ' -f1 /proc/uptime) && "
        f'echo "[$stamp] NVRM: Xid (PCI:{UNWATCHED_BUS}): 79, pid=0, {XID_TAG}, '
        f'GPU has fallen off the bus." >> {KERNEL_LOG}'
    )
    ssh_check(lab, node, ["sh", "-c", script])


def finished(state: Path, step: str) -> list[str]:
    """The nodes whose `step` has finished, in journal order."""
    return [
        str(e["node"])
        for e in journal_entries(state)
        if e.get("kind") == "step-finished" and e.get("step") == step
    ]


def started_nodes(state: Path) -> set[str]:
    return {str(e["node"]) for e in journal_entries(state) if e.get("kind") == "step-started"}


@dataclass
class Apply:
    """`rollout apply` in a subprocess, its output in files (no pipe to fill)."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    @classmethod
    def start(cls, argv: list[str], directory: Path) -> Apply:
        out, err = directory / "apply.out", directory / "apply.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            cmd = [sys.executable, "-m", "rollout", *argv]
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr)
        return cls(proc, out, err)

    def until(self, probe: Callable[[], Any], what: str) -> Any:
        deadline = time.monotonic() + APPLY_S
        while not (value := probe()):
            assert self.proc.poll() is None, f"the apply ended before {what}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"never: {what}\n{self.tail()}"
            time.sleep(0.2)
        return value

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=APPLY_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def tail(self) -> str:
        return (self.out.read_text(errors="replace") + self.err.read_text(errors="replace"))[-4000:]


@pytest.fixture()
def restored(lab: Lab, kube: KubeClient) -> Iterator[None]:
    """What a case breaks, put back after it: the lab healed, the Xid lines gone, every node
    schedulable without rollout's marks and advertising its GPUs whole."""
    yield
    assert main(["lab", "heal", "--lab-dir", str(lab.lab_dir)]) == 0
    for spec in lab.nodes:
        ssh_check(
            lab, spec, ["sh", "-c", f"[ ! -e {KERNEL_LOG} ] || sed -i '/{XID_TAG}/d' {KERNEL_LOG}"]
        )
        kube.set_unschedulable(spec.name, False)
        kube.patch_node_annotations(
            spec.name, {LEFT_CORDONED_ANNOTATION: None, STEP_ANNOTATION: None}
        )
    for spec in lab.nodes:
        wait_whole(kube, spec.name)


def wait_whole(kube: KubeClient, name: str) -> None:
    wait_for(lambda: whole(kube, name), 180.0, what=f"{name}'s GPUs whole", interval_s=0.5)


def whole(kube: KubeClient, name: str) -> bool:
    node = kube.get_node(name)
    gpus = {k: v for k, v in node.capacity.items() if k.startswith("nvidia.com/gpu")}
    return bool(gpus) and all(node.allocatable.get(k) == v for k, v in gpus.items())


def outcome(state: Path, node: str) -> str | None:
    (run,) = list_runs(state)
    found = read_run(state, run.run_id).node(node).outcome
    return None if found is None else found.value


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_unattended_guards_hold_for_every_change_kind(
    case: Case, lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    target = choose_target(case, lab)
    plan = tmp_path / "plan.yaml"
    plan.write_text(plan_text(case, lab, target))
    state = tmp_path / "state"
    if case.scenario == "gate":
        for spec in lab.nodes:  # before the change: not to count
            log_xid(lab, spec)
    run = Apply.start([*apply_args(lab, plan, state), "--output", "json"], tmp_path)
    if case.scenario == "gate":
        check_gate(lab, kube, state, run, XID_AFTER.get(case.kind, "gates.baseline"))
    elif case.scenario == "soak":
        check_soak(lab, kube, state, run)
    else:
        check_pause(case, lab, kube, state, run, target)


def check_gate(lab: Lab, kube: KubeClient, state: Path, run: Apply, after: str) -> None:
    (first,) = run.until(lambda: finished(state, after), f"a node's {after}")
    spec = next(n for n in lab.nodes if n.name == first)
    log_xid(lab, spec)
    code = run.wait()
    report = json.loads(run.out.read_text())
    (second,) = [n.name for n in lab.nodes if n.name != first]
    assert code == 1, run.tail()
    assert report["outcome"] == "halted" and first in report["halt_reason"], report
    assert outcome(state, first) == "left-cordoned"
    assert outcome(state, second) is None and second not in started_nodes(state)
    node = kube.get_node(first)
    assert node.unschedulable
    evidence = node.annotations[LEFT_CORDONED_ANNOTATION]
    assert "health gate failed" in evidence and f"Xid 79 on PCI:{UNWATCHED_BUS}" in evidence
    assert "xid: 1 Xid line(s) since the change began" in evidence  # not the one before
    assert not kube.get_node(second).unschedulable


def check_soak(lab: Lab, kube: KubeClient, state: Path, run: Apply) -> None:
    # the first wave's node passed its gates: the soak is next
    (first,) = run.until(lambda: finished(state, "gates"), "the first wave's gates")
    scenario = ["lab", "break", "unhealthy-device", first, "--lab-dir", str(lab.lab_dir)]
    subprocess.run([sys.executable, "-m", "rollout", *scenario], check=True, timeout=120)
    code = run.wait()
    report = json.loads(run.out.read_text())
    (second,) = [n.name for n in lab.nodes if n.name != first]
    assert code == 1, run.tail()
    assert report["outcome"] == "halted", report
    assert f"soak after wave 1: {first}" in report["halt_reason"], report
    assert outcome(state, first) == "left-cordoned"
    assert outcome(state, second) is None and second not in started_nodes(state)
    node = kube.get_node(first)
    assert node.unschedulable
    evidence = node.annotations[LEFT_CORDONED_ANNOTATION]
    assert "during the soak" in evidence and "a device the plugin marked unhealthy" in evidence


def check_pause(
    case: Case, lab: Lab, kube: KubeClient, state: Path, run: Apply, target: str
) -> None:
    (first,) = run.until(lambda: finished(state, "gates.baseline"), "a node's gates.baseline")
    (run_record,) = list_runs(state)
    pause = ["pause", run_record.run_id, "--reason", "kinds", "--state-dir", str(state)]
    assert main(pause) == 0
    code = run.wait()
    (second,) = [n.name for n in lab.nodes if n.name != first]
    assert code == 5, run.tail()
    assert "paused by " in run.tail() and "kinds" in run.tail()
    assert outcome(state, first) == "succeeded"
    assert second not in started_nodes(state)  # no node started after the pause
    resumed = subprocess.run(
        [sys.executable, "-m", "rollout", "resume", run_record.run_id, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=APPLY_S,
    )
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-4000:]
    for spec in lab.nodes:
        assert outcome(state, spec.name) == "succeeded", spec.name
        node = kube.get_node(spec.name)
        assert not node.unschedulable, spec.name
        if case.kind == "time-slicing":
            assert node.labels.get("nvidia.com/device-plugin.config") == target, spec.name
        else:
            assert smi(lab, spec) == target, spec.name
