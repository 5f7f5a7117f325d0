"""The lab's driver behaviour, through the real parts: systemd, sshd, apt and dpkg on a node.

One lab of its own (one node, with its control plane): the tests pause its GPU operands,
unload and load its stand-in modules, install driver packages with apt (a failing one too),
reboot it and power it off. docs/lab.md "Drivers in the lab" is the contract they hold.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.lab.cluster import CONTEXT, Lab
from rollout.lab.image import (
    DRIVER_PACKAGE,
    DRIVER_VERSIONS,
    FAIL_POSTINST_FILE,
    FAILING_DRIVER,
    INSTALLED_DRIVER,
)
from rollout.lab.nodes import read_node_pid, read_supervisor_pid
from rollout.lab.simulation.gpuoperator import OPERATOR_NAMESPACE
from rollout.lab.simulation.operandholders import GPU_OPERANDS
from rollout.transports.kube import KubeClient, Pod
from tests.lab.labapi import wait_for
from tests.lab.test_cluster_shared import own_lab, ssh_check, ssh_run

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

DEPLOY = "nvidia.com/gpu.deploy."
PAUSED = "paused-for-driver-upgrade"
SETTLE_S = 30.0
BOOT_TIMEOUT_S = 60.0
NEWER, NEWEST = DRIVER_VERSIONS[1], DRIVER_VERSIONS[2]
STAND_IN_MODULES = {"nvidia", "nvidia_modeset", "nvidia_drm", "nvidia_uvm"}
CLIENTS = ("nvidia-persistenced", "nvidia-fabricmanager")
NVML_MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
NO_DRIVER = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"
VERSION_QUERY = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("driverlab") / "lab", ("1.7",), 2) as built:
        yield built


@pytest.fixture(scope="module")
def kube(lab: Lab) -> Iterator[KubeClient]:
    with KubeClient.from_kubeconfig(str(lab.kubeconfig), context=CONTEXT) as client:
        # A host-installed driver: no driver container writes the node's driver state.
        client.patch_node_labels(lab.nodes[0].name, {f"{DEPLOY}driver": "false"})
        yield client


def operand_pods(kube: KubeClient, node: str) -> list[Pod]:
    pods = kube.list_pods(OPERATOR_NAMESPACE, field_selector=f"spec.nodeName={node}")
    return [p for p in pods if any(o.name in GPU_OPERANDS for o in p.owners)]


def set_operands(kube: KubeClient, node: str, value: str, validator: str | None = None) -> None:
    labels = {f"{DEPLOY}device-plugin": value, f"{DEPLOY}operator-validator": validator or value}
    kube.patch_node_labels(node, labels)


def nvidia_refcount(lab: Lab) -> int:
    return int(lsmod(lab).get("nvidia", ["0", "0"])[1])


def boot_id(lab: Lab) -> str:
    return ssh_check(lab, lab.nodes[0], ["cat", "/proc/sys/kernel/random/boot_id"]).strip()


def wait_rebooted(lab: Lab, old_boot_id: str) -> str:
    """Wait until the node answers SSH with another boot_id, booted, containerd active."""
    script = (
        "cat /proc/sys/kernel/random/boot_id; systemctl is-system-running --wait; "
        "systemctl is-active containerd"
    )

    def new_boot_id() -> str | None:
        lines = ssh_run(lab, lab.nodes[0], ["sh", "-c", script]).stdout.split()
        if len(lines) == 3 and lines[0] != old_boot_id and lines[1:] == ["running", "active"]:
            return lines[0]
        return None

    what = f"{lab.nodes[0].name} to come back"
    return wait_for(new_boot_id, BOOT_TIMEOUT_S, what=what, interval_s=0.5)


def lsmod(lab: Lab) -> dict[str, list[str]]:
    """lsmod's stand-in lines of the node: module -> [size, refcount, holders...]."""
    lines = ssh_check(lab, lab.nodes[0], ["lsmod"]).splitlines()
    assert lines[0].split() == ["Module", "Size", "Used", "by"]
    fields = [line.split() for line in lines[1:]]
    return {f[0]: f[1:] for f in fields if f[0] in STAND_IN_MODULES}


def driver_version(lab: Lab) -> str:
    return ssh_check(lab, lab.nodes[0], VERSION_QUERY).splitlines()[0]


