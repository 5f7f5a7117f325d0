"""The Kubernetes API through the official client: the operations rollout needs, nothing more.

The only module that imports `kubernetes`. It returns plain frozen dataclasses (or JSON dicts
for custom resources), never client model objects, and translates ApiException and urllib3
errors in one place (translate_api_errors) into rollout.transports.errors.

Every request reads the raw JSON (`_preload_content=False`) instead of the client's models:
rollout needs a few fields of each object, and the JSON is what the server said, with no
model (de)serialisation in between to disagree with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any

import pydantic
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from rollout.transports.errors import (
    BadRequest,
    Conflict,
    EvictionBlocked,
    Forbidden,
    Invalid,
    KubeConfigError,
    KubeError,
    KubeUnreachable,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
)

DEFAULT_KUBECONFIG = "~/.kube/config"
KUBECONFIG_ENV = "KUBECONFIG"
# (connect, read): a hung API server fails a request instead of hanging the run.
DEFAULT_REQUEST_TIMEOUT_S = (5.0, 30.0)
MERGE_PATCH = "application/merge-patch+json"
CLUSTER_POLICY = ("nvidia.com", "v1", "clusterpolicies")
EVENT_SOURCE = "rollout"
# The eviction API names the budget only in the cause's message:
# "The disruption budget web-pdb needs 2 healthy pods and has 2 currently".
_BUDGET_IN_MESSAGE = re.compile(r"disruption budget (\S+)")
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"

_STATUS_ERRORS: Mapping[int, type[KubeError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    422: Invalid,
    429: TooManyRequests,
}

StrMap = Mapping[str, str]


def _frozen_map(value: Mapping[str, Any] | None) -> StrMap:
    return types.MappingProxyType({str(k): str(v) for k, v in (value or {}).items()})


def _empty_map() -> StrMap:
    return types.MappingProxyType({})


def parse_time(text: str | None) -> datetime | None:
    """A Kubernetes Time or MicroTime (RFC 3339, `Z`) as an aware datetime."""
    if not text:
        return None
    return datetime.fromisoformat(text)


def format_micro_time(moment: datetime) -> str:
    """MicroTime as the server writes it: `2024-05-01T10:00:00.000000Z`."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def format_time(moment: datetime) -> str:
    """Time (whole seconds), as Event timestamps carry it."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -------------------------------------------------------------------------- the objects


@dataclass(frozen=True)
class Taint:
    key: str
    effect: str
    value: str | None = None


@dataclass(frozen=True)
class Node:
    """What rollout reads of a Node."""

    name: str
    uid: str
    resource_version: str
    labels: StrMap = field(default_factory=_empty_map)
    annotations: StrMap = field(default_factory=_empty_map)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    # condition type -> status ("True", "False", "Unknown")
    conditions: StrMap = field(default_factory=_empty_map)
    capacity: StrMap = field(default_factory=_empty_map)
    allocatable: StrMap = field(default_factory=_empty_map)
    kubelet_version: str = ""
    container_runtime_version: str = ""

    @property
    def ready(self) -> bool:
        return self.conditions.get("Ready") == "True"

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Node:
        meta, spec, status = _parts(obj)
        info = status.get("nodeInfo") or {}
        return cls(
            name=meta["name"],
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
            labels=_frozen_map(meta.get("labels")),
            annotations=_frozen_map(meta.get("annotations")),
            unschedulable=bool(spec.get("unschedulable", False)),
            taints=tuple(
                Taint(key=t["key"], effect=t.get("effect", ""), value=t.get("value"))
                for t in spec.get("taints") or []
            ),
            conditions=_frozen_map(
                {c["type"]: c.get("status", "Unknown") for c in status.get("conditions") or []}
            ),
            capacity=_frozen_map(status.get("capacity")),
            allocatable=_frozen_map(status.get("allocatable")),
            kubelet_version=info.get("kubeletVersion", ""),
            container_runtime_version=info.get("containerRuntimeVersion", ""),
        )


@dataclass(frozen=True)
class OwnerRef:
    kind: str
    name: str
    controller: bool = False


@dataclass(frozen=True)
class Pod:
    """What rollout reads of a Pod: enough to drain a node and judge a smoke pod."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    node_name: str | None = None
    phase: str = "Pending"
    labels: StrMap = field(default_factory=_empty_map)
    annotations: StrMap = field(default_factory=_empty_map)
    owners: tuple[OwnerRef, ...] = ()
    containers: tuple[str, ...] = ()
    ready: bool = False
    deleting: bool = False
    uses_empty_dir: bool = False
    # waiting/terminated reasons of the containers (ContainerCreating, CrashLoopBackOff, ...)
    container_reasons: tuple[str, ...] = ()
    reason: str = ""
    message: str = ""
    # nvidia.com/gpu the pod's containers ask for (limits, else requests), summed
    gpu_request: int = 0

    @property
    def controller(self) -> OwnerRef | None:
        return next((o for o in self.owners if o.controller), None)

    @property
    def is_mirror(self) -> bool:
        """A static pod's mirror: the kubelet owns it, eviction cannot remove it."""
        return "kubernetes.io/config.mirror" in self.annotations

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Pod:
        meta, spec, status = _parts(obj)
        reasons: list[str] = []
        for container_status in status.get("containerStatuses") or []:
            for state in (container_status.get("state") or {}).values():
                if isinstance(state, Mapping) and state.get("reason"):
                    reasons.append(str(state["reason"]))
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            uid=meta.get("uid", ""),
            resource_version=meta.get("resourceVersion", ""),
            node_name=spec.get("nodeName"),
            phase=status.get("phase", "Pending"),
            labels=_frozen_map(meta.get("labels")),
            annotations=_frozen_map(meta.get("annotations")),
            owners=tuple(
                OwnerRef(kind=o["kind"], name=o["name"], controller=bool(o.get("controller")))
                for o in meta.get("ownerReferences") or []
            ),
            containers=tuple(c["name"] for c in spec.get("containers") or []),
            ready=any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or []
            ),
            deleting=bool(meta.get("deletionTimestamp")),
            uses_empty_dir=any("emptyDir" in v for v in spec.get("volumes") or []),
            container_reasons=tuple(reasons),
            reason=status.get("reason", ""),
            message=status.get("message", ""),
            gpu_request=sum(_gpu_request(c) for c in spec.get("containers") or []),
        )


