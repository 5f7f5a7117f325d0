"""Host driver upgrades from a fresh lab, as a user runs them: `rollout lab up` state untouched
(the GPU Operator's driver pods run on the nodes, every deploy label `true`), the plan's
policy the default one but for the reload mode, both reload modes in both directions: to
versions the lab did not start from and back to the one it did. Each run must converge, and
then each node's nvidia-smi and what the smoke pod (run through the node's own containerd,
runtime class `nvidia`) reported must both be the target, the node uncordoned.

The tests share one 2-node lab and run in order, each starting where the previous left it:
535 -> 550.127.05 by reboot, back by reboot, 535 -> 550.144.03 by module reload killed
(-9) during driver.unload and resumed, back by module reload.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab import image
from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.nodes import NodeSpec
from rollout.run import list_runs
from rollout.transports.kube import KubeClient
from tests.lab.labapi import apply_args
from tests.lab.test_cluster_shared import own_lab, ssh_check, ssh_run
from tests.lab.test_driver_host import entries, package, run_killed_when, smi, step

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

START = image.INSTALLED_DRIVER
TARGETS = tuple(v for v in image.DRIVER_VERSIONS if v != START)
PACKAGE = image.DRIVER_PACKAGE
DRIVER_DEPLOY = "nvidia.com/gpu.deploy.driver"
SMOKE_DRIVER = re.compile(r"; driver (\S+)$")
# A stop of nvidia-persistenced that waits while HOLD_FILE exists: driver.unload held mid-way.
HOLD_FILE = "/run/rollout-test-hold-unload"
HOLD_DROP_IN = "/run/systemd/system/nvidia-persistenced.service.d/hold.conf"
HOLD_UNIT = f"[Service]\nExecStop=/bin/sh -c 'while [ -e {HOLD_FILE} ]; do sleep 0.2; done'\n"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    where = tmp_path_factory.mktemp("driverdirections") / "lab"
    with own_lab(where, ("1.6", "2.1"), 2) as built:
        yield built


@pytest.fixture(scope="module")
def kube(lab: Lab) -> Iterator[KubeClient]:
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as client:
        yield client


def plan_file(directory: Path, version: str, reload: str | None) -> Path:
    """The issue's plan: default policy, `reload` only when not the default."""
    driver = f"\n  driver: {{reload: {reload}}}" if reload else ""
    path = directory / f"driver-{version}-{reload or 'default'}.yaml"
    path.write_text(
        f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: driver-directions}}
targets: {{selector: "nvidia.com/gpu.present=true"}}
changes:
  - driver-upgrade: {{version: "{version}", mode: host, packages: [{PACKAGE}]}}
policy:
  waves: [1, "50%"]
  max_unavailable: 2{driver}
"""
    )
    return path


def smoke_drivers(state: Path) -> dict[str, str]:
    """node -> the driver its smoke pod reported, from the last run's journal."""
    found: dict[str, str] = {}
    for entry in entries(state):
        if entry.get("step") == "gpu.smoke" and entry.get("kind") == "step-finished":
            match = SMOKE_DRIVER.search(str(entry.get("detail") or ""))
            found[str(entry["node"])] = match.group(1) if match else "(none)"
    return found


def assert_converged(lab: Lab, kube: KubeClient, state: Path, version: str) -> None:
    assert smoke_drivers(state) == {n.name: version for n in lab.nodes}
    for spec in lab.nodes:
        assert smi(lab, spec) == version, spec.name
        assert package(lab, spec) == f"{version}-1 hi", spec.name
        node = kube.get_node(spec.name)
        assert not node.unschedulable, spec.name
        assert node.allocatable.get("nvidia.com/gpu") == str(len(spec.gpus)), spec.name
        # GFD labels the driver NVML reads on the node, not the driver pod's last version
        assert node.labels.get("nvidia.com/cuda.driver-version.full") == version, spec.name


def apply(lab: Lab, plan: Path, state: Path) -> int:
    return main(apply_args(lab, plan, state))


def test_a_fresh_lab_runs_the_operators_driver_pods(lab: Lab, kube: KubeClient) -> None:
    for spec in lab.nodes:
        assert smi(lab, spec) == START
        assert kube.get_node(spec.name).labels[DRIVER_DEPLOY] == "true"


def test_reboot_to_a_version_the_lab_did_not_start_from(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert apply(lab, plan_file(tmp_path, TARGETS[0], None), state) == 0
    assert_converged(lab, kube, state, TARGETS[0])
    # the operator's driver container found the host's driver and stood down, as the real
    # driver manager does, instead of putting the ClusterPolicy's version back
    for spec in lab.nodes:
        assert kube.get_node(spec.name).labels[DRIVER_DEPLOY] == "pre-installed"


def test_reboot_back_to_the_version_the_lab_started_from(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert apply(lab, plan_file(tmp_path, START, None), state) == 0
    assert_converged(lab, kube, state, START)


def hold_unload(node: NodeSpec, lab: Lab) -> None:
    script = (
        f"mkdir -p {Path(HOLD_DROP_IN).parent} && cat > {HOLD_DROP_IN} && "
        f"touch {HOLD_FILE} && systemctl daemon-reload"
    )
    ssh_check(lab, node, ["sh", "-c", script], stdin=HOLD_UNIT.encode())


def release_unload(node: NodeSpec, lab: Lab) -> None:
    ssh_check(lab, node, ["sh", "-c", f"rm -f {HOLD_FILE} {HOLD_DROP_IN}"])
    ssh_check(lab, node, ["systemctl", "daemon-reload"])


def persistenced_stopping(lab: Lab, node: NodeSpec) -> bool:
    result = ssh_run(lab, node, ["systemctl", "is-active", "nvidia-persistenced.service"])
    return result.stdout.strip() == "deactivating"


def test_module_reload_killed_during_unload_resumes_to_a_new_version(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    first = lab.nodes[0]
    state = tmp_path / "state"
    argv = apply_args(lab, plan_file(tmp_path, TARGETS[-1], "modules"), state)
    hold_unload(first, lab)
    unloading = step("driver.unload", first.name, "step-started")
    try:
        run_killed_when(argv, state, unloading, then=lambda: persistenced_stopping(lab, first))
    finally:
        release_unload(first, lab)
    assert not step("driver.unload", first.name, "step-finished")(entries(state))
    (run,) = list_runs(state)
    assert main(["resume", run.run_id, "--state-dir", str(state)]) == 0
    assert_converged(lab, kube, state, TARGETS[-1])


def test_module_reload_back_to_the_version_the_lab_started_from(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    assert apply(lab, plan_file(tmp_path, START, "modules"), state) == 0
    assert_converged(lab, kube, state, START)
