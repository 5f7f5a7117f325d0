"""The DaemonSet controller: one pod per eligible node, recreated when deleted; status counts.

It also plays the device plugin's config-manager, which runs first in every device-plugin
pod: where the node's label (or `config.default`) names a key the ConfigMap lacks, the
config-manager exits and the pod fails, so the plugin never registers; once the key or the
label is fixed, the failed pod is replaced, as the real controller replaces failed pods.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.metadata import new_name_suffix
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CLUSTERPOLICIES, CONFIGMAPS, DAEMONSETS, NODES, PODS
from rollout.lab.description import ENDPOINT_ANNOTATION
from rollout.lab.simulation.gpuoperator import (
    CLUSTER_POLICY_NAME,
    DEPLOY_LABEL_PREFIX,
    DEPLOY_OPERANDS_LABEL,
    DEVICE_PLUGIN,
    OPERATOR_NAMESPACE,
    owner_daemonset,
)
from rollout.lab.simulation.pods import is_deleting, is_ready, is_terminal
from rollout.lab.simulation.profiles import config_manager_error, config_name

TEMPLATE_GENERATION_LABEL = "pod-template-generation"
# status.reason of a device-plugin pod whose config-manager exited.
CONFIG_MANAGER_FAILED = "ConfigManagerExited"
REVISION_HASH_LABEL = "controller-revision-hash"
# The tolerations the real DaemonSet controller adds to every pod it creates.
DAEMONSET_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


def target_node(pod: Mapping[str, Any]) -> str:
    """The node a DaemonSet pod is for: bound, or pinned by its metadata.name affinity."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return ""


def owned_by(pod: Mapping[str, Any], owner_uid: str) -> bool:
    return any(r.get("uid") == owner_uid for r in pod["metadata"].get("ownerReferences") or [])


