"""The lab's driver behaviour, through the real parts: systemd, sshd, apt and dpkg on a node.

One lab of its own (one node): the tests reboot it, unload its stand-in modules and install
driver packages. docs/lab.md "Drivers in the lab" is the contract these tests hold.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.lab.cluster import Lab
from rollout.lab.nodes import read_node_pid, read_supervisor_pid
from tests.lab.test_cluster_shared import own_lab, ssh_check, ssh_run

pytestmark = pytest.mark.lab

BOOT_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("driverlab") / "lab", ("1.7",), 2) as built:
        yield built


def boot_id(lab: Lab) -> str:
    return ssh_check(lab, lab.nodes[0], ["cat", "/proc/sys/kernel/random/boot_id"]).strip()


def wait_rebooted(lab: Lab, old_boot_id: str) -> str:
    """Wait until the node answers SSH with another boot_id and systemd has finished booting."""
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        result = ssh_run(
            lab,
            lab.nodes[0],
            ["sh", "-c", "cat /proc/sys/kernel/random/boot_id; systemctl is-system-running --wait"],
        )
        lines = result.stdout.split()
        if lines and lines[0] != old_boot_id and lines[-1] == "running":
            return lines[0]
        time.sleep(0.5)
    raise AssertionError(f"{lab.nodes[0].name} did not come back within {BOOT_TIMEOUT_S:g}s")


def test_reboot_keeps_the_node_and_gives_a_new_boot(lab: Lab) -> None:
    node = lab.nodes[0]
    dirs = lab.node_dirs(node)
    before_pid = read_node_pid(node, dirs)
    supervisor = read_supervisor_pid(node, dirs)
    host_key = Path(dirs.host_path("/etc/ssh/ssh_host_ed25519_key.pub")).read_text()
    old = boot_id(lab)
    ssh_check(lab, node, ["sh", "-c", "echo kept > /var/tmp/kept; echo gone > /run/gone"])

    ssh_run(lab, node, ["systemctl", "reboot"])
    new = wait_rebooted(lab, old)

    # Real sshd with strict known_hosts answered: same address, same host key.
    assert new != old
    assert Path(dirs.host_path("/etc/ssh/ssh_host_ed25519_key.pub")).read_text() == host_key
    files = ssh_run(lab, node, ["cat", "/var/tmp/kept", "/run/gone"])
    assert files.stdout == "kept\n" and "/run/gone: No such file" in files.stderr
    assert ssh_check(lab, node, ["systemctl", "is-active", "containerd"]).strip() == "active"
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
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while read_supervisor_pid(node, dirs) is not None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert read_supervisor_pid(node, dirs) is None
    assert read_node_pid(node, dirs) is None
    assert "node rebooted" not in dirs.console_log.read_text().split("exited 133")[-1]
