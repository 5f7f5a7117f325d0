"""The resource kinds the emulator serves, and the discovery documents that describe them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from rollout.lab.apiserver.errors import GroupResource

CRUD_VERBS = ("create", "delete", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceKind:
    """One served resource: where it lives in the URL space and how it behaves generically."""

    group: str
    version: str
    resource: str
    kind: str
    _: KW_ONLY
    namespaced: bool
    subresources: frozenset[str] = frozenset()
    short_names: tuple[str, ...] = ()
    # Field selectors the real server registers for this resource, beyond metadata.name and
    # metadata.namespace; any other field is refused with 400 as the real server does.
    selectable_fields: tuple[str, ...] = ()
    # Custom resources: no strategic merge patch, status-only status updates, rv required on PUT.
    custom: bool = False
    # Kinds whose metadata.generation moves when spec changes.
    tracks_generation: bool = False
    verbs: tuple[str, ...] = field(default=CRUD_VERBS)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> GroupResource:
        return GroupResource(self.group, self.resource)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def singular(self) -> str:
        """The singular name: the lowercase kind, the real API server's default."""
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


NODES = ResourceKind(
    "",
    "v1",
    "nodes",
    "Node",
    namespaced=False,
    subresources=frozenset({"status"}),
    short_names=("no",),
    selectable_fields=("spec.unschedulable",),
)
PODS = ResourceKind(
    "",
    "v1",
    "pods",
    "Pod",
    namespaced=True,
    subresources=frozenset({"status", "log", "eviction"}),
    short_names=("po",),
    selectable_fields=(
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
)
NAMESPACES = ResourceKind(
    "",
    "v1",
    "namespaces",
    "Namespace",
    namespaced=False,
    subresources=frozenset({"status"}),
    short_names=("ns",),
    selectable_fields=("status.phase",),
)
CONFIGMAPS = ResourceKind("", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",))
# rollout's run state in the cluster (rollout/run/cluster.py): opaque data, base64 as sent
SECRETS = ResourceKind("", "v1", "secrets", "Secret", namespaced=True, selectable_fields=("type",))
EVENTS = ResourceKind(
    "",
    "v1",
    "events",
    "Event",
    namespaced=True,
    short_names=("ev",),
    selectable_fields=(
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
)
DAEMONSETS = ResourceKind(
    "apps",
    "v1",
    "daemonsets",
    "DaemonSet",
    namespaced=True,
    subresources=frozenset({"status"}),
    short_names=("ds",),
    tracks_generation=True,
)
PODDISRUPTIONBUDGETS = ResourceKind(
    "policy",
    "v1",
    "poddisruptionbudgets",
    "PodDisruptionBudget",
    namespaced=True,
    subresources=frozenset({"status"}),
    short_names=("pdb",),
    tracks_generation=True,
)
LEASES = ResourceKind("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True)
CLUSTERPOLICIES = ResourceKind(
    "nvidia.com",
    "v1",
    "clusterpolicies",
    "ClusterPolicy",
    namespaced=False,
    subresources=frozenset({"status"}),
    custom=True,
    tracks_generation=True,
)
# The GPU Operator's per-node-pool driver (api/nvidia/v1alpha1, cluster-scoped, short names
# from its kubebuilder markers); reconciled only with ClusterPolicy driver.useNvidiaDriverCRD
NVIDIADRIVERS = ResourceKind(
    "nvidia.com",
    "v1alpha1",
    "nvidiadrivers",
    "NVIDIADriver",
    namespaced=False,
    subresources=frozenset({"status"}),
    short_names=("nvd", "nvdriver", "nvdrivers"),
    custom=True,
    tracks_generation=True,
)
RUNTIMECLASSES = ResourceKind(
    "node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", namespaced=False
)
SERVICEACCOUNTS = ResourceKind(
    "",
    "v1",
    "serviceaccounts",
    "ServiceAccount",
    namespaced=True,
    subresources=frozenset({"token"}),
    short_names=("sa",),
)
_RBAC = "rbac.authorization.k8s.io"
ROLES = ResourceKind(_RBAC, "v1", "roles", "Role", namespaced=True)
ROLEBINDINGS = ResourceKind(_RBAC, "v1", "rolebindings", "RoleBinding", namespaced=True)
CLUSTERROLES = ResourceKind(_RBAC, "v1", "clusterroles", "ClusterRole", namespaced=False)
CLUSTERROLEBINDINGS = ResourceKind(
    _RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", namespaced=False
)
# Scheduled rollouts (rollout schedule): validated and defaulted in apiserver/batch.py, run by
# the lab's CronJob controller (simulation/cronjobs.py).
CRONJOBS = ResourceKind(
    "batch",
    "v1",
    "cronjobs",
    "CronJob",
    namespaced=True,
    subresources=frozenset({"status"}),
    short_names=("cj",),
    tracks_generation=True,
)
JOBS = ResourceKind(
    "batch",
    "v1",
    "jobs",
    "Job",
    namespaced=True,
    subresources=frozenset({"status"}),
    selectable_fields=("status.successful",),
    tracks_generation=True,
)
# Not stored: a review is created and answered in the same request (kubectl auth can-i).
SELFSUBJECTACCESSREVIEWS = ResourceKind(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "SelfSubjectAccessReview",
    namespaced=False,
    verbs=("create",),
)

SELFSUBJECTRULESREVIEWS = ResourceKind(
    "authorization.k8s.io",
    "v1",
    "selfsubjectrulesreviews",
    "SelfSubjectRulesReview",
    namespaced=False,
    verbs=("create",),
)
SELFSUBJECTREVIEWS = ResourceKind(
    "authentication.k8s.io",
    "v1",
    "selfsubjectreviews",
    "SelfSubjectReview",
    namespaced=False,
    verbs=("create",),
)
# Answered in the request that creates them, never stored.
REVIEW_KINDS = (SELFSUBJECTACCESSREVIEWS, SELFSUBJECTRULESREVIEWS, SELFSUBJECTREVIEWS)

ALL_KINDS: tuple[ResourceKind, ...] = (
    NODES,
    PODS,
    NAMESPACES,
    CONFIGMAPS,
    SECRETS,
    EVENTS,
    DAEMONSETS,
    PODDISRUPTIONBUDGETS,
    LEASES,
    CLUSTERPOLICIES,
    NVIDIADRIVERS,
    RUNTIMECLASSES,
    SERVICEACCOUNTS,
    ROLES,
    ROLEBINDINGS,
    CLUSTERROLES,
    CLUSTERROLEBINDINGS,
    CRONJOBS,
    JOBS,
    SELFSUBJECTACCESSREVIEWS,
    SELFSUBJECTRULESREVIEWS,
    SELFSUBJECTREVIEWS,
)

# Subresources that are not generic status updates: their verbs and kinds for discovery.
_SPECIAL_SUBRESOURCES: dict[str, tuple[tuple[str, ...], str, str, str]] = {
    "log": (("get",), "Pod", "", ""),
    "eviction": (("create",), "Eviction", "policy", "v1"),
    "token": (("create",), "TokenRequest", "authentication.k8s.io", "v1"),
}


class ResourceCatalog:
    """Looks up served kinds by URL coordinates and writes the discovery documents."""

    def __init__(self, kinds: Iterable[ResourceKind] = ALL_KINDS) -> None:
        self._kinds = tuple(kinds)
        self._by_path = {(k.group, k.version, k.resource): k for k in self._kinds}

    @property
    def kinds(self) -> tuple[ResourceKind, ...]:
        return self._kinds

    def find_kind(self, group: str, version: str, resource: str) -> ResourceKind | None:
        return self._by_path.get((group, version, resource))

    def has_group_version(self, group: str, version: str) -> bool:
        return any(k.group == group and k.version == version for k in self._kinds)

    def groups(self) -> list[str]:
        named = [k.group for k in self._kinds if k.group]
        return sorted(set(named), key=named.index)

    def to_api_versions(self, server_address: str) -> dict[str, Any]:
        """GET /api."""
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
            ],
        }

    def to_api_group(self, group: str) -> dict[str, Any]:
        """GET /apis/<group>, and one entry of GET /apis."""
        versions = sorted({k.version for k in self._kinds if k.group == group})
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {
            "kind": "APIGroup",
            "apiVersion": "v1",
            "name": group,
            "versions": entries,
            "preferredVersion": entries[0],
        }

    def to_api_group_list(self) -> dict[str, Any]:
        """GET /apis."""
        groups = []
        for group in self.groups():
            entry = self.to_api_group(group)
            del entry["kind"], entry["apiVersion"]
            groups.append(entry)
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}

    def to_resource_list(self, group: str, version: str) -> dict[str, Any]:
        """GET /api/v1 or /apis/<group>/<version>."""
        resources: list[dict[str, Any]] = []
        for kind in self._kinds:
            if kind.group != group or kind.version != version:
                continue
            entry: dict[str, Any] = {
                "name": kind.resource,
                "singularName": kind.singular,
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": list(kind.verbs),
            }
            if kind.short_names:
                entry["shortNames"] = list(kind.short_names)
            resources.append(entry)
            for sub in sorted(kind.subresources):
                verbs, sub_kind, sub_group, sub_version = _SPECIAL_SUBRESOURCES.get(
                    sub, (("get", "patch", "update"), kind.kind, "", "")
                )
                sub_entry: dict[str, Any] = {
                    "name": f"{kind.resource}/{sub}",
                    "singularName": "",
                    "namespaced": kind.namespaced,
                    "kind": sub_kind,
                    "verbs": list(verbs),
                }
                if sub_group:
                    sub_entry["group"] = sub_group
                    sub_entry["version"] = sub_version
                resources.append(sub_entry)
        group_version = f"{group}/{version}" if group else version
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": resources,
        }