def test_paused_operands_leave_the_node_and_release_the_module(lab: Lab, kube: KubeClient) -> None:
    node = lab.nodes[0].name
    # nvidia: 2 dependents, persistenced, fabric manager, device plugin and validator.
    wait_for(lambda: nvidia_refcount(lab) == 6, SETTLE_S, what="6 users of nvidia")
    assert {p.phase for p in operand_pods(kube, node)} == {"Running"}

    set_operands(kube, node, PAUSED, validator="false")
    wait_for(lambda: not operand_pods(kube, node), SETTLE_S, what="the operand pods to leave")
    # A pod leaves the API once its container stopped: the module is released already.
    assert nvidia_refcount(lab) == 4

    set_operands(kube, node, "true")
    wait_for(
        lambda: [p.phase for p in operand_pods(kube, node)] == ["Running", "Running"],
        SETTLE_S,
        what="the operand pods to come back",
    )
    wait_for(lambda: nvidia_refcount(lab) == 6, SETTLE_S, what="the operands to hold nvidia")


def test_unload_waits_for_gpu_clients_and_a_reload_ends_the_mismatch(
    lab: Lab, kube: KubeClient
) -> None:
    node = lab.nodes[0]
    assert driver_version(lab) == INSTALLED_DRIVER
    set_operands(kube, node.name, PAUSED)
    wait_for(lambda: not operand_pods(kube, node.name), SETTLE_S, what="operands to leave")
    modules = lsmod(lab)
    # Two dependents and the two GPU-client units hold nvidia.
    assert modules["nvidia"][1:] == ["4", "nvidia_uvm,nvidia_modeset"]
    assert modules["nvidia_modeset"][1:] == ["1", "nvidia_drm"]
    refused = ssh_run(lab, node, ["rmmod", "nvidia"])
    assert refused.exit_code == 1
    assert "rmmod: ERROR: Module nvidia is in use by: nvidia_uvm nvidia_modeset" in refused.stderr
    refused = ssh_run(lab, node, ["modprobe", "-r", "nvidia_modeset"])
    assert (refused.exit_code, refused.stderr) == (
        1,
        "modprobe: FATAL: Module nvidia_modeset is in use.\n",
    )

    # A package upgrade under the loaded module: library and module disagree.
    ssh_check(lab, node, ["apt-get", "-q", "update"])
    ssh_check(lab, node, ["apt-get", "-y", "-q", "install", f"{DRIVER_PACKAGE}={NEWER}-1"])
    mismatch = ssh_run(lab, node, ["nvidia-smi", "-L"])
    assert mismatch.exit_code == 18 and mismatch.stdout.startswith(NVML_MISMATCH + "\n")
    restart = ssh_run(lab, node, ["systemctl", "restart", "nvidia-persistenced"])
    assert restart.exit_code != 0  # a GPU client does not start against the old module

    # Only dependents gone, fabric manager still holds the module.
    ssh_check(lab, node, ["rmmod", "nvidia_drm", "nvidia_modeset", "nvidia_uvm"])
    held = ssh_run(lab, node, ["rmmod", "nvidia"])
    assert (held.exit_code, held.stderr) == (1, "rmmod: ERROR: Module nvidia is in use\n")
    assert lsmod(lab)["nvidia"][1:] == ["1"]
    ssh_check(lab, node, ["systemctl", "stop", *CLIENTS])
    ssh_check(lab, node, ["rmmod", "nvidia"])
    assert lsmod(lab) == {}
    gone = ssh_run(lab, node, ["nvidia-smi", "-L"])
    assert gone.exit_code == 9 and gone.stdout.startswith(NO_DRIVER)

    ssh_check(lab, node, ["modprobe", "-a", "nvidia_drm", "nvidia_uvm"])
    assert set(lsmod(lab)) == STAND_IN_MODULES
    assert driver_version(lab) == NEWER
    ssh_check(lab, node, ["systemctl", "start", *CLIENTS])
    assert lsmod(lab)["nvidia"][1] == "4"
    set_operands(kube, node.name, "true")
    wait_for(lambda: nvidia_refcount(lab) == 6, SETTLE_S, what="the operands to hold nvidia")


def apt_status(lab: Lab) -> str:
    """dpkg's want/state words and the version of the driver package."""
    query = ["dpkg-query", "-W", "-f", "${Status} ${Version}", DRIVER_PACKAGE]
    return ssh_check(lab, lab.nodes[0], query)


