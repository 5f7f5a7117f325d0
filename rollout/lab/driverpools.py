"""`rollout lab driver-pools`: hand the lab's drivers to NVIDIADriver resources, one per pool.

What an operator does on a real cluster to run different drivers per node pool: label the
nodes of each pool, create one NVIDIADriver per pool whose nodeSelector names that label (all
at the version the ClusterPolicy runs today), then set the ClusterPolicy's
`spec.driver.useNvidiaDriverCRD: true`. The simulated operator then replaces the
ClusterPolicy's driver DaemonSet with one per resource (rollout/lab/simulation/nvidiadrivers.py;
NVIDIA: "existing driver pods are terminated immediately and redeployed"), and this waits
until every pooled node runs a Ready driver pod of its pool and the upgrade controller has
judged it `upgrade-done`. Everything goes through the API, as `kubectl` would.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from rollout.lab.scenarios import LabAccess, ScenarioFailed
from rollout.lab.simulation.gpuoperator import (
    CLUSTER_POLICY_NAME,
    DRIVER_COMPONENT,
    DRIVER_COMPONENT_LABEL,
    DRIVER_MANAGED_BY_LABEL,
    OPERATOR_NAMESPACE,
    UPGRADE_STATE_LABEL,
    to_nvidia_driver,
)

# The node label each pool's NVIDIADriver selects (a label of the lab's, as any pool label is)
POOL_LABEL = "lab.rollout/driver-pool"
NVIDIADRIVERS_PATH = "/apis/nvidia.com/v1alpha1/nvidiadrivers"
SETTLE_TIMEOUT_S = 120.0
POLL_S = 0.5


def split_driver_pools(
    access: LabAccess, pools: Mapping[str, Sequence[str]], timeout_s: float = SETTLE_TIMEOUT_S
) -> None:
    """One NVIDIADriver per pool (name -> its nodes), at the ClusterPolicy's driver version."""
    known = {n.name for n in access.lab.nodes}
    unknown = sorted({n for nodes in pools.values() for n in nodes} - known)
    if unknown:
        raise ScenarioFailed(f"no such lab node: {', '.join(unknown)}")
    policy = access.kube.get_cluster_policy(CLUSTER_POLICY_NAME)
    version = str(((policy.get("spec") or {}).get("driver") or {}).get("version") or "")
    for pool, nodes in pools.items():
        for node in nodes:
            access.kube.patch_node_labels(node, {POOL_LABEL: pool})
        access.api("POST", NVIDIADRIVERS_PATH, to_nvidia_driver(pool, version, {POOL_LABEL: pool}))
    access.kube.patch_cluster_policy(
        CLUSTER_POLICY_NAME, {"spec": {"driver": {"useNvidiaDriverCRD": True}}}
    )
    members = {node: pool for pool, nodes in pools.items() for node in nodes}
    deadline = time.monotonic() + timeout_s
    while not _settled(access, members):
        if time.monotonic() > deadline:
            raise ScenarioFailed(
                f"the NVIDIADriver pools did not settle within {timeout_s:.0f}s: "
                "a pooled node has no Ready driver pod of its pool, or is not upgrade-done"
            )
        time.sleep(POLL_S)


def _settled(access: LabAccess, members: Mapping[str, str]) -> bool:
    """Each pooled node is managed by its pool, runs a Ready pod of a driver DaemonSet of the
    NVIDIADriver kind, and the upgrade controller has judged it upgrade-done."""
    pods = access.kube.list_pods(OPERATOR_NAMESPACE, f"{DRIVER_COMPONENT_LABEL}={DRIVER_COMPONENT}")
    ready = {p.node_name for p in pods if p.ready and not p.deleting}
    for node in access.kube.list_nodes():
        pool = members.get(node.name)
        if pool is None:
            continue
        if node.labels.get(DRIVER_MANAGED_BY_LABEL) != pool or node.name not in ready:
            return False
        if node.labels.get(UPGRADE_STATE_LABEL) != "upgrade-done":
            return False
    return True
