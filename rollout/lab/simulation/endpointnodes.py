"""The Node objects of the lab's SSH endpoints (rollout.lab.endpoints): each mirrors its node.

An endpoint is the node it stands for under another name and address: its Node object
carries that node's labels (GPU feature discovery's and the operator's) and status
(conditions, capacity, allocatable), kept in step at every tick. No kubelet runs for it,
so no DaemonSet places a pod on it (rollout.lab.simulation.daemonsets) and it stays a view.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import NODES
from rollout.lab.description import ENDPOINT_ANNOTATION, EndpointDescription, LabDescription
from rollout.lab.simulation.bootstrap import to_node

HOSTNAME_LABEL = "kubernetes.io/hostname"
MIRRORED_STATUS = ("conditions", "capacity", "allocatable")


def to_endpoint_node(
    lab: LabDescription, endpoint: EndpointDescription, index: int
) -> dict[str, Any]:
    """The Node object of an endpoint as first created: its node's, renamed and readdressed."""
    served = lab.find_node(endpoint.node)
    if served is None:
        raise ValueError(f"endpoint {endpoint.name} names no node of the lab: {endpoint.node}")
    node = to_node(served, 0)
    node["metadata"]["name"] = endpoint.name
    node["metadata"]["labels"][HOSTNAME_LABEL] = endpoint.name
    node["metadata"]["annotations"][ENDPOINT_ANNOTATION] = endpoint.node
    cidr = f"10.{128 + index // 256}.{index % 256}.0/24"
    node["spec"] = {"podCIDR": cidr, "podCIDRs": [cidr]}
    node["status"]["addresses"] = [
        {"type": "InternalIP", "address": endpoint.address},
        {"type": "Hostname", "address": endpoint.name},
    ]
    return node


@dataclass(eq=False)
class EndpointNodes:
    """Keeps every endpoint's labels and status those of the node it stands for."""

    registry: Registry
    endpoints: Mapping[str, str]  # endpoint name -> node name

    def reconcile(self) -> None:
        if not self.endpoints:
            return
        nodes = {n["metadata"]["name"]: n for n in self.registry.list_objects(NODES)}
        for endpoint, served in self.endpoints.items():
            source, target = nodes.get(served), nodes.get(endpoint)
            if source is None or target is None:
                continue
            wanted = _mirrored(source, endpoint)
            if _mirrored(target, endpoint) != wanted:
                self.registry.mutate(
                    NODES, None, endpoint, functools.partial(_apply, wanted=wanted)
                )


def _mirrored(node: Mapping[str, Any], name: str) -> dict[str, Any]:
    status = node.get("status") or {}
    labels = dict(node["metadata"].get("labels") or {})
    labels[HOSTNAME_LABEL] = name
    return {"labels": labels, **{k: status.get(k) for k in MIRRORED_STATUS}}


def _apply(node: dict[str, Any], wanted: Mapping[str, Any]) -> None:
    node["metadata"]["labels"] = dict(wanted["labels"])
    status = node.setdefault("status", {})
    for key in MIRRORED_STATUS:
        status[key] = copy.deepcopy(wanted[key])


def seed_endpoint_nodes(registry: Registry, lab: LabDescription) -> None:
    """Create every endpoint's Node object; one that exists is kept."""
    for index, endpoint in enumerate(lab.endpoints):
        try:
            registry.create(NODES, None, to_endpoint_node(lab, endpoint, index))
        except ApiError as error:
            if error.code != 409:
                raise
