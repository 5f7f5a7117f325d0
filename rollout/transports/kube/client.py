# long module: one job, every Kubernetes operation rollout makes, each with its retry or re-check
"""The Kubernetes API through the official client: the operations rollout needs, nothing more.

Every request is an `ApiRequest` on a kind of `resources`, sent over the client's generic
HTTP path, and reads the raw JSON (`calls.JsonCalls`) instead of the client's models.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, Self, TypeVar

from kubernetes import client as k8s

from rollout.closeable import Closeable
from rollout.errors import BadInput
from rollout.retry import is_transient
from rollout.transports.errors import ChangedByAnother, Conflict, NotFound
from rollout.transports.kube.apierrors import translate_api_errors
from rollout.transports.kube.calls import JsonCalls
from rollout.transports.kube.cluster_state import DaemonSet, Event, RuntimeClass
from rollout.transports.kube.config import load_kubeconfig, url_configuration
from rollout.transports.kube.lease import Lease
from rollout.transports.kube.objects import (
    ConfigMap,
    EventType,
    EvictionOutcome,
    Node,
    Pod,
    PodDisruptionBudget,
    StrMap,
    format_time,
    plain,
)
from rollout.transports.kube.resources import (
    CLUSTER_POLICIES,
    CONFIGMAPS,
    DAEMONSETS,
    EVENTS,
    LEASES,
    NODES,
    NVIDIA_DRIVERS,
    PDBS,
    PODS,
    RUNTIME_CLASSES,
    SECRETS,
    Resource,
)
from rollout.transports.kube.secret import Secret

# (connect, read): a hung API server fails a request instead of hanging the run.
DEFAULT_REQUEST_TIMEOUT_S = (5.0, 30.0)
# Overrides the read timeout, in seconds (the lab's chaos tests answer late on purpose).
REQUEST_TIMEOUT_ENV = "ROLLOUT_API_TIMEOUT_S"
EVENT_SOURCE = "rollout"


T = TypeVar("T")


class Namespaced(Protocol):
    """What creating or replacing an object needs of it: where it is, its version, and its
    JSON both ways."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def resource_version(self) -> str | None: ...

    def to_json(self) -> dict[str, Any]: ...

    def same_content(self, other: Self) -> bool: ...

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Self: ...


N = TypeVar("N", bound=Namespaced)  # a ConfigMap, a Secret or a Lease


def default_request_timeout_s() -> tuple[float, float]:
    """(connect, read) timeouts: the defaults, or the read timeout of $ROLLOUT_API_TIMEOUT_S."""
    text = os.environ.get(REQUEST_TIMEOUT_ENV)
    if text is None:
        return DEFAULT_REQUEST_TIMEOUT_S
    try:
        read_s = float(text)
    except ValueError:
        read_s = 0.0
    if read_s <= 0:
        raise BadInput(f"${REQUEST_TIMEOUT_ENV}={text!r}: give the API read timeout in seconds")
    return (min(DEFAULT_REQUEST_TIMEOUT_S[0], read_s), read_s)


def check_pod_manifest(manifest: Mapping[str, Any]) -> None:
    """pydantic.ValidationError where the client's Pod model refuses the manifest (a quantity
    that is not a string), as the client's generated create method did before sending it."""
    # imported here: the model and those it names take half a second, for the smoke pod only
    from kubernetes.client.models.v1_pod import V1Pod

    V1Pod.model_validate(manifest)


def _budget_refusal(error: BaseException) -> bool:
    return type(error).__name__ == "EvictionBlocked"


