"""Faults done to the lab's nodes themselves: a node killed (a power cut) and booted again.

Each is logged in the lab's faults.log like the API server's faults, with the node's name
as `where`, so a test can line a halted run up with the node death that caused it.
"""

from __future__ import annotations

import time

from rollout.lab.cluster import Lab
from rollout.lab.faults import FAULT_LOG, FaultLog, SshFault
from rollout.lab.nodes import (
    READY_TIMEOUT_S,
    NodeFailed,
    kill_node,
    start_node,
    wait_node_ready,
)


def kill_lab_node(lab: Lab, name: str) -> None:
    """Kill the node at once: no shutdown, every process of it gone, sshd included."""
    node = lab.find_node(name)
    FaultLog(lab.lab_dir / FAULT_LOG).record(name, "node", SshFault.KILLED)
    kill_node(node, lab.node_dirs(node))


def boot_node_again(lab: Lab, name: str, after_s: float = 0.0) -> None:
    """Boot a killed node again (after `after_s`), and wait until it is ready over SSH."""
    if after_s > 0:
        time.sleep(after_s)
    node = lab.find_node(name)
    dirs = lab.node_dirs(node)
    FaultLog(lab.lab_dir / FAULT_LOG).record(name, "node", SshFault.BOOTED)
    start_node(node, dirs)
    wait_node_ready(node, dirs, lab.ssh)
    # the running-config record of the last boot is still on disk: wait for this boot's
    deadline = time.monotonic() + READY_TIMEOUT_S
    while lab.ssh.run(node.address, ["systemctl", "is-active", "containerd"]).stdout.strip() != (
        "active"
    ):
        if time.monotonic() > deadline:
            raise NodeFailed(f"{name}: containerd not active {READY_TIMEOUT_S:g}s after boot")
        time.sleep(0.2)
