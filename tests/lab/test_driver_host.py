"""Host-installed driver upgrades (`mode: host`) end to end, on a lab of its own: 4 nodes with
real sshd, systemd, apt and dpkg, the lab's stand-in nvidia modules and nvidia-smi, real
reboots (nspawn restarts), the API emulator through the official client.

The tests share one lab and run in order, each starting where the previous one left it:
535 -> 550 by module reload (killed during an install, resumed), a failing package on node 2
(rolled back, halted), 550 -> 535 by reboot (the mismatch seen between install and reboot,
killed during a reboot wait, resumed). The ClusterPolicy's driver.enabled=false shows on
the nodes as `nvidia.com/gpu.deploy.driver=false`; `dcgm=false` is an operator's choice the
upgrade must keep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab import image
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.nodes import NodeSpec
from rollout.run import list_runs
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args, fleet_args, wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check, ssh_run

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

OLD = image.INSTALLED_DRIVER
NEW = next(v for v in image.DRIVER_VERSIONS if v != OLD)
PACKAGE = image.DRIVER_PACKAGE
DEPLOY = "nvidia.com/gpu.deploy."
KEPT_FALSE = {f"{DEPLOY}driver": "false", f"{DEPLOY}dcgm": "false"}
PAUSED = "paused-for-driver-upgrade"
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
KILL_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    where = tmp_path_factory.mktemp("driverhost") / "lab"
    with own_lab(where, ("1.6", "1.7", "2.1", "1.7"), 2) as built:
        yield built


@pytest.fixture(scope="module")
def kube(lab: Lab) -> Iterator[KubeClient]:
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as client:
        for node in lab.nodes:  # a host-installed driver; DCGM switched off by the operator
            client.patch_node_labels(node.name, KEPT_FALSE)
        yield client


def plan_file(
    directory: Path, version: str, reload: str, *, targets: str = "", max_unavailable: int = 2
) -> Path:
    path = directory / f"driver-{version}-{reload}.yaml"
    path.write_text(
        f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: driver-{reload}}}
targets: {targets or '{selector: "nvidia.com/gpu.present=true"}'}
changes:
  - driver-upgrade: {{version: "{version}", mode: host, packages: [{PACKAGE}]}}
policy:
  waves: [1, "50%"]
  max_unavailable: {max_unavailable}
  driver: {{reload: {reload}, reboot_timeout_s: 120, operands_timeout_s: 60}}
  verify: {{gpu_wait_timeout_s: 60, smoke_timeout_s: 60}}
"""
    )
    return path


def smi(lab: Lab, node: NodeSpec) -> str:
    """What the node's nvidia-smi says of the driver: a version, or its first error line."""
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    result = ssh_run(lab, node, query)
    return (result.stdout.strip().splitlines() or [""])[0]


def package(lab: Lab, node: NodeSpec) -> str:
    """`<version> <dpkg status>` of the driver package."""
    fmt = "${Version} ${db:Status-Abbrev}"
    return ssh_check(lab, node, ["dpkg-query", "-W", f"-f={fmt}", PACKAGE]).strip()


# An apt hook that waits, before dpkg runs, while HOLD_FILE exists.
HOLD_FILE = "/run/rollout-test-hold-install"
HOLD_CONF = "/etc/apt/apt.conf.d/00rollout-test-hold"
HOLD_HOOK = f'DPkg::Pre-Invoke {{"while [ -e {HOLD_FILE} ]; do sleep 0.2; done";}};'


def apt_running(lab: Lab, node: NodeSpec) -> bool:
    return ssh_run(lab, node, ["pgrep", "-x", "apt-get"]).ok


def rebooting(lab: Lab, node: NodeSpec, before: str) -> bool:
    """The node is down, or up on another boot: `systemctl reboot` has been asked."""
    result = ssh_run(lab, node, ["cat", "/proc/sys/kernel/random/boot_id"])
    return not result.ok or result.stdout.strip() != before


def boot_id(lab: Lab, node: NodeSpec) -> str:
    return ssh_check(lab, node, ["cat", "/proc/sys/kernel/random/boot_id"]).strip()