class KubeClient(Closeable):
    """The Kubernetes operations rollout performs, against one cluster."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        request_timeout_s: tuple[float, float] | None = None,
    ) -> None:
        request_timeout_s = request_timeout_s or default_request_timeout_s()
        self._api = api
        self._calls = JsonCalls(self._api, request_timeout_s)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> KubeClient:
        """Like kubectl: `path`, else $KUBECONFIG (a ':' list), else ~/.kube/config."""
        return cls(k8s.ApiClient(load_kubeconfig(path, context)))

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
        return Node.from_json(self._calls.request("get", f"node {name}", NODES.get(name)))

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        """Nodes, optionally only those matching a label selector (`a=b,c in (d)`)."""
        what = f"nodes ({label_selector})" if label_selector else "nodes"
        data = self._calls.request("list", what, NODES.list(None, label_selector))
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
        data = self._calls.request("patch", f"node {name}", NODES.merge_patch(name, patch))
        return Node.from_json(data)

    # ------------------------------------------------------------------ pods

    def list_pods(
        self,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Pod]:
        """Pods of one namespace (None: all), filtered as by kubectl's -l and --field-selector."""
        items = self._calls.list_in(PODS, namespace, label_selector, field_selector)
        return [Pod.from_json(i) for i in items]

    def get_pod(self, namespace: str, name: str) -> Pod:
        return Pod.from_json(self._read_namespaced("pod", PODS, namespace, name))

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> Pod:
        """Create a pod from a manifest (a dict as in YAML); returns it as created.

        Quantities must be strings ("1", not 1): the manifest is checked against the client's
        Pod model, and a mismatch is Invalid before anything is sent.
        """
        meta = manifest.get("metadata") or {}
        name = meta.get("name")
        what = f"pod {namespace}/{name or meta.get('generateName', '') + '*'}"
        labels = dict(meta.get("labels") or {})
        body = plain(manifest)
        with translate_api_errors("create", what):
            check_pod_manifest(body)

        def act() -> Pod:
            return Pod.from_json(self._calls.request("create", what, PODS.create(body, namespace)))

        def recheck(error: BaseException) -> Pod | None:
            # created although the answer was lost: the pod is there, with our labels
            found = self._find(lambda: self.get_pod(namespace, str(name)))
            if found is not None and all(found.labels.get(k) == v for k, v in labels.items()):
                return found
            return None

        if not name:
            return act()  # a generated name cannot be looked for: never retried
        return self._calls.guarded("create", what, act, recheck)

    def delete_pod(
        self,
        namespace: str,
        name: str,
        grace_period_s: int | None = None,
        *,
        missing_ok: bool = False,
    ) -> bool:
        """Delete a pod; False when it was already gone and missing_ok (else NotFound)."""
        what = f"pod {namespace}/{name}"
        tries: list[int] = []

        def act() -> bool:
            tries.append(1)
            try:
                request = PODS.delete(name, namespace, grace_period_s)
                self._calls.request_once("delete", what, request)
            except NotFound:
                if missing_ok or len(tries) > 1:
                    # after a lost answer, gone is what the first try asked for
                    return len(tries) > 1
                raise
            return True

        return self._calls.guarded("delete", what, act, lambda error: None)

    def read_pod_log(
        self,
        namespace: str,
        name: str,
        container: str | None = None,
        tail_lines: int | None = None,
    ) -> str:
        """The pod's log (the only container's, unless `container` names one)."""
        what = f"pod {namespace}/{name}"

        def read() -> str:
            query = {"container": container, "tailLines": tail_lines}
            request = PODS.request("GET", namespace, name, subresource="log", query=query)
            data = self._calls.request_bytes("read log of", what, request)
            return data.decode("utf-8", "replace")

        return self._calls.retried("read log of", what, read)

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
        eviction = PODS.request("POST", namespace, name, subresource="eviction", body=body)
        what = f"pod {namespace}/{name}"
        before: list[Pod] = []

        def act() -> EvictionOutcome:
            try:
                if not before:
                    found = self._find(lambda: self.get_pod(namespace, name))
                    if found is None:
                        return EvictionOutcome.GONE
                    before.append(found)
                self._calls.request_once("evict", what, eviction)
            except NotFound:
                return EvictionOutcome.GONE
            return EvictionOutcome.EVICTED

        def recheck(error: BaseException) -> EvictionOutcome | None:
            # evicted although the answer was lost: the pod is terminating, gone or replaced
            now = self._find(lambda: self.get_pod(namespace, name))
            if now is None or now.deleting or (before and now.uid != before[0].uid):
                return EvictionOutcome.EVICTED
            return None

        # a 429 from a budget (EvictionBlocked) is the drain's to wait for, on its schedule
        return self._calls.guarded(
            "evict", what, act, recheck, lambda e: is_transient(e) and not _budget_refusal(e)
        )

    def list_pdbs(self, namespace: str | None = None) -> list[PodDisruptionBudget]:
        items = self._calls.list_in(PDBS, namespace)
        return [PodDisruptionBudget.from_json(i) for i in items]

    def list_daemonsets(
        self, namespace: str | None = None, label_selector: str | None = None
    ) -> list[DaemonSet]:
        """DaemonSets of one namespace (None: all), with their desired and ready counts."""
        items = self._calls.list_in(DAEMONSETS, namespace, label_selector)
        return [DaemonSet.from_json(i) for i in items]

    def list_runtime_classes(self) -> list[RuntimeClass]:
        """The cluster's RuntimeClasses (node.k8s.io/v1)."""
        data = self._calls.request("list", "runtimeclasses", RUNTIME_CLASSES.list())
        return [RuntimeClass.from_json(i) for i in data.get("items") or []]

    # ------------------------------------------------------------------ configmaps

    def get_configmap(self, namespace: str, name: str) -> ConfigMap:
        return ConfigMap.from_json(self._read_namespaced("configmap", CONFIGMAPS, namespace, name))

    def create_configmap(self, configmap: ConfigMap) -> ConfigMap:
        """Create it; Conflict when it exists already."""
        return self._create_namespaced("configmap", CONFIGMAPS, configmap)

    def replace_configmap(self, configmap: ConfigMap) -> ConfigMap:
        """Replace it; Conflict when it changed since `configmap` was read."""
        return self._replace_namespaced("configmap", CONFIGMAPS, configmap)

    # ------------------------------------------------------------------ secrets

    def get_secret(self, namespace: str, name: str) -> Secret:
        return Secret.from_json(self._read_namespaced("secret", SECRETS, namespace, name))

    def create_secret(self, secret: Secret) -> Secret:
        """Create it; Conflict when it exists already."""
        return self._create_namespaced("secret", SECRETS, secret)

    def replace_secret(self, secret: Secret) -> Secret:
        """Replace it; Conflict when it changed since `secret` was read."""
        return self._replace_namespaced("secret", SECRETS, secret)

    # ------------------------------------------------------------------ ClusterPolicy

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        """The GPU Operator's ClusterPolicies (there is normally one), as JSON."""
        return self._list_cluster_objects(CLUSTER_POLICIES)

    def get_cluster_policy(self, name: str) -> dict[str, Any]:
        return self._get_cluster_object(f"clusterpolicy {name}", CLUSTER_POLICIES, name)

    def patch_cluster_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (custom resources take no strategic merge); None deletes."""
        return self._patch_cluster_object(f"clusterpolicy {name}", CLUSTER_POLICIES, name, patch)

    # ------------------------------------------------------------------ NVIDIADriver

    def list_nvidia_drivers(self) -> list[dict[str, Any]]:
        """The GPU Operator's NVIDIADriver resources (cluster-scoped), as JSON; NotFound where
        the cluster does not serve the kind."""
        return self._list_cluster_objects(NVIDIA_DRIVERS)

    def get_nvidia_driver(self, name: str) -> dict[str, Any]:
        return self._get_cluster_object(f"nvidiadriver {name}", NVIDIA_DRIVERS, name)

    def patch_nvidia_driver(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (custom resources take no strategic merge); None deletes."""
        return self._patch_cluster_object(f"nvidiadriver {name}", NVIDIA_DRIVERS, name, patch)

    # ------------------------------------------------------------- custom resources

    def _list_cluster_objects(self, kind: Resource) -> list[dict[str, Any]]:
        return self._calls.list_in(kind, None)

    def _get_cluster_object(self, what: str, kind: Resource, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._calls.request("get", what, kind.get(name))
        return result

    def _patch_cluster_object(
        self, what: str, kind: Resource, name: str, patch: Mapping[str, Any]
    ) -> dict[str, Any]:
        request = kind.merge_patch(name, plain(patch))
        result: dict[str, Any] = self._calls.request("patch", what, request)
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
        # kubelets name the node by its name as uid too; kubectl describe matches on it
        involved = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node}
        return self.create_event_on(namespace, involved, reason, message, type)

    def create_event_on(
        self,
        namespace: str,
        involved: Mapping[str, str],
        reason: str,
        message: str,
        type: EventType = EventType.NORMAL,
    ) -> str:
        """Record an Event on any object (`involved`: its apiVersion, kind, name, uid and, for
        a namespaced one, namespace; `kubectl describe` matches on the uid)."""
        now = format_time(datetime.now(UTC))
        kind, name = involved["kind"], involved["name"]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": dict(involved),
            "reason": reason,
            "message": message,
            "type": type.value,
            "source": {"component": EVENT_SOURCE},
            "reportingComponent": EVENT_SOURCE,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        what = f"event for {kind.lower()} {name} in {namespace}"

        def act() -> str:
            data = self._calls.request_once("create", what, EVENTS.create(body, namespace))
            return str((data.get("metadata") or {}).get("name", ""))

        def recheck(error: BaseException) -> str | None:
            # the same reason, message and time on the same object: our event, answer lost
            selector = f"involvedObject.kind={kind},involvedObject.name={name}"
            for event in self.list_events(namespace, field_selector=selector):
                if (
                    event.reason == reason
                    and event.message == message
                    and (event.last_seen is not None and format_time(event.last_seen) == now)
                ):
                    return event.name
            return None

        return self._calls.guarded("create", what, act, recheck)

    def list_events(
        self, namespace: str | None = None, field_selector: str | None = None
    ) -> list[Event]:
        """Events of one namespace (None: all), oldest first, filtered as by --field-selector
        (`involvedObject.kind=Pod,involvedObject.name=train-1`)."""
        items = self._calls.list_in(EVENTS, namespace, None, field_selector)
        never = datetime.min.replace(tzinfo=UTC)
        return sorted((Event.from_json(i) for i in items), key=lambda e: e.last_seen or never)

    # ------------------------------------------------------------------ leases

    def get_lease(self, namespace: str, name: str) -> Lease:
        return Lease.from_json(self._read_namespaced("lease", LEASES, namespace, name))

    def create_lease(self, lease: Lease) -> Lease:
        """Create it; Conflict when someone else created it first."""
        return self._create_namespaced("lease", LEASES, lease)

    def replace_lease(self, lease: Lease) -> Lease:
        """Replace it; Conflict when it changed since `lease` was read (someone else holds it)."""
        if not lease.resource_version:
            raise ValueError("replace_lease needs the resource_version of the lease as read")
        return self._replace_namespaced("lease", LEASES, lease)

    # ------------------------------------------------------------------ read, create and replace

    def _read_namespaced(self, kind: str, resource: Resource, namespace: str, name: str) -> Any:
        what = f"{kind} {namespace}/{name}"
        return self._calls.request("get", what, resource.get(name, namespace))

    def _find_namespaced(self, kind: str, resource: Resource, obj: N) -> N | None:
        """The object named as `obj` is, as the server holds it now; None when there is none."""
        return self._find(
            lambda: type(obj).from_json(
                self._read_namespaced(kind, resource, obj.namespace, obj.name)
            )
        )

    def _create_namespaced(self, kind: str, resource: Resource, obj: N) -> N:
        """A create made again after a lost answer only when a fresh read finds nothing:
        the same content there means it landed; anything else is another writer's object,
        ChangedByAnother."""
        what = f"{kind} {obj.namespace}/{obj.name}"

        def act() -> N:
            body = obj.to_json()
            body["metadata"].pop("resourceVersion", None)
            request = resource.create(body, obj.namespace)
            data = self._calls.request("create", what, request)
            return type(obj).from_json(data)

        def recheck(error: BaseException) -> N | None:
            found = self._find_namespaced(kind, resource, obj)
            if found is None:
                return None
            if found.same_content(obj):
                return found
            raise ChangedByAnother(
                "create",
                what,
                status=409,
                reason="Conflict",
                message="created by another writer meanwhile",
            ) from error

        return self._calls.guarded("create", what, act, recheck)

    def _replace_namespaced(self, kind: str, resource: Resource, obj: N) -> N:
        """A replace guarded by resource_version, made again only after a fresh read shows
        that nothing landed: our content there means it did (the answer was lost); the same
        resourceVersion means nobody wrote (a 409 then was not another writer's); anything
        else is another writer's change, ChangedByAnother."""
        what = f"{kind} {obj.namespace}/{obj.name}"

        def act() -> N:
            request = resource.replace(obj.name, obj.to_json(), obj.namespace)
            return type(obj).from_json(self._calls.request("replace", what, request))

        def recheck(error: BaseException) -> N | None:
            fresh = self._find_namespaced(kind, resource, obj)
            if fresh is not None and fresh.same_content(obj):
                return fresh
            if fresh is not None and fresh.resource_version == obj.resource_version:
                return None
            raise ChangedByAnother(
                "replace",
                what,
                status=409,
                reason="Conflict",
                message=f"changed by another writer since it was read ({error})",
            ) from error

        def retryable(error: BaseException) -> bool:
            return is_transient(error) or type(error) is Conflict

        return self._calls.guarded("replace", what, act, recheck, retryable)

    # ------------------------------------------------------------------ re-checks

    def _find(self, read: Callable[[], T]) -> T | None:
        """`read()`, or None when the object does not exist."""
        try:
            return read()
        except NotFound:
            return None