@dataclass(eq=False)
class DaemonSetController:
    """Creates, deletes and counts the pods of every DaemonSet in the cluster."""

    registry: Registry

    def reconcile(self) -> None:
        nodes = self.registry.list_objects(NODES)
        pods = self.registry.list_objects(PODS)
        for daemonset in self.registry.list_objects(DAEMONSETS):
            try:
                self._reconcile_one(daemonset, nodes, pods)
            except ApiError:
                continue  # raced with a client's write; the next tick sees the new state
        # a race with a client's write is seen in the new state on the next tick
        with contextlib.suppress(ApiError):
            self._run_config_managers()

    def _run_config_managers(self) -> None:
        """Fail the device-plugin pods whose config-manager exits; replace them once fixed."""
        policy = self.registry.find(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME)
        name = config_name(policy)
        configmap = self.registry.find(CONFIGMAPS, OPERATOR_NAMESPACE, name) if name else None
        labels = {
            n["metadata"]["name"]: n["metadata"].get("labels") or {}
            for n in self.registry.list_objects(NODES)
        }
        for pod in self.registry.list_objects(PODS):
            metadata = pod["metadata"]
            if (
                metadata.get("namespace") != OPERATOR_NAMESPACE
                or owner_daemonset(pod) != DEVICE_PLUGIN.name
                or is_deleting(pod)
            ):
                continue
            error = config_manager_error(policy, configmap, labels.get(target_node(pod), {}))
            status = pod.get("status") or {}
            failed_here = status.get("phase") == "Failed" and (
                status.get("reason") == CONFIG_MANAGER_FAILED
            )
            if error is not None and not is_terminal(pod):
                self.registry.mutate(
                    PODS,
                    OPERATOR_NAMESPACE,
                    metadata["name"],
                    functools.partial(_fail, message=error),
                )
            elif error is None and failed_here:
                self.registry.delete(PODS, OPERATOR_NAMESPACE, metadata["name"])

    def _reconcile_one(
        self, daemonset: dict[str, Any], nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
    ) -> None:
        metadata = daemonset["metadata"]
        namespace, uid = metadata["namespace"], metadata["uid"]
        eligible = {n["metadata"]["name"] for n in nodes if self._eligible(daemonset, n)}
        owned = [
            p for p in pods if p["metadata"].get("namespace") == namespace and owned_by(p, uid)
        ]
        by_node: dict[str, list[dict[str, Any]]] = {}
        for pod in owned:
            by_node.setdefault(target_node(pod), []).append(pod)
        for node_name in sorted(eligible):
            live = [p for p in by_node.get(node_name, []) if not is_deleting(p)]
            # A terminating pod blocks its replacement until it is gone, as in the real one.
            if not by_node.get(node_name):
                self._create_pod(daemonset, node_name)
            for extra in live[1:]:
                self.registry.delete(PODS, namespace, extra["metadata"]["name"])
        placement = _Placement(eligible, by_node)
        self._roll(daemonset, placement)
        for node_name, node_pods in by_node.items():
            if node_name not in eligible:
                for pod in node_pods:
                    if not is_deleting(pod):
                        self.registry.delete(PODS, namespace, pod["metadata"]["name"])
        self._write_status(daemonset, placement)

    def _roll(self, daemonset: dict[str, Any], placement: _Placement) -> None:
        """RollingUpdate with maxUnavailable 1: replace one outdated pod while all are ready."""
        strategy = (daemonset["spec"].get("updateStrategy") or {}).get("type", "RollingUpdate")
        if strategy != "RollingUpdate":
            return
        live = placement.pods_on_eligible_nodes()
        if any(is_deleting(p) or not is_ready(p) for p in live):
            return
        outdated = sorted(
            (p for p in live if not _of_current_template(p, daemonset)),
            key=lambda p: str(p["spec"].get("nodeName") or ""),
        )
        if outdated:
            pod = outdated[0]
            self.registry.delete(PODS, pod["metadata"]["namespace"], pod["metadata"]["name"])

    @staticmethod
    def _eligible(daemonset: dict[str, Any], node: dict[str, Any]) -> bool:
        if ENDPOINT_ANNOTATION in (node["metadata"].get("annotations") or {}):
            return False  # an SSH endpoint: no kubelet of its own runs pods
        labels = node["metadata"].get("labels") or {}
        selector = (daemonset["spec"]["template"].get("spec") or {}).get("nodeSelector") or {}
        if any(labels.get(k) != v for k, v in selector.items()):
            return False
        operator_operand = daemonset["metadata"]["namespace"] == OPERATOR_NAMESPACE and any(
            k.startswith(DEPLOY_LABEL_PREFIX) for k in selector
        )
        return not (operator_operand and labels.get(DEPLOY_OPERANDS_LABEL) == "false")

    def _create_pod(self, daemonset: dict[str, Any], node_name: str) -> None:
        metadata = daemonset["metadata"]
        template = copy.deepcopy(daemonset["spec"]["template"])
        generation = int(metadata.get("generation", 1))
        labels = dict((template.get("metadata") or {}).get("labels") or {})
        labels[REVISION_HASH_LABEL] = _template_hash(template)
        labels[TEMPLATE_GENERATION_LABEL] = str(generation)
        spec = template.get("spec") or {}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node_name]}
                            ]
                        }
                    ]
                }
            }
        }
        tolerations = spec.setdefault("tolerations", [])
        for toleration in DAEMONSET_TOLERATIONS:
            if toleration not in tolerations:
                tolerations.append(dict(toleration))
        pod = {
            "metadata": {
                "name": f"{metadata['name']}-{new_name_suffix()}",
                "namespace": metadata["namespace"],
                "labels": labels,
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "DaemonSet",
                        "name": metadata["name"],
                        "uid": metadata["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        self.registry.create(PODS, metadata["namespace"], pod)

    def _write_status(self, daemonset: dict[str, Any], placement: _Placement) -> None:
        eligible, by_node = placement.eligible, placement.by_node
        generation = int(daemonset["metadata"].get("generation", 1))
        scheduled = [
            p
            for p in placement.pods_on_eligible_nodes()
            if not is_deleting(p) and not is_terminal(p)
        ]
        ready = [p for p in scheduled if is_ready(p)]
        updated = [p for p in scheduled if _of_current_template(p, daemonset)]
        status: dict[str, Any] = {
            "currentNumberScheduled": len(
                {n for n in eligible if any(not is_deleting(p) for p in by_node.get(n, []))}
            ),
            "desiredNumberScheduled": len(eligible),
            "numberMisscheduled": sum(len(v) for k, v in by_node.items() if k not in eligible),
            "numberReady": len(ready),
            "numberAvailable": len(ready),
            "updatedNumberScheduled": len(updated),
            "observedGeneration": generation,
        }
        if len(eligible) - len(ready) > 0:
            status["numberUnavailable"] = len(eligible) - len(ready)
        if daemonset.get("status") == status:
            return

        def write(ds: dict[str, Any]) -> None:
            ds["status"] = status

        self.registry.mutate(
            DAEMONSETS, daemonset["metadata"]["namespace"], daemonset["metadata"]["name"], write
        )


@dataclass(frozen=True)
class _Placement:
    """Where a DaemonSet should run (its eligible nodes) and where its pods are, by node."""

    eligible: set[str]
    by_node: dict[str, list[dict[str, Any]]]

    def pods_on_eligible_nodes(self) -> list[dict[str, Any]]:
        return [p for n in self.eligible for p in self.by_node.get(n, [])]


def _of_current_template(pod: Mapping[str, Any], daemonset: Mapping[str, Any]) -> bool:
    """Whether the pod was made from the DaemonSet's current template (its generation)."""
    generation = str(daemonset["metadata"].get("generation", 1))
    labels = pod["metadata"].get("labels") or {}
    return bool(labels.get(TEMPLATE_GENERATION_LABEL) == generation)


def _fail(pod: dict[str, Any], message: str) -> None:
    status = pod.setdefault("status", {})
    status.update({"phase": "Failed", "reason": CONFIG_MANAGER_FAILED, "message": message})
    for entry in status.get("containerStatuses") or []:
        entry["ready"] = False
    for condition in status.get("conditions") or []:
        if condition.get("type") in ("Ready", "ContainersReady"):
            condition["status"] = "False"


def _template_hash(template: Mapping[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return digest[:10]