def entries(state: Path) -> list[dict[str, Any]]:
    runs = sorted(state.glob("runs/*/journal.jsonl"))
    if not runs:
        return []
    lines = runs[-1].read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


def step(kind: str, node: str, event: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda found: any(
        e.get("kind") == event and e.get("node") == node and e.get("step") == kind for e in found
    )


def run_killed_when(
    argv: list[str],
    state: Path,
    when: Callable[[list[dict[str, Any]]], bool],
    delay_s: float = 0.0,
    then: Callable[[], bool] | None = None,
) -> None:
    """Run rollout in a subprocess; SIGKILL it `delay_s` after the journal satisfies `when`
    (and, when given, `then()` is true: something seen on the node)."""
    log = state.parent / f"rollout-{time.monotonic_ns()}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rollout", *argv], stdout=out, stderr=out)
    deadline = time.monotonic() + KILL_TIMEOUT_S
    try:
        while proc.poll() is None and time.monotonic() < deadline and not when(entries(state)):
            time.sleep(0.05)
        while then is not None and proc.poll() is None and time.monotonic() < deadline:
            if then():
                break
        time.sleep(delay_s)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        code = proc.wait()
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    assert code == -signal.SIGKILL, f"rollout ended on its own ({code}) before the kill:\n{tail}"


def assert_upgraded(lab: Lab, kube: KubeClient, version: str) -> None:
    for spec in lab.nodes:
        assert smi(lab, spec) == version, spec.name
        assert package(lab, spec) == f"{version}-1 hi", spec.name  # installed and held
        node = kube.get_node(spec.name)
        deploy = {k: v for k, v in node.labels.items() if k.startswith(DEPLOY)}
        assert {k: deploy[k] for k in KEPT_FALSE} == KEPT_FALSE, spec.name
        assert set(deploy.values()) == {"true", "false"}, (spec.name, deploy)
        assert not node.unschedulable, spec.name
        assert node.allocatable.get("nvidia.com/gpu") == str(len(spec.gpus)), spec.name


