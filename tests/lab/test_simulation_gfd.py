"""GPU Feature Discovery's driver labels follow the driver the node really runs.

GFD reads the driver version through NVML on the node, whoever installed the driver: the
operator's driver container or the host's own packages. After a host-mode upgrade the driver
pod stands down (`nvidia.com/gpu.deploy.driver=pre-installed`), so the labels must come from
the node's library and loaded module, not from the version the driver pod last installed.
While NVML fails (the library upgraded, the old module still loaded) GFD relabels nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from rollout.lab.controlplane import ControlPlane
from rollout.lab.simulation import FixedRuntimeProbe, LabDescription
from rollout.lab.simulation.driverpods import (
    DRIVER_VERSION_FILE,
    MODULE_VERSION_FILE,
    write_driver_state,
)
from tests.lab.labapi import wait_for
from tests.lab.test_simulation import FAST, PRODUCT

NODE = "lab-node-1"
START = "535.183.01"
HOST = "550.127.05"
DRIVER_DEPLOY = "nvidia.com/gpu.deploy.driver"
DRIVER = "nvidia-driver-daemonset"
VALIDATOR = "nvidia-operator-validator"


def description(root: Path) -> LabDescription:
    gpu = {"index": 0, "product": PRODUCT, "uuid": "GPU-838f60d9", "memory_mib": 40960}
    node = {
        "name": NODE,
        "address": "127.0.1.1",
        "containerd": "1.7",
        "driver_version": START,
        "root": str(root),
        "gpus": [gpu],
    }
    return LabDescription.from_dict({"api": {"host": "127.0.0.1", "port": 0}, "nodes": [node]})


@pytest.fixture()
def core(tmp_path: Path) -> Iterator[client.CoreV1Api]:
    root = tmp_path / NODE
    write_driver_state(root, START)  # what the lab's image and driver pod start with
    probe = FixedRuntimeProbe.with_nvidia([NODE])
    with (
        ControlPlane.start(description(root), probe, port=0, timings=FAST) as plane,
        client.ApiClient(client.Configuration(host=plane.url)) as api,
    ):
        yield client.CoreV1Api(api)


def install(root: Path, relative: Path, version: str) -> None:
    (root / relative).write_text(version + "\n")


def driver_labels(core: client.CoreV1Api) -> dict[str, str]:
    labels = core.read_node(NODE).metadata.labels or {}
    return {
        k: v for k, v in labels.items() if k.startswith(("nvidia.com/cuda.driver", DRIVER_DEPLOY))
    }


def gfd(version: str, deploy: str) -> dict[str, str]:
    major, minor, revision = version.split(".")
    return {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": revision,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": revision,
        "nvidia.com/cuda.driver-version.full": version,
        DRIVER_DEPLOY: deploy,
    }


def pods(core: client.CoreV1Api, app: str) -> list[client.V1Pod]:
    return list(core.list_pod_for_all_namespaces(label_selector=f"app={app}").items)


def validator_state(core: client.CoreV1Api) -> str:
    """The validator pod's first container: `ready`, its waiting reason, or `none`."""
    live = [p for p in pods(core, VALIDATOR) if p.metadata.deletion_timestamp is None]
    statuses = (live[0].status.container_statuses or []) if live else []
    if not statuses:
        return "none"
    if statuses[0].ready:
        return "ready"
    waiting = statuses[0].state.waiting
    return str(waiting.reason) if waiting else "not ready"


def restart(core: client.CoreV1Api, app: str) -> None:
    for pod in pods(core, app):
        core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace)


def test_gfd_driver_labels_follow_a_host_installed_driver(
    core: client.CoreV1Api, tmp_path: Path
) -> None:
    root = tmp_path / NODE
    wait_for(lambda: driver_labels(core) == gfd(START, "true"), 20, what="the labels at start")
    wait_for(lambda: validator_state(core) == "ready", 20, what="the validator Ready")
    # the host's package replaces the library while the old module stays loaded: NVML fails
    # (a restarted validator's driver-validation does not pass), GFD keeps its last labels
    install(root, DRIVER_VERSION_FILE, HOST)
    restart(core, VALIDATOR)
    wait_for(lambda: validator_state(core) == "PodInitializing", 20, what="the validator held back")
    assert driver_labels(core) == gfd(START, "true")
    # the module reloaded (or the node rebooted); the driver pod restarts, finds the host's
    # driver and stands down; GFD labels the host's driver
    install(root, MODULE_VERSION_FILE, HOST)
    restart(core, DRIVER)
    wait_for(
        lambda: driver_labels(core) == gfd(HOST, "pre-installed"),
        20,
        what="GFD labels of the host's driver on a pre-installed node",
    )
    wait_for(lambda: validator_state(core) == "ready", 20, what="the validator Ready again")
    assert (root / DRIVER_VERSION_FILE).read_text().strip() == HOST  # nothing reinstalled
