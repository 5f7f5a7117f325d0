"""The Kubernetes API through the official client: the operations rollout needs, nothing more.

Every request reads the raw JSON (`calls.JsonCalls`) instead of the client's models.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client as k8s

from rollout.closeable import Closeable
from rollout.transports.errors import NotFound
from rollout.transports.kube.apierrors import translate_api_errors
from rollout.transports.kube.calls import JsonCalls, plain
from rollout.transports.kube.cluster_state import DaemonSet, Event, RuntimeClass
from rollout.transports.kube.config import load_in_cluster, load_kubeconfig, url_configuration
from rollout.transports.kube.objects import (
    ConfigMap,
    EventType,
    EvictionOutcome,
    Lease,
    Node,
    Pod,
    PodDisruptionBudget,
    StrMap,
    format_time,
)

# (connect, read): a hung API server fails a request instead of hanging the run.
DEFAULT_REQUEST_TIMEOUT_S = (5.0, 30.0)
MERGE_PATCH = "application/merge-patch+json"
CLUSTER_POLICY = ("nvidia.com", "v1", "clusterpolicies")
EVENT_SOURCE = "rollout"


class KubeClient(Closeable):
    """The Kubernetes operations rollout performs, against one cluster."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        request_timeout_s: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self._api = api
        self._timeout = request_timeout_s
        self._calls = JsonCalls(request_timeout_s)
        self._core = k8s.CoreV1Api(api)
        self._policy = k8s.PolicyV1Api(api)
        self._coordination = k8s.CoordinationV1Api(api)
        self._apps = k8s.AppsV1Api(api)
        self._node = k8s.NodeV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> KubeClient:
        """Like kubectl: `path`, else $KUBECONFIG (a ':' list), else ~/.kube/config."""
        return cls(k8s.ApiClient(load_kubeconfig(path, context)))

    @classmethod
    def in_cluster(cls) -> KubeClient:
        """The pod's service account (for the scheduled CronJob)."""
        return cls(k8s.ApiClient(load_in_cluster()))

    @classmethod
    def from_url(cls, url: str) -> KubeClient:
        """An unauthenticated client for `url` (the lab's API emulator, tests)."""
        return cls(k8s.ApiClient(url_configuration(url)))

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    @property
    def server(self) -> str:
        """The API server's URL."""
        return str(self._api.configuration.host)

    # ------------------------------------------------------------------ nodes

    def get_node(self, name: str) -> Node:
        return Node.from_json(
            self._calls.request("get", f"node {name}", self._core.read_node, name)
        )

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        """Nodes, optionally only those matching a label selector (`a=b,c in (d)`)."""
        what = f"nodes ({label_selector})" if label_selector else "nodes"
        data = self._calls.request(
            "list", what, self._core.list_node, label_selector=label_selector
        )
        return [Node.from_json(i) for i in data.get("items") or []]

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Node:
        """Set labels; a None value removes the label."""
        return self._patch_node(name, {"metadata": {"labels": dict(labels)}})

    def patch_node_annotations(self, name: str, annotations: Mapping[str, str | None]) -> Node:
        """Set annotations; a None value removes the annotation."""
        return self._patch_node(name, {"metadata": {"annotations": dict(annotations)}})

    def set_unschedulable(self, name: str, unschedulable: bool) -> Node:
        """Cordon (True) or uncordon (False) a node, as kubectl does."""
        # kubectl removes the field on uncordon rather than writing false
        return self._patch_node(name, {"spec": {"unschedulable": True if unschedulable else None}})

    def node_allocatable(self, name: str) -> StrMap:
        return self.get_node(name).allocatable

    def node_capacity(self, name: str) -> StrMap:
        return self.get_node(name).capacity

    def _patch_node(self, name: str, patch: dict[str, Any]) -> Node:
        data = self._calls.request(
            "patch", f"node {name}", self._core.patch_node, name, patch, _content_type=MERGE_PATCH
        )
        return Node.from_json(data)

    # ------------------------------------------------------------------ pods

    def list_pods(
        self,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Pod]:
        """Pods of one namespace (None: all), filtered as by kubectl's -l and --field-selector."""
        items = self._calls.list_in(
            "pods",
            namespace,
            self._core.list_namespaced_pod,
            self._core.list_pod_for_all_namespaces,
            label_selector,
            field_selector,
        )
        return [Pod.from_json(i) for i in items]

    def get_pod(self, namespace: str, name: str) -> Pod:
        return Pod.from_json(
            self._calls.read_namespaced("pod", self._core.read_namespaced_pod, namespace, name)
        )

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> Pod:
        """Create a pod from a manifest (a dict as in YAML); returns it as created.

        Quantities must be strings ("1", not 1): the client validates bodies against its
        models, and a mismatch is Invalid before anything is sent.
        """
        meta = manifest.get("metadata") or {}
        name = meta.get("name") or f"{meta.get('generateName', '')}*"
        data = self._calls.create_namespaced(
            "pod", self._core.create_namespaced_pod, namespace, name, plain(manifest)
        )
        return Pod.from_json(data)

    def delete_pod(
        self,
        namespace: str,
        name: str,
        grace_period_s: int | None = None,
        *,
        missing_ok: bool = False,
    ) -> bool:
        """Delete a pod; False when it was already gone and missing_ok (else NotFound)."""
        try:
            self._calls.request(
                "delete",
                f"pod {namespace}/{name}",
                self._core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=grace_period_s,
            )
        except NotFound:
            if missing_ok:
                return False
            raise
        return True

    def read_pod_log(
        self,
        namespace: str,
        name: str,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        """The pod's log (the only container's, unless `container` names one)."""
        with translate_api_errors("read log of", f"pod {namespace}/{name}"):
            # typed as str, but with _preload_content=False it is the raw response
            response: Any = self._core.read_namespaced_pod_log(
                name,
                namespace,
                container=container,
                tail_lines=tail_lines,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
            data: bytes = response.data
        return data.decode("utf-8", "replace")

    def evict_pod(
        self, namespace: str, name: str, grace_period_s: int | None = None
    ) -> EvictionOutcome:
        """Evict a pod through the eviction API, honouring its PodDisruptionBudgets.

        Raises EvictionBlocked (naming the budget) when a budget allows no disruption now.
        """
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        if grace_period_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": grace_period_s}
        try:
            self._calls.request(
                "evict",
                f"pod {namespace}/{name}",
                self._core.create_namespaced_pod_eviction,
                name,
                namespace,
                body,
            )
        except NotFound:
            return EvictionOutcome.GONE
        return EvictionOutcome.EVICTED

    def list_pdbs(self, namespace: str | None = None) -> list[PodDisruptionBudget]:
        items = self._calls.list_in(
            "poddisruptionbudgets",
            namespace,
            self._policy.list_namespaced_pod_disruption_budget,
            self._policy.list_pod_disruption_budget_for_all_namespaces,
        )
        return [PodDisruptionBudget.from_json(i) for i in items]

    def list_daemonsets(
        self, namespace: str | None = None, label_selector: str | None = None
    ) -> list[DaemonSet]:
        """DaemonSets of one namespace (None: all), with their desired and ready counts."""
        items = self._calls.list_in(
            "daemonsets",
            namespace,
            self._apps.list_namespaced_daemon_set,
            self._apps.list_daemon_set_for_all_namespaces,
            label_selector,
        )
        return [DaemonSet.from_json(i) for i in items]

    def list_runtime_classes(self) -> list[RuntimeClass]:
        """The cluster's RuntimeClasses (node.k8s.io/v1)."""
        data = self._calls.request("list", "runtimeclasses", self._node.list_runtime_class)
        return [RuntimeClass.from_json(i) for i in data.get("items") or []]

    # ------------------------------------------------------------------ configmaps

    def get_configmap(self, namespace: str, name: str) -> ConfigMap:
        return ConfigMap.from_json(
            self._calls.read_namespaced(
                "configmap", self._core.read_namespaced_config_map, namespace, name
            )
        )

    def create_configmap(self, configmap: ConfigMap) -> ConfigMap:
        """Create it; Conflict when it exists already."""
        data = self._calls.create_namespaced(
            "configmap",
            self._core.create_namespaced_config_map,
            configmap.namespace,
            configmap.name,
            configmap.to_json(),
        )
        return ConfigMap.from_json(data)

    def replace_configmap(self, configmap: ConfigMap) -> ConfigMap:
        """Replace it; Conflict when it changed since `configmap` was read."""
        data = self._calls.replace_namespaced(
            "configmap",
            self._core.replace_namespaced_config_map,
            configmap.namespace,
            configmap.name,
            configmap.to_json(),
        )
        return ConfigMap.from_json(data)

    # ------------------------------------------------------------------ ClusterPolicy

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        """The GPU Operator's ClusterPolicies (there is normally one), as JSON."""
        data = self._calls.request(
            "list", "clusterpolicies", self._custom.list_cluster_custom_object, *CLUSTER_POLICY
        )
        return list(data.get("items") or [])

    def get_cluster_policy(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._calls.request(
            "get",
            f"clusterpolicy {name}",
            self._custom.get_cluster_custom_object,
            *CLUSTER_POLICY,
            name,
        )
        return result

    def patch_cluster_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (custom resources take no strategic merge); None deletes."""
        result: dict[str, Any] = self._calls.request(
            "patch",
            f"clusterpolicy {name}",
            self._custom.patch_cluster_custom_object,
            *CLUSTER_POLICY,
            name,
            plain(patch),
            _content_type=MERGE_PATCH,
        )
        return result

    # ------------------------------------------------------------------ events

    def create_event(
        self,
        namespace: str,
        node: str,
        reason: str,
        message: str,
        type: EventType = EventType.NORMAL,
    ) -> str:
        """Record an Event on a node (shown by `kubectl describe node`); returns its name."""
        now = format_time(datetime.now(UTC))
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{node}.", "namespace": namespace},
            # kubelets name the node by its name as uid too; kubectl describe matches on it
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node},
            "reason": reason,
            "message": message,
            "type": type.value,
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        data = self._calls.request(
            "create",
            f"event for node {node} in {namespace}",
            self._core.create_namespaced_event,
            namespace,
            body,
        )
        return str((data.get("metadata") or {}).get("name", ""))

    def list_events(
        self, namespace: str | None = None, field_selector: str | None = None
    ) -> list[Event]:
        """Events of one namespace (None: all), oldest first, filtered as by --field-selector
        (`involvedObject.kind=Pod,involvedObject.name=train-1`)."""
        items = self._calls.list_in(
            "events",
            namespace,
            self._core.list_namespaced_event,
            self._core.list_event_for_all_namespaces,
            None,
            field_selector,
        )
        never = datetime.min.replace(tzinfo=UTC)
        return sorted((Event.from_json(i) for i in items), key=lambda e: e.last_seen or never)

    # ------------------------------------------------------------------ leases

    def get_lease(self, namespace: str, name: str) -> Lease:
        return Lease.from_json(
            self._calls.read_namespaced(
                "lease", self._coordination.read_namespaced_lease, namespace, name
            )
        )

    def create_lease(self, lease: Lease) -> Lease:
        """Create it; Conflict when someone else created it first."""
        body = lease.to_json()
        body["metadata"].pop("resourceVersion", None)
        data = self._calls.create_namespaced(
            "lease", self._coordination.create_namespaced_lease, lease.namespace, lease.name, body
        )
        return Lease.from_json(data)

    def replace_lease(self, lease: Lease) -> Lease:
        """Replace it; Conflict when it changed since `lease` was read (someone else holds it)."""
        if not lease.resource_version:
            raise ValueError("replace_lease needs the resource_version of the lease as read")
        data = self._calls.replace_namespaced(
            "lease",
            self._coordination.replace_namespaced_lease,
            lease.namespace,
            lease.name,
            lease.to_json(),
        )
        return Lease.from_json(data)
