"""The lab's NVIDIADriver controller with the upgrade controller: one driver DaemonSet per
resource, nodes picked by its nodeSelector, and a version change that upgrades only that
resource's nodes, through the same skip label and states as the ClusterPolicy's driver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rollout.lab.apiserver.patches import PatchType
from rollout.lab.apiserver.resources import DAEMONSETS, NODES, NVIDIADRIVERS, PODS
from rollout.lab.apiserver.tables import to_table
from rollout.lab.simulation.driverpods import INSTALLED_ANNOTATION
from rollout.lab.simulation.gpuoperator import (
    DRIVER_MANAGED_BY_LABEL,
    OPERATOR_NAMESPACE,
    to_nvidia_driver,
)
from tests.unit.test_upgrade_sim import NEW, NODE_NAMES, OLD, SKIP, Cluster

POOL = "lab.rollout/driver-pool"
POOLS = {"pool-a": ("n1", "n2"), "pool-b": ("n3", "n4")}


@pytest.fixture()
def pooled() -> Iterator[Cluster]:
    """The cluster with its drivers handed to two NVIDIADrivers, settled."""
    cluster = Cluster()
    for pool, nodes in POOLS.items():
        for node in nodes:
            cluster.label(node, {POOL: pool})
        cluster.registry.create(NVIDIADRIVERS, None, to_nvidia_driver(pool, OLD, {POOL: pool}))
    cluster.policy({"useNvidiaDriverCRD": True})
    cluster.run_until(lambda: all(settled(cluster, n, OLD) for n in NODE_NAMES))
    yield cluster
    cluster.registry.close()


def driver_daemonsets(cluster: Cluster) -> dict[str, dict[str, Any]]:
    """The NVIDIADriver DaemonSets by the resource that owns them."""
    return {
        d["metadata"]["ownerReferences"][0]["name"]: d
        for d in cluster.registry.list_objects(DAEMONSETS, OPERATOR_NAMESPACE)
        if d["metadata"].get("ownerReferences")
    }


def pod_on(cluster: Cluster, node: str) -> dict[str, Any] | None:
    pods = [
        p
        for p in cluster.registry.list_objects(PODS, OPERATOR_NAMESPACE)
        if p["spec"].get("nodeName") == node
        and p["metadata"]["name"].startswith("nvidia-gpu-driver-")
        and not p["metadata"].get("deletionTimestamp")
    ]
    return pods[0] if pods else None


def settled(cluster: Cluster, node: str, version: str) -> bool:
    pod = pod_on(cluster, node)
    installed = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(INSTALLED_ANNOTATION)
    return cluster.state(node) == "upgrade-done" and installed == version


def test_each_resource_gets_a_daemonset_on_the_nodes_it_selects(pooled: Cluster) -> None:
    daemonsets = driver_daemonsets(pooled)
    assert sorted(daemonsets) == ["pool-a", "pool-b"]
    assert pooled.registry.find(DAEMONSETS, OPERATOR_NAMESPACE, "nvidia-driver-daemonset") is None
    for pool, nodes in POOLS.items():
        daemonset = daemonsets[pool]
        assert daemonset["metadata"]["name"].startswith("nvidia-gpu-driver-debian12-")
        assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
        assert daemonset["spec"]["template"]["spec"]["nodeSelector"] == {
            DRIVER_MANAGED_BY_LABEL: pool,
            "nvidia.com/gpu.deploy.driver": "true",
        }
        for node in nodes:
            labels = pooled.registry.get(NODES, None, node)["metadata"]["labels"]
            assert labels[DRIVER_MANAGED_BY_LABEL] == pool
            pod = pod_on(pooled, node)
            assert pod is not None
            assert pod["metadata"]["ownerReferences"][0]["uid"] == daemonset["metadata"]["uid"]
    # the resource reads ready once its DaemonSet's pods are, a tick after
    pooled.run_until(
        lambda: all(
            pooled.registry.get(NVIDIADRIVERS, None, pool).get("status")
            == {"state": "ready", "namespace": OPERATOR_NAMESPACE}
            for pool in POOLS
        )
    )


def test_a_version_change_upgrades_only_that_resources_released_nodes(pooled: Cluster) -> None:
    before = {n: pod_on(pooled, n)["metadata"]["uid"] for n in NODE_NAMES}  # type: ignore[index]
    other = driver_daemonsets(pooled)["pool-b"]["metadata"]["generation"]
    for node in NODE_NAMES:
        if node != "n1":
            pooled.label(node, {SKIP: "true"})
    pooled.registry.patch(
        NVIDIADRIVERS, None, "pool-a", PatchType.MERGE, {"spec": {"version": NEW}}
    )
    pooled.run_until(lambda: settled(pooled, "n1", NEW))
    pooled.run_until(lambda: pooled.state("n2") == "upgrade-required")
    for _ in range(20):
        pooled.step()
    # n2 is held by its skip label; pool-b's nodes are in sync with their unchanged DaemonSet
    assert pooled.state("n2") == "upgrade-required"
    assert [pooled.state(n) for n in ("n3", "n4")] == ["upgrade-done", "upgrade-done"]
    for node in ("n2", "n3", "n4"):
        assert pod_on(pooled, node)["metadata"]["uid"] == before[node]  # type: ignore[index]
    assert driver_daemonsets(pooled)["pool-b"]["metadata"]["generation"] == other
    pooled.label("n2", {SKIP: None})
    pooled.run_until(lambda: settled(pooled, "n2", NEW))
    image = driver_daemonsets(pooled)["pool-a"]["spec"]["template"]["spec"]["containers"][0]
    assert image["image"] == f"nvcr.io/nvidia/driver:{NEW}-debian12"


def test_kubectl_get_shows_the_crd_printer_columns() -> None:
    driver = {
        **to_nvidia_driver("pool-a", OLD),
        "metadata": {"name": "pool-a", "creationTimestamp": "2024-05-01T10:00:00Z"},
        "status": {"state": "ready"},
    }
    table = to_table(NVIDIADRIVERS, [driver], now_s=0.0)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Status", "Age"]
    assert table["rows"][0]["cells"] == ["pool-a", "ready", "2024-05-01T10:00:00Z"]
