"""REST semantics over the store: what create, get, list, update, patch and delete mean.

Both the HTTP handler and the in-process simulated controllers go through the registry, so
a controller's write is subject to the same revision bookkeeping a client's is.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.admission import admit_pod
from rollout.lab.apiserver.apply import applied_object, apply_to, check_applied
from rollout.lab.apiserver.disruption import budget_selects, check_eviction, compute_budget_status
from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.metadata import format_timestamp, new_name_suffix
from rollout.lab.apiserver.patches import MERGE_KEYS, PatchType, apply_patch
from rollout.lab.apiserver.rbac import to_bootstrap_objects
from rollout.lab.apiserver.resources import (
    NAMESPACES,
    PODDISRUPTIONBUDGETS,
    PODS,
    ResourceCatalog,
    ResourceKind,
)
from rollout.lab.apiserver.selectors import FieldSelector, LabelSelector
from rollout.lab.apiserver.store import Store
from rollout.lab.apiserver.strategies import (
    prepare_for_create,
    prepare_for_status_update,
    prepare_for_update,
)
from rollout.lab.apiserver.validation import check_decodable, validate_object

BUILTIN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_GENERIC_FIELDS = ("metadata.name", "metadata.namespace")
_TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class DeleteOptions:
    """metav1.DeleteOptions as far as the emulator honours them."""

    grace_period_s: int | None = None
    precondition_uid: str | None = None
    precondition_resource_version: str | None = None
    propagation_policy: str = "Background"
    dry_run: bool = False

    @classmethod
    def from_request(
        cls, query: Mapping[str, str], body: Mapping[str, Any] | None
    ) -> DeleteOptions:
        body = body or {}
        grace = body.get("gracePeriodSeconds", query.get("gracePeriodSeconds"))
        preconditions = body.get("preconditions") or {}
        propagation = body.get("propagationPolicy") or query.get("propagationPolicy")
        if propagation is None and body.get("orphanDependents") is True:
            propagation = "Orphan"
        dry_run = bool(body.get("dryRun")) or query.get("dryRun") == "All"
        try:
            grace_s = int(grace) if grace is not None else None
        except ValueError as exc:
            raise ApiError.bad_request(f"invalid gracePeriodSeconds: {grace}") from exc
        return cls(
            grace_period_s=grace_s,
            precondition_uid=preconditions.get("uid"),
            precondition_resource_version=preconditions.get("resourceVersion"),
            propagation_policy=propagation or "Background",
            dry_run=dry_run,
        )


class Registry:
    """The API semantics of every served kind, on one store."""

    def __init__(
        self,
        store: Store | None = None,
        catalog: ResourceCatalog | None = None,
        *,
        pod_termination_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`pod_termination_s` > 0 keeps a deleted running pod Terminating that long (capped by
        its grace period) before it goes, as a kubelet would; 0 deletes pods at once."""
        self.store = store or Store()
        self.catalog = catalog or ResourceCatalog()
        self._pod_termination_s = pod_termination_s
        self._clock = clock
        self._logs: dict[tuple[str, str], dict[str, str]] = {}
        self._logs_lock = threading.Lock()
        self._timers: set[threading.Timer] = set()
        self._closed = False
        for name in BUILTIN_NAMESPACES:
            self.ensure_namespace(name)
        for kind, obj in to_bootstrap_objects():
            self.create(kind, None, obj)

    # ----------------------------------------------------------------- reads

    def get(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        with self.store.locked():
            found = self.store.get(kind, namespace, name)
            if found is None:
                raise ApiError.not_found(kind.group_resource, name)
            return self._decorate(kind, found)

    def find(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any] | None:
        """Like get, None when absent: for controllers."""
        found = self.store.get(kind, namespace, name)
        return self._decorate(kind, found) if found is not None else None

    def list_collection(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
        field_selector: FieldSelector | None = None,
    ) -> dict[str, Any]:
        """A List object at the current revision, filtered by the selectors."""
        fields = field_selector or FieldSelector()
        self.check_field_selector(kind, fields)
        labels = label_selector or LabelSelector()
        with self.store.locked():
            revision = self.store.revision
            items = [
                self._decorate(kind, obj)
                for obj in self.store.select(kind, namespace)
                if labels.matches(obj["metadata"].get("labels")) and fields.matches(obj)
            ]
        return {
            "kind": kind.list_kind,
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(revision)},
            "items": [self.to_list_item(kind, item) for item in items],
        }

    def list_objects(
        self,
        kind: ResourceKind,
        namespace: str | None = None,
        label_selector: LabelSelector | None = None,
    ) -> list[dict[str, Any]]:
        """Whole objects (with kind and apiVersion), for controllers."""
        labels = label_selector or LabelSelector()
        return [
            self._decorate(kind, obj)
            for obj in self.store.select(kind, namespace)
            if labels.matches(obj["metadata"].get("labels"))
        ]

    def check_field_selector(self, kind: ResourceKind, selector: FieldSelector) -> None:
        for field in selector.fields():
            if field not in _GENERIC_FIELDS and field not in kind.selectable_fields:
                raise ApiError.bad_request(
                    f"field label not supported: {field}"
                    if not kind.custom
                    else f'"{field}" is not a known field selector: only "metadata.name", '
                    '"metadata.namespace"'
                )

    @staticmethod
    def to_list_item(kind: ResourceKind, obj: dict[str, Any]) -> dict[str, Any]:
        """Built-in list items carry no kind/apiVersion on the wire; custom resources do."""
        if kind.custom:
            return obj
        return {k: v for k, v in obj.items() if k not in {"kind", "apiVersion"}}

    # ----------------------------------------------------------------- writes

    def create(
        self,
        kind: ResourceKind,
        namespace: str | None,
        body: Any,
        *,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        check_decodable(kind, body)
        self._check_type(kind, body)
        obj = copy.deepcopy(body)
        metadata = obj.setdefault("metadata", {})
        if kind.namespaced:
            if metadata.get("namespace") not in (None, "", namespace):
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent "
                    "on the request"
                )
            metadata["namespace"] = namespace
        else:
            metadata.pop("namespace", None)
        requested_name = str(metadata.get("name") or "")
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = f"{metadata['generateName']}{new_name_suffix()}"
        with self.store.locked():
            if kind.namespaced and self.store.get(NAMESPACES, None, str(namespace)) is None:
                raise ApiError.not_found(NAMESPACES.group_resource, str(namespace))
            if kind == PODS:
                admit_pod(self.store, obj, requested_name)
            prepare_for_create(kind, obj, self._clock())
            validate_object(kind, obj, None)
            if self.store.get(kind, namespace, metadata["name"]) is not None:
                raise ApiError.already_exists(kind.group_resource, metadata["name"])
            if dry_run:
                return self._decorate(kind, obj)
            return self._decorate(kind, self.store.put(kind, obj))

    def replace(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PUT: optimistic concurrency on metadata.resourceVersion when the body carries one."""
        check_decodable(kind, body)
        self._check_type(kind, body)
        metadata = body.get("metadata") or {}
        if metadata.get("name") not in (None, name):
            raise ApiError.bad_request(
                f"the name of the object ({metadata.get('name')}) does not match the name on "
                f"the URL ({name})"
            )
        if kind.namespaced and metadata.get("namespace") not in (None, "", namespace):
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        with self.store.locked():
            old = self._require(kind, namespace, name)
            wanted = metadata.get("resourceVersion")
            if wanted is None and kind.custom:
                raise ApiError.invalid(
                    kind.kind,
                    kind.group,
                    name,
                    [_required_rv()],
                )
            if wanted is not None and wanted != old["metadata"]["resourceVersion"]:
                raise ApiError.stale(kind.group_resource, name)
            self._check_uid(kind, name, metadata, old)
            return self._write_update(kind, copy.deepcopy(body), old, subresource, dry_run)

    def patch(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        patch_type: PatchType,
        patch: Any,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """PATCH: a resourceVersion the patch sets is a precondition, as on the real server."""
        with self.store.locked():
            old = self._require(kind, namespace, name)
            patched = apply_patch(patch_type, old, patch, MERGE_KEYS.get(kind.resource, {}))
            check_decodable(kind, patched)
            metadata = patched.get("metadata") or {}
            wanted = metadata.get("resourceVersion")
            if wanted is not None and wanted != old["metadata"]["resourceVersion"]:
                raise ApiError.stale(kind.group_resource, name)
            if metadata.get("name") != name:
                raise ApiError.bad_request("metadata.name: the name may not be changed by a patch")
            self._check_uid(kind, name, metadata, old)
            return self._write_update(kind, patched, old, subresource, dry_run)

    def apply(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        applied: Any,
        manager: str,
        *,
        dry_run: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Server-side apply (rollout.lab.apiserver.apply): the object, and whether it was
        created (the real server answers 201 then)."""
        config = check_applied(applied, name)
        keys = MERGE_KEYS.get(kind.resource, {})
        with self.store.locked():
            old = self.store.get(kind, namespace, name)
            if old is None:
                body = applied_object(config, name, manager, keys)
                return self.create(kind, namespace, body, dry_run=dry_run), True
            merged = apply_to(old, config, manager, keys)
            check_decodable(kind, merged)
            self._check_uid(kind, name, merged["metadata"], old)
            return self._write_update(kind, merged, old, None, dry_run), False

    def mutate(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        change: Callable[[dict[str, Any]], None],
    ) -> dict[str, Any] | None:
        """Apply `change` to the stored object atomically (controllers' own writes: no status
        isolation, no validation). Returns the object, None when it does not exist."""
        with self.store.locked():
            old = self.store.get(kind, namespace, name)
            if old is None:
                return None
            new = copy.deepcopy(old)
            change(new)
            if new == old:
                return old
            return self.store.put(kind, new)

    def delete(
        self,
        kind: ResourceKind,
        namespace: str | None,
        name: str,
        options: DeleteOptions | None = None,
    ) -> dict[str, Any]:
        """DELETE: pods answer with the pod (Terminating while graceful), others with a Status."""
        options = options or DeleteOptions()
        with self.store.locked():
            obj = self._require(kind, namespace, name)
            self._check_preconditions(kind, name, obj, options)
            if options.dry_run:
                return obj if kind == PODS else self._deleted_status(kind, obj)
            if kind == PODS:
                return self._delete_pod(obj, options)
            if obj["metadata"].get("finalizers") and kind != NAMESPACES:
                return self._mark_deleting(kind, obj, 0)
            if kind == NAMESPACES:
                return self._delete_namespace(obj)
            self.store.remove(kind, namespace, name)
            self._collect_dependents(obj, options)
            return self._deleted_status(kind, obj)

    def evict(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        """POST pods/<name>/eviction: delete the pod unless a budget forbids it (429)."""
        if not isinstance(body, dict):
            raise ApiError.bad_request("the body of an eviction must be an Eviction object")
        if (body.get("metadata") or {}).get("name") not in (None, name):
            raise ApiError.bad_request("name in URL does not match name in Eviction object")
        options = DeleteOptions.from_request({}, body.get("deleteOptions"))
        with self.store.locked():
            pod = self._require(PODS, namespace, name)
            phase = (pod.get("status") or {}).get("phase")
            # The real server skips budgets for pods that are not running or already going.
            if phase in ("Succeeded", "Failed", "Pending") or pod["metadata"].get(
                "deletionTimestamp"
            ):
                self.delete(PODS, namespace, name, options)
                return _eviction_success()
            budgets = [
                b
                for b in self.list_objects(PODDISRUPTIONBUDGETS, namespace)
                if budget_selects(b, pod)
            ]
            if len(budgets) > 1:
                raise ApiError.internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction "
                    "subresource does not support."
                )
            if budgets:
                check_eviction(budgets[0])
            self.delete(PODS, namespace, name, options)
            return _eviction_success()

    # ------------------------------------------------------------- namespaces

    def ensure_namespace(self, name: str) -> None:
        """Create a namespace if absent (cluster bootstrap)."""
        if self.store.get(NAMESPACES, None, name) is None:
            self.create(NAMESPACES, None, {"metadata": {"name": name}})

    # ------------------------------------------------------------------- logs

    def write_log(self, namespace: str, pod: str, container: str, text: str) -> None:
        """Append container output (the simulated kubelet's side of pods/log)."""
        with self._logs_lock:
            containers = self._logs.setdefault((namespace, pod), {})
            containers[container] = containers.get(container, "") + text

    def read_log(
        self, namespace: str, name: str, container: str | None, tail_lines: int | None
    ) -> str:
        """GET pods/<name>/log, with the real server's refusals for ambiguous or unstarted pods."""
        pod = self.get(PODS, namespace, name)
        names = [c["name"] for c in pod["spec"].get("containers") or []]
        if container is None:
            if len(names) != 1:
                raise ApiError.bad_request(
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(names)}]"
                )
            container = names[0]
        elif container not in names:
            raise ApiError.bad_request(f"container {container} is not valid for pod {name}")
        status = pod.get("status") or {}
        started = any(
            s.get("name") == container
            and ("running" in (s.get("state") or {}) or "terminated" in (s.get("state") or {}))
            for s in status.get("containerStatuses") or []
        )
        if not started:
            reason = "ContainerCreating"
            for s in status.get("containerStatuses") or []:
                waiting = (s.get("state") or {}).get("waiting") or {}
                if s.get("name") == container and waiting.get("reason"):
                    reason = waiting["reason"]
            raise ApiError.bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {reason}'
            )
        with self._logs_lock:
            text = self._logs.get((namespace, name), {}).get(container, "")
        if tail_lines is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail_lines:]) if tail_lines > 0 else ""
        return text

    def close(self) -> None:
        """Cancel pending graceful deletions and wake watches."""
        self._closed = True
        for timer in list(self._timers):
            timer.cancel()
        self.store.close()

    # ---------------------------------------------------------------- helpers

    def _require(self, kind: ResourceKind, namespace: str | None, name: str) -> dict[str, Any]:
        found = self.store.get(kind, namespace, name)
        if found is None:
            raise ApiError.not_found(kind.group_resource, name)
        return found

    def _decorate(self, kind: ResourceKind, obj: dict[str, Any]) -> dict[str, Any]:
        # The disruption controller's status, computed when read so it is never stale.
        if kind == PODDISRUPTIONBUDGETS:
            pods = self.store.select(PODS, obj["metadata"].get("namespace"))
            obj["status"] = compute_budget_status(obj, pods, self._clock())
        return obj

    @staticmethod
    def _check_type(kind: ResourceKind, body: Mapping[str, Any]) -> None:
        api_version, kind_name = body.get("apiVersion"), body.get("kind")
        if api_version not in (None, "", kind.api_version):
            raise ApiError.bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({kind.api_version})"
            )
        if kind_name not in (None, "", kind.kind):
            raise ApiError.bad_request(
                f"the kind in the data ({kind_name}) does not match the expected kind ({kind.kind})"
            )

    @staticmethod
    def _check_uid(
        kind: ResourceKind, name: str, metadata: Mapping[str, Any], old: Mapping[str, Any]
    ) -> None:
        uid = metadata.get("uid")
        if uid not in (None, "", old["metadata"]["uid"]):
            raise ApiError.conflict(
                kind.group_resource,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                f"{old['metadata']['uid']}",
            )

    def _write_update(
        self,
        kind: ResourceKind,
        new: dict[str, Any],
        old: dict[str, Any],
        subresource: str | None,
        dry_run: bool,
    ) -> dict[str, Any]:
        if subresource == "status":
            prepare_for_status_update(kind, new, old)
        else:
            prepare_for_update(kind, new, old)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        validate_object(kind, new, old)
        # An update that changes nothing is not written: the revision stays, as on the real
        # server (etcd3 GuaranteedUpdate skips identical bytes).
        if new == old or dry_run:
            return self._decorate(kind, new)
        return self._decorate(kind, self.store.put(kind, new))

    def _check_preconditions(
        self, kind: ResourceKind, name: str, obj: Mapping[str, Any], options: DeleteOptions
    ) -> None:
        metadata = obj["metadata"]
        if options.precondition_uid not in (None, metadata["uid"]):
            raise ApiError.conflict(
                kind.group_resource,
                name,
                f"Precondition failed: UID in precondition: {options.precondition_uid}, "
                f"UID in object meta: {metadata['uid']}",
            )
        if options.precondition_resource_version not in (None, metadata["resourceVersion"]):
            raise ApiError.conflict(
                kind.group_resource,
                name,
                f"Precondition failed: ResourceVersion in precondition: "
                f"{options.precondition_resource_version}, ResourceVersion in object meta: "
                f"{metadata['resourceVersion']}",
            )

    def _delete_pod(self, pod: dict[str, Any], options: DeleteOptions) -> dict[str, Any]:
        metadata, spec = pod["metadata"], pod["spec"]
        grace = options.grace_period_s
        if grace is None:
            grace = int(spec.get("terminationGracePeriodSeconds", 30))
        phase = (pod.get("status") or {}).get("phase")
        # Unscheduled and finished pods have nothing to stop: the real server deletes them now.
        immediate = (
            grace <= 0
            or self._pod_termination_s <= 0
            or not spec.get("nodeName")
            or phase in _TERMINAL_PHASES
        )
        if not immediate:
            current = metadata.get("deletionGracePeriodSeconds")
            if current is not None and current <= grace:
                return pod
            return self._mark_deleting(PODS, pod, grace)
        if metadata.get("finalizers"):
            return self._mark_deleting(PODS, pod, 0)
        removed = self.store.remove(PODS, metadata["namespace"], metadata["name"])
        with self._logs_lock:
            self._logs.pop((metadata["namespace"], metadata["name"]), None)
        return removed or pod

    def _mark_deleting(self, kind: ResourceKind, obj: dict[str, Any], grace: int) -> dict[str, Any]:
        metadata = obj["metadata"]
        now = self._clock()
        metadata["deletionTimestamp"] = format_timestamp(now + grace)
        metadata["deletionGracePeriodSeconds"] = grace
        stored = self.store.put(kind, obj)
        if kind == PODS and grace > 0 and not metadata.get("finalizers"):
            delay = min(float(grace), self._pod_termination_s)
            self._schedule(
                delay,
                lambda: self._finish_pod(metadata["namespace"], metadata["name"], metadata["uid"]),
            )
        return stored

    def _schedule(self, delay_s: float, action: Callable[[], None]) -> None:
        if self._closed:
            return
        timer: threading.Timer

        def run() -> None:
            self._timers.discard(timer)
            if not self._closed:
                action()

        timer = threading.Timer(delay_s, run)
        timer.daemon = True
        self._timers.add(timer)
        timer.start()

    def _finish_pod(self, namespace: str, name: str, uid: str) -> None:
        with self.store.locked():
            pod = self.store.get(PODS, namespace, name)
            if pod is None or pod["metadata"]["uid"] != uid:
                return
            self.store.remove(PODS, namespace, name)
        with self._logs_lock:
            self._logs.pop((namespace, name), None)

    def _delete_namespace(self, namespace: dict[str, Any]) -> dict[str, Any]:
        name = namespace["metadata"]["name"]
        for kind in self.catalog.kinds:
            if kind.namespaced:
                for obj in self.store.select(kind, name):
                    self.store.remove(kind, name, obj["metadata"]["name"])
        namespace["metadata"]["deletionTimestamp"] = format_timestamp(self._clock())
        namespace["status"] = {"phase": "Terminating"}
        self.store.remove(NAMESPACES, None, name)
        return namespace

    def _collect_dependents(self, owner: Mapping[str, Any], options: DeleteOptions) -> None:
        """The garbage collector's part, done at once: dependents go with their owner."""
        if options.propagation_policy == "Orphan":
            return
        uid = owner["metadata"]["uid"]
        for kind in self.catalog.kinds:
            for obj in self.store.select(kind):
                references = obj["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in references):
                    metadata = obj["metadata"]
                    self.delete(kind, metadata.get("namespace"), metadata["name"])

    @staticmethod
    def _deleted_status(kind: ResourceKind, obj: Mapping[str, Any]) -> dict[str, Any]:
        details: dict[str, Any] = {"name": obj["metadata"]["name"]}
        if kind.group:
            details["group"] = kind.group
        details["kind"] = kind.resource
        details["uid"] = obj["metadata"]["uid"]
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }


def _eviction_success() -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}


def _required_rv() -> StatusCause:
    return StatusCause(
        "FieldValueInvalid",
        "Invalid value: 0: must be specified for an update",
        "metadata.resourceVersion",
    )