def _gpu_request(container: Mapping[str, Any]) -> int:
    """A container's nvidia.com/gpu: its limit (the device plugin's rule), else its request."""
    resources = container.get("resources") or {}
    for kind in ("limits", "requests"):
        value = (resources.get(kind) or {}).get("nvidia.com/gpu")
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


@dataclass(frozen=True)
class PodDisruptionBudget:
    namespace: str
    name: str
    disruptions_allowed: int
    current_healthy: int
    desired_healthy: int
    expected_pods: int
    match_labels: StrMap = field(default_factory=_empty_map)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> PodDisruptionBudget:
        meta, spec, status = _parts(obj)
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            disruptions_allowed=int(status.get("disruptionsAllowed", 0)),
            current_healthy=int(status.get("currentHealthy", 0)),
            desired_healthy=int(status.get("desiredHealthy", 0)),
            expected_pods=int(status.get("expectedPods", 0)),
            match_labels=_frozen_map((spec.get("selector") or {}).get("matchLabels")),
        )


@dataclass(frozen=True)
class ConfigMap:
    """A ConfigMap; replace_configmap sends resource_version, so a stale copy is a Conflict."""

    namespace: str
    name: str
    data: StrMap = field(default_factory=_empty_map)
    labels: StrMap = field(default_factory=_empty_map)
    annotations: StrMap = field(default_factory=_empty_map)
    resource_version: str | None = None

    def with_data(self, data: Mapping[str, str]) -> ConfigMap:
        return ConfigMap(
            self.namespace,
            self.name,
            _frozen_map(data),
            self.labels,
            self.annotations,
            self.resource_version,
        )

    def to_json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.annotations:
            meta["annotations"] = dict(self.annotations)
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": dict(self.data)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ConfigMap:
        meta = obj.get("metadata") or {}
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            data=_frozen_map(obj.get("data")),
            labels=_frozen_map(meta.get("labels")),
            annotations=_frozen_map(meta.get("annotations")),
            resource_version=meta.get("resourceVersion"),
        )