def test_module_reload_wave_killed_during_an_install_resumes(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    first = lab.nodes[0]
    assert smi(lab, first) == OLD
    state = tmp_path / "state"
    argv = apply_args(lab, plan_file(tmp_path, NEW, "modules"), state)
    # killed while apt-get runs on the node: an apt hook holds it before dpkg until the kill
    # is done, so the kill never races the install
    ssh_check(
        lab, first, ["sh", "-c", f"touch {HOLD_FILE} && printf '%s\\n' '{HOLD_HOOK}' > {HOLD_CONF}"]
    )
    installing = step("driver.install", first.name, "step-started")
    try:
        run_killed_when(argv, state, installing, then=lambda: apt_running(lab, first))
    finally:
        ssh_check(lab, first, ["rm", "-f", HOLD_FILE, HOLD_CONF])
    # the orphaned apt-get, let go, finishes or dies: the resumed run must find dpkg free
    wait_for(lambda: not apt_running(lab, first), 120.0, what="the held apt-get to end")
    found = entries(state)
    assert not step("driver.install", first.name, "step-finished")(found), "killed too late"
    # killed mid-way: the operands are paused, the `false` labels as they were
    labels = kube.get_node(first.name).labels
    assert labels[f"{DEPLOY}device-plugin"] == PAUSED
    assert {k: labels[k] for k in KEPT_FALSE} == KEPT_FALSE
    assert smi(lab, first) != OLD  # the old module is gone (no driver, or the new one)
    (run,) = list_runs(state)
    assert main(["resume", run.run_id, "--state-dir", str(state)]) == 0
    assert_upgraded(lab, kube, NEW)
    done = [e for e in entries(state) if e.get("kind") == "step-finished"]
    reloads = [e for e in done if e["step"] == "driver.reload"]
    assert sorted(e["node"] for e in reloads) == sorted(n.name for n in lab.nodes)
    assert all("loaded nvidia" in e["detail"] for e in reloads)  # modprobe, no reboot
    waves = [e["node"] for e in entries(state) if e.get("kind") == "step-started"
             and e.get("step") == "preflight"]  # fmt: skip
    assert waves[0] == first.name  # wave 1 is one node


def test_plan_refuses_a_version_no_node_can_install_naming_the_node_and_the_offer(
    lab: Lab, kube: KubeClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = plan_file(tmp_path, "560.35.03", "modules")
    assert main(["plan", str(plan), *fleet_args(lab)]) == 2
    err = capsys.readouterr().err
    assert f"node {lab.nodes[0].name}: {PACKAGE} 560.35.03 cannot be installed" in err
    assert f"{OLD}-1" in err and f"{NEW}-1" in err  # what the node's apt sources offer


def failing_driver() -> str:
    version = getattr(image, "FAILING_DRIVER", None)
    if not isinstance(version, str):
        pytest.fail(
            "the lab's apt repository has no failing driver package (rollout.lab.image."
            "FAILING_DRIVER, a version whose postinst fails): the failure test needs it",
            pytrace=False,
        )
    return version


def test_a_failing_package_rolls_node_2_back_and_halts(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    broken = failing_driver()
    two, three, four = lab.nodes[1:]
    targets = f"{{nodes: [{two.name}, {three.name}, {four.name}]}}"
    state = tmp_path / "state"
    plan = plan_file(tmp_path, broken, "modules", targets=targets)
    assert main(apply_args(lab, plan, state)) == 1
    (run,) = list_runs(state)
    final = run.run_dir / "journal.jsonl"
    finished = [json.loads(line) for line in final.read_text().splitlines()]
    outcome = {e["node"]: e for e in finished if e.get("kind") == "node-finished"}
    assert outcome[two.name]["outcome"] == "rolled-back"
    assert "rolled back" in outcome[two.name]["reason"]
    # node 2 is back on its previous version, held, the driver answering
    assert smi(lab, two) == NEW
    assert package(lab, two) == f"{NEW}-1 hi"
    # halted before nodes 3 and 4: not a step started there, their driver as it was
    started = {e["node"] for e in finished if e.get("kind") == "step-started"}
    assert started == {two.name}
    for spec in (three, four):
        assert smi(lab, spec) == NEW and package(lab, spec) == f"{NEW}-1 hi", spec.name
    # nothing cordoned without a recorded reason
    for spec in lab.nodes:
        node = kube.get_node(spec.name)
        assert not node.unschedulable or "rollout.dev/left-cordoned" in node.annotations
    labels = kube.get_node(two.name).labels
    assert labels[f"{DEPLOY}device-plugin"] == "true"
    assert {k: labels[k] for k in KEPT_FALSE} == KEPT_FALSE


def test_reboot_wave_shows_the_mismatch_and_resumes_a_kill_in_the_reboot_wait(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    second = lab.nodes[1]
    boots = {n.name: boot_id(lab, n) for n in lab.nodes}
    state = tmp_path / "state"
    argv = apply_args(lab, plan_file(tmp_path, OLD, "reboot"), state)
    # killed while the second node reboots (wave 2)
    going = step("driver.reload", second.name, "step-started")
    run_killed_when(argv, state, going, then=lambda: rebooting(lab, second, boots[second.name]))
    assert not step("driver.reload", second.name, "step-finished")(entries(state)), "too late"
    (run,) = list_runs(state)
    assert main(["resume", run.run_id, "--state-dir", str(state)]) == 0
    assert_upgraded(lab, kube, OLD)
    finished = [e for e in entries(state) if e.get("kind") == "step-finished"]
    for spec in lab.nodes:
        assert boot_id(lab, spec) != boots[spec.name], f"{spec.name} did not reboot"
        reload = [e for e in finished if e["node"] == spec.name and e["step"] == "driver.reload"]
        # between the install and the reboot nvidia-smi on the node saw the mismatch...
        assert MISMATCH in reload[-1]["detail"], spec.name
        assert "rebooted (boot_id" in reload[-1]["detail"], spec.name
        # ...and after it the version, with no mismatch
        assert MISMATCH not in smi(lab, spec), spec.name