def test_failing_package_fails_in_apt_and_leaves_the_old_driver_working(lab: Lab) -> None:
    node = lab.nodes[0]
    policy = ssh_check(lab, node, ["apt-cache", "policy", DRIVER_PACKAGE])
    offered = [line.split()[-2] for line in policy.splitlines() if line.strip().endswith("500")]
    assert sorted(offered) == sorted(f"{v}-1" for v in (*DRIVER_VERSIONS, FAILING_DRIVER))
    assert f"Candidate: {NEWEST}-1" in policy  # the failing version is never apt's candidate
    assert driver_version(lab) == NEWER

    install = ["apt-get", "-y", "-q", "--allow-downgrades", "install"]
    failed = ssh_run(lab, node, [*install, f"{DRIVER_PACKAGE}={FAILING_DRIVER}-1"])
    assert failed.exit_code == 100
    assert "E: Sub-process /usr/bin/dpkg returned an error code (1)" in failed.stderr
    dpkg_says = "installed nvidia-driver-standin package post-installation script subprocess"
    assert f"{dpkg_says} returned error exit status 1" in failed.stdout + failed.stderr
    assert apt_status(lab) == f"install ok half-configured {FAILING_DRIVER}-1"
    # The library was never switched: the loaded driver still answers.
    assert driver_version(lab) == NEWER

    # Going back is a plain (down)grade, and a hold is apt's own.
    ssh_check(lab, node, [*install, f"{DRIVER_PACKAGE}={NEWER}-1"])
    assert apt_status(lab) == f"install ok installed {NEWER}-1"
    ssh_check(lab, node, ["apt-mark", "hold", DRIVER_PACKAGE])
    assert ssh_check(lab, node, ["apt-mark", "showhold"]).split() == [DRIVER_PACKAGE]
    held = ssh_run(lab, node, [*install, f"{DRIVER_PACKAGE}={NEWEST}-1"])
    assert held.exit_code == 100 and "Held packages were changed" in held.stderr
    ssh_check(lab, node, ["apt-mark", "unhold", DRIVER_PACKAGE])

    # The per-node knob fails any version's postinst (a node whose module build fails).
    ssh_check(lab, node, ["touch", FAIL_POSTINST_FILE])
    knob = ssh_run(lab, node, [*install, f"{DRIVER_PACKAGE}={NEWEST}-1"])
    ssh_check(lab, node, ["rm", FAIL_POSTINST_FILE])
    assert knob.exit_code == 100 and f"{FAIL_POSTINST_FILE} exists" in knob.stdout + knob.stderr
    assert driver_version(lab) == NEWER
    ssh_check(lab, node, [*install, f"{DRIVER_PACKAGE}={NEWER}-1"])
    assert apt_status(lab) == f"install ok installed {NEWER}-1"


def test_reboot_keeps_the_node_and_gives_a_new_boot(lab: Lab) -> None:
    node = lab.nodes[0]
    dirs = lab.node_dirs(node)
    before_pid = read_node_pid(node, dirs)
    supervisor = read_supervisor_pid(node, dirs)
    host_key = Path(dirs.host_path("/etc/ssh/ssh_host_ed25519_key.pub")).read_text()
    old = boot_id(lab)
    ssh_check(lab, node, ["sh", "-c", "echo kept > /var/tmp/kept; echo gone > /run/gone"])
    # An upgrade under the loaded module; the reboot loads the installed version.
    ssh_check(lab, node, ["apt-get", "-y", "-q", "install", f"{DRIVER_PACKAGE}={NEWEST}-1"])
    assert ssh_run(lab, node, ["nvidia-smi", "-L"]).exit_code == 18

    ssh_run(lab, node, ["systemctl", "reboot"])
    new = wait_rebooted(lab, old)

    # Real sshd with strict known_hosts answered: same address, same host key.
    assert new != old
    assert Path(dirs.host_path("/etc/ssh/ssh_host_ed25519_key.pub")).read_text() == host_key
    files = ssh_run(lab, node, ["cat", "/var/tmp/kept", "/run/gone"])
    assert files.stdout == "kept\n" and "/run/gone: No such file" in files.stderr
    # containerd was active (wait_rebooted); the toolkit's unit may restart it meanwhile.
    assert ssh_check(lab, node, ["systemctl", "is-active", *CLIENTS]).split() == ["active"] * 2
    assert set(lsmod(lab)) == STAND_IN_MODULES
    assert driver_version(lab) == NEWEST
    # The lab's record follows the new boot's nspawn; the same supervisor keeps it.
    after_pid = read_node_pid(node, dirs)
    assert after_pid is not None and after_pid != before_pid
    assert read_supervisor_pid(node, dirs) == supervisor


def test_poweroff_stays_down(lab: Lab) -> None:
    """Last in this module: the node powers off and nothing boots it again."""
    node = lab.nodes[0]
    dirs = lab.node_dirs(node)
    supervisor = read_supervisor_pid(node, dirs)
    assert supervisor is not None
    ssh_run(lab, node, ["systemctl", "poweroff"])
    wait_for(
        lambda: read_supervisor_pid(node, dirs) is None,
        BOOT_TIMEOUT_S,
        what=f"{node.name}'s supervisor to exit",
        interval_s=0.2,
    )
    assert read_node_pid(node, dirs) is None
    assert "node rebooted" not in dirs.console_log.read_text().split("exited 133")[-1]