@dataclass(frozen=True)
class Lease:
    """A coordination.k8s.io Lease; replace_lease is optimistic on resource_version."""

    namespace: str
    name: str
    holder_identity: str | None = None
    lease_duration_s: int | None = None
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int = 0
    labels: StrMap = field(default_factory=_empty_map)
    resource_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            meta["labels"] = dict(self.labels)
        if self.resource_version:
            meta["resourceVersion"] = self.resource_version
        spec: dict[str, Any] = {"leaseTransitions": self.lease_transitions}
        if self.holder_identity is not None:
            spec["holderIdentity"] = self.holder_identity
        if self.lease_duration_s is not None:
            spec["leaseDurationSeconds"] = self.lease_duration_s
        if self.acquire_time is not None:
            spec["acquireTime"] = format_micro_time(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = format_micro_time(self.renew_time)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": spec,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Lease:
        meta, spec, _ = _parts(obj)
        duration = spec.get("leaseDurationSeconds")
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta["name"],
            holder_identity=spec.get("holderIdentity"),
            lease_duration_s=int(duration) if duration is not None else None,
            acquire_time=parse_time(spec.get("acquireTime")),
            renew_time=parse_time(spec.get("renewTime")),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
            labels=_frozen_map(meta.get("labels")),
            resource_version=meta.get("resourceVersion"),
        )


class EventType(Enum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EvictionOutcome(Enum):
    """What an eviction did; a refusal by a budget raises EvictionBlocked instead."""

    EVICTED = "evicted"
    # Already deleted: for a drain, as good as evicted.
    GONE = "gone"


def _parts(obj: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    return obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}


# ---------------------------------------------------------------------- error translation


@contextlib.contextmanager
def translate_api_errors(verb: str, obj: str) -> Iterator[None]:
    """Turn the client's errors inside the block into rollout's KubeError tree, cause chained.

    `verb obj` names the request in the message: "patch" "node lab-node-1".
    """
    try:
        yield
    except ApiException as exc:
        raise error_from_api_exception(exc, verb, obj) from exc
    except pydantic.ValidationError as exc:
        # the client checks request bodies against its models before sending them
        raise Invalid(
            verb, obj, reason="rejected by the client", message=_describe_validation(exc)
        ) from exc
    except urllib3.exceptions.HTTPError as exc:
        raise KubeUnreachable(
            verb, obj, reason="API server unreachable", message=_describe_urllib3(exc)
        ) from exc
    except OSError as exc:
        raise KubeUnreachable(
            verb, obj, reason="API server unreachable", message=exc.strerror or str(exc)
        ) from exc


def error_from_api_exception(exc: ApiException, verb: str, obj: str) -> KubeError:
    """The KubeError for one ApiException: class by status, the Status message, the PDB."""
    status = int(exc.status) if exc.status is not None else None
    body = exc.body.decode("utf-8", "replace") if isinstance(exc.body, bytes) else exc.body
    parsed = _parse_status(body)
    http_reason = str(exc.reason or "")
    message = (body or "") if parsed is None else str(parsed.get("message") or "")
    if status == 429:
        budget = _blocking_budget(parsed)
        if budget is not None:
            return EvictionBlocked(
                verb, obj, status=status, reason=http_reason, message=message, pdb=budget or None
            )
    if status is not None and 500 <= status <= 599:
        cls: type[KubeError] = ServerError
    else:
        cls = _STATUS_ERRORS.get(status or 0, KubeError)
    return cls(verb, obj, status=status, reason=http_reason, message=message)


def _parse_status(body: str | None) -> dict[str, Any] | None:
    """The Status object of an error body; None when the body is not one (a proxy's HTML)."""
    if not body:
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("kind") == "Status" else None


def _blocking_budget(status: Mapping[str, Any] | None) -> str | None:
    """The name of the budget that refused an eviction, "" when unnamed, None when not one."""
    if status is None:
        return None
    causes = (status.get("details") or {}).get("causes") or []
    for cause in causes:
        if cause.get("reason") == DISRUPTION_BUDGET_CAUSE or cause.get("type") == (
            DISRUPTION_BUDGET_CAUSE
        ):
            found = _BUDGET_IN_MESSAGE.search(str(cause.get("message") or ""))
            return found.group(1) if found else ""
    if "disruption budget" in str(status.get("message") or ""):
        return ""
    return None


def _describe_validation(exc: pydantic.ValidationError) -> str:
    """`spec.containers.0.resources.limits.nvidia.com/gpu: Input should be a valid string`."""
    problems = []
    for error in exc.errors():
        # the first location item is the argument's position or name, not part of the body
        where = ".".join(str(part) for part in error["loc"][1:])
        problems.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    return "; ".join(problems)


def _describe_urllib3(exc: urllib3.exceptions.HTTPError) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc)


