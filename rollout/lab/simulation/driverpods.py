"""The GPU Operator's driver container, as far as a node can tell: what it installs.

A driver pod the kubelet has started "installs" its DRIVER_VERSION on the node: it writes the
driver state the node's stand-in nvidia-smi reads (the library version and the loaded module),
so a driver pod restart changes what `nvidia-smi` on the node reports. The pod records the
version it installed in an annotation, so a restarted control plane does not install again
over what a host-mode test put there; the node records it too (CONTAINER_VERSION_FILE).

Before installing, a starting driver pod checks the host for a driver of its own, as the real
driver container's k8s-driver-manager does (GPU Operator 1.11.1 and later: "NVIDIA driver
container will auto-disable itself on the node with pre-installed drivers by applying label
nvidia.com/gpu.deploy.driver=pre-installed"): one found, it labels the node so, installs
nothing, and the DaemonSet no longer selects the node. A host-installed driver here is a
library the node's own packages switched to a version the driver container did not install
(the lab's node image ships the starting driver as a package, which a fresh lab's driver pods
own). So after a host-mode upgrade restores `gpu.deploy.driver=true`, the returning driver
pod stands down instead of putting the ClusterPolicy's version back over the new driver.

The lab knob `lab.rollout/fail-upgrade=true` on a node makes its driver container fail to
install: the container restarts again and again without becoming ready, as a real one whose
module build fails does, until the upgrade controller sees more than 10 restarts and labels
the node `upgrade-failed`. Removing the knob lets the next restart succeed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CLUSTERPOLICIES, NODES, PODS
from rollout.lab.simulation.gpuoperator import (
    CLUSTER_POLICY_NAME,
    DRIVER,
    FAIL_UPGRADE_ANNOTATION,
    driver_version_of,
    is_driver_pod,
)
from rollout.lab.simulation.pods import is_deleting, write_pod
from rollout.lab.simulation.podstatus import set_running

log = logging.getLogger("rollout.lab.simulation")

# What the stand-in nvidia-smi reads (rollout/lab/data/nvidia-smi), relative to a node's root.
DRIVER_VERSION_FILE = Path("usr/lib/rollout-lab/nvidia-driver/version")
MODULE_VERSION_FILE = Path("var/lib/rollout-lab/nvidia-module-version")
# What the driver container last installed on the node (absent: it never did).
CONTAINER_VERSION_FILE = Path("var/lib/rollout-lab/driver-container-version")
PRE_INSTALLED = "pre-installed"
# On the pod: the version its driver container installed on the node.
INSTALLED_ANNOTATION = "lab.rollout/driver-installed"


def write_driver_state(root: Path, version: str) -> None:
    """The node's driver library and loaded module are now `version`, the driver container's."""
    for relative in (DRIVER_VERSION_FILE, MODULE_VERSION_FILE, CONTAINER_VERSION_FILE):
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(path.name + ".lab-tmp")
        temporary.write_text(version + "\n")
        temporary.replace(path)


def read_host_driver(root: Path) -> str | None:
    """The driver the node's own packages installed over the driver container's, if any: a
    library of another version, or one a package wrote after the container's install (a
    host-mode downgrade back to the container's version is the host's driver too)."""
    library_file, container_file = root / DRIVER_VERSION_FILE, root / CONTAINER_VERSION_FILE
    library, container = _read_version(library_file), _read_version(container_file)
    if not library or not container:
        return None
    if library != container or _modified(library_file) > _modified(container_file):
        return library
    return None


def _modified(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def driver_validates(root: Path | None) -> bool:
    """What the validator's driver-validation (`nvidia-smi` on the node) needs: the loaded
    module is the library's version. A node without a root or without the stand-in driver
    files at all (a control plane without nodes) has nothing to judge."""
    if root is None:
        return True
    return _read_version(root / DRIVER_VERSION_FILE) == _read_version(root / MODULE_VERSION_FILE)


def working_driver(root: Path) -> str | None:
    """The driver version NVML (`nvidia-smi`, GPU Feature Discovery) on the node reports: the
    library's, while the loaded module is the same version; None while it cannot tell (a
    library/module mismatch, no module loaded, no stand-in driver files)."""
    library = _read_version(root / DRIVER_VERSION_FILE)
    return library if library and library == _read_version(root / MODULE_VERSION_FILE) else None


def _read_version(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def install_failure_line(version: str) -> str:
    return (
        f"Installing NVIDIA driver kernel modules {version}... "
        "ERROR: the kernel module failed to build (lab.rollout/fail-upgrade)"
    )


@dataclass(eq=False)
class DriverContainers:
    """Plays every driver pod's container: install, or fail and restart."""

    registry: Registry
    roots: Mapping[str, Path]
    restart_s: float = 0.2
    clock: Callable[[], float] = time.time
    _last_restart: dict[str, float] = field(default_factory=dict, init=False)

    def sync(self) -> None:
        policy = self.registry.find(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME) or {}
        if ((policy.get("spec") or {}).get("driver") or {}).get("enabled") is False:
            return  # host-installed drivers: the operator runs no driver container
        nodes = {n["metadata"]["name"]: n for n in self.registry.list_objects(NODES)}
        for pod in self.registry.list_objects(PODS):
            if not is_driver_pod(pod) or is_deleting(pod):
                continue
            if (pod.get("status") or {}).get("phase") != "Running":
                continue  # the kubelet has not started it
            node = nodes.get(str(pod["spec"].get("nodeName") or ""))
            if node is None:
                continue
            try:
                self._sync_pod(pod, node)
            except ApiError as error:
                log.debug("driver pod %s raced: %s", pod["metadata"]["name"], error)

    def _sync_pod(self, pod: dict[str, Any], node: Mapping[str, Any]) -> None:
        version = driver_version_of(pod) or ""
        annotations = node["metadata"].get("annotations") or {}
        installed = (pod["metadata"].get("annotations") or {}).get(INSTALLED_ANNOTATION)
        if annotations.get(FAIL_UPGRADE_ANNOTATION) == "true" and installed is None:
            self._crash(pod, version)
            return
        if installed == version:
            return
        name = node["metadata"]["name"]
        root = self.roots.get(name)
        host = read_host_driver(root) if root is not None and installed is None else None
        if host is not None:
            self._stand_down(pod, name, host)
            return
        if root is not None and version:
            write_driver_state(root, version)
        address = _internal_ip(node)
        now = self.clock()

        def finish(p: dict[str, Any]) -> None:
            if not _all_ready(p):
                set_running(p, address, None, now)
            p["metadata"].setdefault("annotations", {})[INSTALLED_ANNOTATION] = version

        write_pod(self.registry, pod, finish)
        log.info("driver container on %s installed %s", name, version)

    def _stand_down(self, pod: Mapping[str, Any], node: str, host: str) -> None:
        """The host has a driver of its own: label the node pre-installed, install nothing."""

        def label(n: dict[str, Any]) -> None:
            n["metadata"].setdefault("labels", {})[DRIVER.deploy_label] = PRE_INSTALLED

        self.registry.mutate(NODES, None, node, label)
        meta = pod["metadata"]
        line = (
            f"Host driver detected: {host}\nNVIDIA GPU driver is already pre-installed on the "
            f"node, disabling the containerized driver\nLabeling node {node} with "
            f"{DRIVER.deploy_label}={PRE_INSTALLED}\n"
        )
        self.registry.write_log(meta["namespace"], meta["name"], DRIVER.container, line)
        log.info("driver container on %s: host driver %s pre-installed, stood down", node, host)

    def _crash(self, pod: dict[str, Any], version: str) -> None:
        uid = pod["metadata"]["uid"]
        now = self.clock()
        if now - self._last_restart.get(uid, 0.0) < self.restart_s and not _all_ready(pod):
            return
        self._last_restart[uid] = now
        stamp = format_timestamp(now)
        line = install_failure_line(version)

        def crash(p: dict[str, Any]) -> None:
            status = p.setdefault("status", {})
            for condition in status.get("conditions") or []:
                if condition.get("type") in ("Ready", "ContainersReady"):
                    condition["status"] = "False"
            for entry in status.get("containerStatuses") or []:
                entry["ready"] = False
                entry["restartCount"] = int(entry.get("restartCount") or 0) + 1
                terminated = {
                    "exitCode": 1,
                    "reason": "Error",
                    "message": line,
                    "startedAt": stamp,
                    "finishedAt": stamp,
                }
                entry["state"] = {"terminated": terminated}
                entry["lastState"] = {"terminated": terminated}

        write_pod(self.registry, pod, crash)
        meta = pod["metadata"]
        self.registry.write_log(meta["namespace"], meta["name"], DRIVER.container, line + "\n")


def _all_ready(pod: Mapping[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all(s.get("ready") for s in statuses)


def _internal_ip(node: Mapping[str, Any]) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address") or "")
    return ""
