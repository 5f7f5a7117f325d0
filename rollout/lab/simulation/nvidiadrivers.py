"""The GPU Operator's NVIDIADriver controller (controllers/nvidiadriver_controller.go), as far
as rollout can tell: which nodes each NVIDIADriver serves and its driver DaemonSet.

With the ClusterPolicy's `spec.driver.useNvidiaDriverCRD: true` the ClusterPolicy's own driver
DaemonSet goes (its pods with it) and each NVIDIADriver gets one:

- the nodes its `nodeSelector` matches (none: every `nvidia.com/gpu.present=true` node) are
  labelled `nvidia.com/gpu.driver.managed-by=<name>`; a node already managed by another
  existing resource that still selects it keeps that one, and a resource with a selector
  takes precedence over the default one (no selector);
- its DaemonSet, named `nvidia-gpu-driver-<os>-<hash of the resource's uid>` and owned by the
  resource, runs on `managed-by=<name>` nodes with `nvidia.com/gpu.deploy.driver=true`, is
  `OnDelete`, and carries `app.kubernetes.io/component=nvidia-driver`, by which the upgrade
  controller finds every driver pod; `spec.version` becomes its image tag and DRIVER_VERSION,
  so a version change is a new template revision for that DaemonSet's nodes only;
- `status.state` is `ready` once every pod of the DaemonSet is ready, else `notReady`.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import DAEMONSETS, NODES, NVIDIADRIVERS
from rollout.lab.simulation.clusterpolicy import set_container_env
from rollout.lab.simulation.daemonsets import owned_by
from rollout.lab.simulation.gpuoperator import (
    DEFAULT_DRIVER_NODE_SELECTOR,
    DRIVER,
    DRIVER_COMPONENT,
    DRIVER_COMPONENT_LABEL,
    DRIVER_MANAGED_BY_LABEL,
    DRIVER_VERSION_ENV,
    NODE_OS_VERSION,
    OPERATOR_NAMESPACE,
    to_daemonset,
    uses_driver_crd,
)


def node_selector_of(driver: Mapping[str, Any]) -> dict[str, str]:
    """The nodes an NVIDIADriver asks for (GetNodeSelector: every GPU node by default)."""
    selector = (driver.get("spec") or {}).get("nodeSelector") or {}
    return dict(selector) or dict(DEFAULT_DRIVER_NODE_SELECTOR)


def driver_image_of(driver: Mapping[str, Any]) -> str:
    """<repository>/<image>:<version>-<os> (GetImagePath)."""
    spec = driver.get("spec") or {}
    repository, image = spec.get("repository") or "", spec.get("image") or "driver"
    path = f"{repository}/{image}" if repository else str(image)
    return f"{path}:{spec.get('version') or ''}-{NODE_OS_VERSION}"


def daemonset_name_of(driver: Mapping[str, Any]) -> str:
    """getDriverAppName: nvidia-<driverType>-driver-<os>-<hash of the uid>."""
    kind = (driver.get("spec") or {}).get("driverType") or "gpu"
    digest = hashlib.sha256(str(driver["metadata"]["uid"]).encode()).hexdigest()[:8]
    return f"nvidia-{kind}-driver-{NODE_OS_VERSION}-{digest}"


def to_driver_daemonset(driver: Mapping[str, Any]) -> dict[str, Any]:
    """The DaemonSet the operator renders for one NVIDIADriver (state-driver manifests)."""
    name = daemonset_name_of(driver)
    version = str((driver.get("spec") or {}).get("version") or "")
    daemonset = to_daemonset(DRIVER, version)
    labels = {"app": name, DRIVER_COMPONENT_LABEL: DRIVER_COMPONENT}
    metadata = daemonset["metadata"]
    metadata.update({"name": name, "labels": dict(labels)})
    metadata["ownerReferences"] = [
        {
            "apiVersion": "nvidia.com/v1alpha1",
            "kind": "NVIDIADriver",
            "name": driver["metadata"]["name"],
            "uid": driver["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec = daemonset["spec"]
    spec["selector"] = {"matchLabels": {"app": name}}
    spec["template"]["metadata"]["labels"] = dict(labels)
    pod = spec["template"]["spec"]
    pod["nodeSelector"] = {
        DRIVER_MANAGED_BY_LABEL: driver["metadata"]["name"],
        DRIVER.deploy_label: "true",
    }
    pod["serviceAccountName"] = f"nvidia-gpu-driver-{driver['metadata']['name']}"
    pod["containers"][0]["image"] = driver_image_of(driver)
    return daemonset


@dataclass(eq=False)
class NVIDIADriverController:
    """Keeps one driver DaemonSet per NVIDIADriver and the nodes' managed-by labels."""

    registry: Registry

    def reconcile(self, cluster_policy: Mapping[str, Any] | None) -> None:
        if not uses_driver_crd(cluster_policy):
            return
        if self.registry.find(DAEMONSETS, OPERATOR_NAMESPACE, DRIVER.name) is not None:
            # the ClusterPolicy no longer runs the driver; its pods go with its DaemonSet
            self.registry.delete(DAEMONSETS, OPERATOR_NAMESPACE, DRIVER.name)
        drivers = self.registry.list_objects(NVIDIADRIVERS)
        self._label_nodes(drivers)
        daemonsets = self.registry.list_objects(DAEMONSETS, OPERATOR_NAMESPACE)
        for driver in drivers:
            try:
                self._reconcile_one(driver, daemonsets)
            except ApiError:
                continue  # raced with a client's write; the next tick sees the new state

    def _label_nodes(self, drivers: Sequence[Mapping[str, Any]]) -> None:
        # resources with a selector first: the default one has the lowest precedence
        ordered = sorted(
            drivers, key=lambda d: (not (d.get("spec") or {}).get("nodeSelector"), _name(d))
        )
        selectors = {_name(d): node_selector_of(d) for d in ordered}
        for node in self.registry.list_objects(NODES):
            labels = node["metadata"].get("labels") or {}
            current = labels.get(DRIVER_MANAGED_BY_LABEL)
            if current in selectors and _matches(selectors[current], labels):
                continue
            wanted = next((n for n, s in selectors.items() if _matches(s, labels)), None)
            if wanted != current:
                self._set_managed_by(node["metadata"]["name"], wanted)

    def _set_managed_by(self, node: str, driver: str | None) -> None:
        def change(n: dict[str, Any]) -> None:
            labels = n["metadata"].setdefault("labels", {})
            if driver is None:
                labels.pop(DRIVER_MANAGED_BY_LABEL, None)
            else:
                labels[DRIVER_MANAGED_BY_LABEL] = driver

        # a race with a client's write is seen in the new state on the next tick
        with contextlib.suppress(ApiError):
            self.registry.mutate(NODES, None, node, change)

    def _reconcile_one(
        self, driver: Mapping[str, Any], daemonsets: Sequence[Mapping[str, Any]]
    ) -> None:
        uid = driver["metadata"]["uid"]
        owned = next((d for d in daemonsets if owned_by(d, uid)), None)
        if owned is None:
            self.registry.create(DAEMONSETS, OPERATOR_NAMESPACE, to_driver_daemonset(driver))
            return
        version = str((driver.get("spec") or {}).get("version") or "")
        set_container_env(
            self.registry,
            owned["metadata"]["name"],
            {DRIVER_VERSION_ENV: version},
            image=driver_image_of(driver),
        )
        self._write_status(driver, owned)

    def _write_status(self, driver: Mapping[str, Any], daemonset: Mapping[str, Any]) -> None:
        status = daemonset.get("status") or {}
        desired = status.get("desiredNumberScheduled", 0)
        ready = desired > 0 and status.get("numberReady") == desired
        wanted = {"state": "ready" if ready else "notReady", "namespace": OPERATOR_NAMESPACE}
        if {k: (driver.get("status") or {}).get(k) for k in wanted} == wanted:
            return

        def write(d: dict[str, Any]) -> None:
            d["status"] = {**copy.deepcopy(d.get("status") or {}), **wanted}

        self.registry.mutate(NVIDIADRIVERS, None, _name(driver), write)


def _name(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["name"])


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
