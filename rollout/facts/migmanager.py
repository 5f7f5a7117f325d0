"""What diagnose reads of the GPU Operator's MIG manager, live, beside the other facts: the
ConfigMap of its layouts (the ClusterPolicy's migManager.config.name, default
default-mig-parted-config) and, on each node whose label asks for a layout, the log tail of
its pod there (the manager runs Ready while it reports `failed`, so the operand logs, read
of pods that are not ready, lack it). Both are read where a node asks for a layout, once."""

from __future__ import annotations

import contextlib
import dataclasses

from rollout.errors import RolloutError
from rollout.facts.migmode import CONFIG_LABEL, MANAGER_APP, MigSettings
from rollout.facts.model import FleetFacts, NodeFacts
from rollout.transports.kube import KubeClient

LOG_TAIL_LINES = 20


def with_mig_manager(kube: KubeClient, fleet: FleetFacts) -> FleetFacts:
    """`fleet` with the MIG manager's ConfigMap and its pods' log tails, where some node asks
    for a layout; as it was otherwise. What cannot be read is left out (diagnose then says
    less)."""
    if not any(CONFIG_LABEL in n.labels for n in fleet.nodes):
        return fleet
    settings = MigSettings.from_cluster_policy(fleet.cluster.cluster_policy)
    configmaps = dict(fleet.cluster.configmaps)
    if settings.configmap_key not in configmaps:
        with contextlib.suppress(RolloutError):
            found = kube.get_configmap(settings.namespace, settings.configmap)
            configmaps[settings.configmap_key] = dict(found.data)
    cluster = dataclasses.replace(fleet.cluster, configmaps=configmaps)
    nodes = tuple(_with_manager_log(kube, n) for n in fleet.nodes)
    return dataclasses.replace(fleet, nodes=nodes, cluster=cluster)


def _with_manager_log(kube: KubeClient, node: NodeFacts) -> NodeFacts:
    if CONFIG_LABEL not in node.labels:
        return node
    logs = dict(node.pod_logs)
    for pod in node.pods:
        key = f"{pod.namespace}/{pod.name}"
        if pod.labels.get("app") != MANAGER_APP or key in logs:
            continue
        with contextlib.suppress(RolloutError):
            logs[key] = kube.read_pod_log(pod.namespace, pod.name, tail_lines=LOG_TAIL_LINES)
    return dataclasses.replace(node, pod_logs=logs)