# ---------------------------------------------------------------------------- the client


class KubeClient:
    """The Kubernetes operations rollout performs, against one cluster."""

    def __init__(
        self,
        api: k8s.ApiClient,
        *,
        request_timeout_s: tuple[float, float] = DEFAULT_REQUEST_TIMEOUT_S,
    ) -> None:
        self._api = api
        self._timeout = request_timeout_s
        self._core = k8s.CoreV1Api(api)
        self._policy = k8s.PolicyV1Api(api)
        self._coordination = k8s.CoordinationV1Api(api)
        self._custom = k8s.CustomObjectsApi(api)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> KubeClient:
        """Like kubectl: `path`, else $KUBECONFIG (a ':' list), else ~/.kube/config."""
        chosen = path or os.environ.get(KUBECONFIG_ENV) or DEFAULT_KUBECONFIG
        files = [Path(p).expanduser() for p in chosen.split(os.pathsep) if p]
        where = f"kubeconfig {chosen}"
        if not any(f.is_file() for f in files):
            raise KubeConfigError("load", where, message="no such file")
        configuration = k8s.Configuration()
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=os.pathsep.join(str(f) for f in files),
                context=context,
                client_configuration=configuration,
            )
        except ConfigException as exc:
            target = f"{where} (context {context})" if context else where
            raise KubeConfigError("load", target, message=str(exc)) from exc
        return cls(k8s.ApiClient(_without_retries(configuration)))

    @classmethod
    def in_cluster(cls) -> KubeClient:
        """The pod's service account (for the scheduled CronJob)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=configuration
            )
        except ConfigException as exc:
            raise KubeConfigError("load", "in-cluster configuration", message=str(exc)) from exc
        return cls(k8s.ApiClient(_without_retries(configuration)))

    @classmethod
    def from_url(cls, url: str) -> KubeClient:
        """An unauthenticated client for `url` (the lab's API emulator, tests)."""
        configuration = k8s.Configuration()
        configuration.host = url
        return cls(k8s.ApiClient(_without_retries(configuration)))

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> KubeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def server(self) -> str:
        """The API server's URL."""
        return str(self._api.configuration.host)

    # ------------------------------------------------------------------ plumbing

    def _request(self, verb: str, obj: str, call: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        """Call one client method and return the decoded JSON body."""
        with translate_api_errors(verb, obj):
            response = call(*args, _preload_content=False, _request_timeout=self._timeout, **kw)
            data = response.data
        if not data:
            return {}
        try:
            return json.loads(data)
        except ValueError as exc:
            raise KubeError(
                verb,
                obj,
                reason="unreadable response",
                message=data[:200].decode("utf-8", "replace"),
            ) from exc

    # ------------------------------------------------------------------ nodes

    def get_node(self, name: str) -> Node:
        return Node.from_json(self._request("get", f"node {name}", self._core.read_node, name))

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        """Nodes, optionally only those matching a label selector (`a=b,c in (d)`)."""
        what = f"nodes ({label_selector})" if label_selector else "nodes"
        data = self._request("list", what, self._core.list_node, label_selector=label_selector)
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
        data = self._request(
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
        selectors = ", ".join(s for s in (label_selector, field_selector) if s)
        what = f"pods in {namespace or 'all namespaces'}" + (f" ({selectors})" if selectors else "")
        kw = {"label_selector": label_selector, "field_selector": field_selector}
        if namespace is None:
            data = self._request("list", what, self._core.list_pod_for_all_namespaces, **kw)
        else:
            data = self._request("list", what, self._core.list_namespaced_pod, namespace, **kw)
        return [Pod.from_json(i) for i in data.get("items") or []]

    def get_pod(self, namespace: str, name: str) -> Pod:
        data = self._request(
            "get", f"pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
        )
        return Pod.from_json(data)

    def create_pod(self, namespace: str, manifest: Mapping[str, Any]) -> Pod:
        """Create a pod from a manifest (a dict as in YAML); returns it as created.

        Quantities must be strings ("1", not 1): the client validates bodies against its
        models, and a mismatch is Invalid before anything is sent.
        """
        meta = manifest.get("metadata") or {}
        name = meta.get("name") or f"{meta.get('generateName', '')}*"
        data = self._request(
            "create",
            f"pod {namespace}/{name}",
            self._core.create_namespaced_pod,
            namespace,
            _plain(manifest),
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
            self._request(
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
            self._request(
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
        what = f"poddisruptionbudgets in {namespace or 'all namespaces'}"
        if namespace is None:
            data = self._request(
                "list", what, self._policy.list_pod_disruption_budget_for_all_namespaces
            )
        else:
            data = self._request(
                "list", what, self._policy.list_namespaced_pod_disruption_budget, namespace
            )
        return [PodDisruptionBudget.from_json(i) for i in data.get("items") or []]

    # ------------------------------------------------------------------ configmaps

    def get_configmap(self, namespace: str, name: str) -> ConfigMap:
        data = self._request(
            "get",
            f"configmap {namespace}/{name}",
            self._core.read_namespaced_config_map,
            name,
            namespace,
        )
        return ConfigMap.from_json(data)

    def create_configmap(self, configmap: ConfigMap) -> ConfigMap:
        """Create it; Conflict when it exists already."""
        data = self._request(
            "create",
            f"configmap {configmap.namespace}/{configmap.name}",
            self._core.create_namespaced_config_map,
            configmap.namespace,
            configmap.to_json(),
        )
        return ConfigMap.from_json(data)

    def replace_configmap(self, configmap: ConfigMap) -> ConfigMap:
        """Replace it; Conflict when it changed since `configmap` was read."""
        data = self._request(
            "replace",
            f"configmap {configmap.namespace}/{configmap.name}",
            self._core.replace_namespaced_config_map,
            configmap.name,
            configmap.namespace,
            configmap.to_json(),
        )
        return ConfigMap.from_json(data)

    # ------------------------------------------------------------------ ClusterPolicy

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        """The GPU Operator's ClusterPolicies (there is normally one), as JSON."""
        data = self._request(
            "list", "clusterpolicies", self._custom.list_cluster_custom_object, *CLUSTER_POLICY
        )
        return list(data.get("items") or [])

    def get_cluster_policy(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._request(
            "get",
            f"clusterpolicy {name}",
            self._custom.get_cluster_custom_object,
            *CLUSTER_POLICY,
            name,
        )
        return result

    def patch_cluster_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        """A JSON merge patch (custom resources take no strategic merge); None deletes."""
        result: dict[str, Any] = self._request(
            "patch",
            f"clusterpolicy {name}",
            self._custom.patch_cluster_custom_object,
            *CLUSTER_POLICY,
            name,
            _plain(patch),
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
        data = self._request(
            "create",
            f"event for node {node} in {namespace}",
            self._core.create_namespaced_event,
            namespace,
            body,
        )
        return str((data.get("metadata") or {}).get("name", ""))

    # ------------------------------------------------------------------ leases

    def get_lease(self, namespace: str, name: str) -> Lease:
        data = self._request(
            "get",
            f"lease {namespace}/{name}",
            self._coordination.read_namespaced_lease,
            name,
            namespace,
        )
        return Lease.from_json(data)

    def create_lease(self, lease: Lease) -> Lease:
        """Create it; Conflict when someone else created it first."""
        body = lease.to_json()
        body["metadata"].pop("resourceVersion", None)
        data = self._request(
            "create",
            f"lease {lease.namespace}/{lease.name}",
            self._coordination.create_namespaced_lease,
            lease.namespace,
            body,
        )
        return Lease.from_json(data)

    def replace_lease(self, lease: Lease) -> Lease:
        """Replace it; Conflict when it changed since `lease` was read (someone else holds it)."""
        if not lease.resource_version:
            raise ValueError("replace_lease needs the resource_version of the lease as read")
        data = self._request(
            "replace",
            f"lease {lease.namespace}/{lease.name}",
            self._coordination.replace_namespaced_lease,
            lease.name,
            lease.namespace,
            lease.to_json(),
        )
        return Lease.from_json(data)


def _without_retries(configuration: k8s.Configuration) -> k8s.Configuration:
    # urllib3 would otherwise retry connection errors on its own, hidden from rollout.retry,
    # the one place retries live.
    configuration.retries = False
    return configuration


def _plain(value: Any) -> Any:
    """Mappings (MappingProxyType included) as dicts, for the client's body validation."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
