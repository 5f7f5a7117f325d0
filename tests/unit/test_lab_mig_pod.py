"""The lab's MIG manager as the GPU Operator runs it: the `nvidia-mig-manager` DaemonSet, its
pod on each MIG-capable node, the pod's log of what the manager did, and no work while the
pod or its node is down (rollout/lab/simulation/migmanager.py, migmanagerlog.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.apiserver.resources import DAEMONSETS, PODS
from rollout.lab.description import LabDescription
from rollout.lab.simulation.bootstrap import to_node
from rollout.lab.simulation.gpuoperator import (
    NOT_READY_ANNOTATION,
    OPERATOR_NAMESPACE,
    owner_daemonset,
)
from rollout.lab.simulation.miglayouts import read_layout
from rollout.lab.simulation.migmanager import FAILED_ANNOTATION
from rollout.lab.simulation.pods import is_ready
from tests.unit.test_lab_mig_manager import CONFIG, NODE, STATE, Cluster

DEPLOY = "nvidia.com/gpu.deploy.mig-manager"
MANAGER = "nvidia-mig-manager"
SUCCESS_LINES = [
    "Updating to MIG config: all-1g.5gb",
    "Asserting that the requested configuration is present in the configuration file",
    "Selected MIG configuration is valid",
    "Checking if the selected MIG config is currently applied or not",
    "Changing the 'nvidia.com/mig.config.state' node label to 'pending'",
    "Shutting down all GPU clients in Kubernetes by disabling their component-specific "
    "nodeSelector labels",
    "Waiting for the device-plugin to shutdown",
    "Waiting for the operator-validator to shutdown",
    "Applying the MIG mode change from the selected config to the node (and double checking "
    "it took effect)",
    "Applying the selected MIG config to the node",
    "Restarting all GPU clients previously shutdown in Kubernetes by reenabling their "
    "component-specific nodeSelector labels",
    "Changing the 'nvidia.com/mig.config.state' node label to 'success'",
    "MIG configuration applied successfully",
    "Successfully updated to MIG config: all-1g.5gb",
    "Waiting for change to 'nvidia.com/mig.config' label",
]


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    built = Cluster(tmp_path / NODE)
    built.run_until(lambda: manager_pod(built) is not None)
    yield built
    built.sim.stop()
    built.registry.close()


def manager_pods(cluster: Cluster) -> list[dict[str, Any]]:
    pods = cluster.registry.list_objects(PODS, OPERATOR_NAMESPACE)
    return [p for p in pods if owner_daemonset(p) == MANAGER]


def manager_pod(cluster: Cluster) -> dict[str, Any] | None:
    """The node's Ready MIG manager pod, if there is one."""
    ready = [p for p in manager_pods(cluster) if is_ready(p)]
    return ready[0] if ready else None


def manager_log(cluster: Cluster) -> list[str]:
    pod = manager_pod(cluster)
    assert pod is not None
    name = pod["metadata"]["name"]
    return cluster.registry.read_log(OPERATOR_NAMESPACE, name, None, None).splitlines()


def test_the_operator_runs_a_mig_manager_pod_on_the_mig_node(cluster: Cluster) -> None:
    daemonset = cluster.registry.get(DAEMONSETS, OPERATOR_NAMESPACE, MANAGER)
    assert daemonset["metadata"]["labels"]["app"] == MANAGER
    assert daemonset["spec"]["selector"] == {"matchLabels": {"app": MANAGER}}
    assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {DEPLOY: "true"}
    assert cluster.labels()[DEPLOY] == "true"
    [pod] = manager_pods(cluster)
    assert pod["spec"]["nodeName"] == NODE
    assert pod["metadata"]["labels"]["app"] == MANAGER
    assert pod["status"]["phase"] == "Running" and is_ready(pod)


def test_a_node_without_mig_capable_gpus_gets_no_deploy_label() -> None:
    gpu = {"index": 0, "product": "Tesla T4", "uuid": "GPU-0", "memory_mib": 15360}
    lab = LabDescription.from_dict(
        {"nodes": [{"name": "t4", "address": "127.0.9.2", "containerd": "1.7", "gpus": [gpu]}]}
    )
    labels = to_node(lab.nodes[0], 0)["metadata"]["labels"]
    assert DEPLOY not in labels and "nvidia.com/gpu.deploy.device-plugin" in labels


def test_the_pod_log_says_what_a_successful_change_did(cluster: Cluster) -> None:
    assert cluster.configure("all-1g.5gb") == "success"
    assert manager_log(cluster)[-len(SUCCESS_LINES) :] == SUCCESS_LINES


def test_the_pod_log_says_a_layout_the_gpus_have_is_applied(cluster: Cluster) -> None:
    assert cluster.configure("all-disabled-again") == "failed"  # unknown to the ConfigMap
    log = manager_log(cluster)
    assert "Unable to validate the selected MIG configuration" in log
    assert log[-1] == "Error: unable to update to MIG config all-disabled-again: exit status 1"
    assert cluster.configure("all-disabled") == "success"
    assert manager_log(cluster)[-5:-2] == [
        "Selected MIG configuration currently applied",
        "Changing the 'nvidia.com/mig.config.state' node label to 'success'",
        "MIG configuration applied successfully",
    ]


def test_the_pod_log_says_why_a_change_failed(cluster: Cluster) -> None:
    cluster.annotate({FAILED_ANNOTATION: "mig-parted: failed to create GPU instance"})
    assert cluster.configure("all-3g.20gb") == "failed"
    assert manager_log(cluster)[-5:] == [
        "Error: mig-parted: failed to create GPU instance",
        "Unable to apply MIG config",
        "Restarting all GPU clients previously shutdown in Kubernetes by reenabling their "
        "component-specific nodeSelector labels",
        "Changing the 'nvidia.com/mig.config.state' node label to 'failed'",
        "Error: unable to update to MIG config all-3g.20gb: exit status 1",
    ]
    log = manager_log(cluster)
    change = log[log.index("Updating to MIG config: all-3g.20gb") :]
    assert "MIG configuration applied successfully" not in change


def test_nothing_applies_while_the_manager_pod_is_gone(cluster: Cluster) -> None:
    cluster.label({DEPLOY: "false"})
    cluster.run_until(lambda: not manager_pods(cluster))
    cluster.label({CONFIG: "all-1g.5gb"})
    for _ in range(20):
        cluster.step()
    assert cluster.labels()[STATE] == "success"
    assert read_layout(cluster.root).config != "all-1g.5gb"
    cluster.label({DEPLOY: "true"})  # the pod comes back and takes the label up
    cluster.run_until(lambda: cluster.labels()[STATE] == "pending")
    cluster.run_until(lambda: cluster.labels()[STATE] == "success")
    assert read_layout(cluster.root).config == "all-1g.5gb"
    assert manager_log(cluster)[-len(SUCCESS_LINES) :] == SUCCESS_LINES


def test_nothing_applies_while_the_node_is_not_ready(cluster: Cluster) -> None:
    cluster.annotate({NOT_READY_ANNOTATION: "true"})
    cluster.step()
    cluster.label({CONFIG: "all-1g.5gb"})
    for _ in range(20):
        cluster.step()
    assert cluster.labels()[STATE] == "success"
    assert read_layout(cluster.root).config != "all-1g.5gb"
    cluster.annotate({NOT_READY_ANNOTATION: None})
    cluster.run_until(lambda: cluster.labels()[STATE] == "pending")
    cluster.run_until(lambda: cluster.labels()[STATE] == "success")
    assert read_layout(cluster.root).config == "all-1g.5gb"
