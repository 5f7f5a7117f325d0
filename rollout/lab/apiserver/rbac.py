"""Who may do what: request attributes, as kube-apiserver derives them from a request, and the
RBAC authorizer over the stored Roles, ClusterRoles and bindings (with the privileged
`system:masters` group ahead of it, as the real server chains them)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.errors import ApiError, GroupResource
from rollout.lab.apiserver.resources import (
    CLUSTERROLEBINDINGS,
    CLUSTERROLES,
    NAMESPACES,
    ROLEBINDINGS,
    ROLES,
    ResourceKind,
)
from rollout.lab.apiserver.store import Store

MASTERS_GROUP = "system:masters"
AUTHENTICATED_GROUP = "system:authenticated"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class UserInfo:
    """An authenticated (or anonymous) caller."""

    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    # user.Info's extra: key -> values (set by an authenticator, or impersonated)
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    @classmethod
    def from_service_account(cls, namespace: str, name: str, uid: str) -> UserInfo:
        return cls(
            f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED_GROUP),
            uid,
        )


ANONYMOUS = UserInfo("system:anonymous", (UNAUTHENTICATED_GROUP,))


@dataclass(frozen=True)
class RequestAttributes:
    """authorizer.Attributes: the verb and what it is about, for a resource or a plain path."""

    verb: str
    path: str = ""
    resource_request: bool = True
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @classmethod
    def for_resource(
        cls,
        method: str,
        kind: ResourceKind,
        namespace: str | None,
        name: str | None,
        subresource: str | None,
        *,
        watch: bool = False,
    ) -> RequestAttributes:
        """As RequestInfoFactory reads a resource path (a namespace's own namespace is itself)."""
        if method == "GET":
            verb = "watch" if watch else ("get" if name else "list")
        elif method == "DELETE" and not name:
            verb = "deletecollection"
        else:
            verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}[method]
        if kind == NAMESPACES and name:
            namespace = name
        return cls(
            verb=verb,
            api_group=kind.group,
            resource=kind.resource,
            subresource=subresource or "",
            namespace=namespace or "",
            name=name or "",
        )

    @classmethod
    def for_path(cls, method: str, path: str) -> RequestAttributes:
        return cls(verb=method.lower(), path=path, resource_request=False)

    def forbidden(self, user: UserInfo) -> ApiError:
        """The 403 the real server answers, worded by its forbiddenMessage."""
        if not self.resource_request:
            why = f'User "{user.name}" cannot {self.verb} path "{self.path}"'
            return ApiError.forbidden(GroupResource("", ""), "", why)
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        scope = f'in the namespace "{self.namespace}"' if self.namespace else "at the cluster scope"
        why = (
            f'User "{user.name}" cannot {self.verb} resource "{resource}" in API group '
            f'"{self.api_group}" {scope}'
        )
        return ApiError.forbidden(GroupResource(self.api_group, self.resource), self.name, why)


def is_allowed(store: Store, user: UserInfo, attributes: RequestAttributes) -> bool:
    """The privileged group, then RBAC: any rule of any role bound to the user allows."""
    if MASTERS_GROUP in user.groups:
        return True
    with store.locked():
        return any(_rule_allows(rule, attributes) for rule in _rules_for(store, user, attributes))


def list_rules(store: Store, user: UserInfo, namespace: str) -> list[Mapping[str, Any]]:
    """Every rule bound to the user cluster-wide or in `namespace` (what can-i --list shows)."""
    with store.locked():
        return list(_rules_for(store, user, RequestAttributes(verb="", namespace=namespace)))


def _rules_for(
    store: Store, user: UserInfo, attributes: RequestAttributes
) -> Iterable[Mapping[str, Any]]:
    for binding in store.select(CLUSTERROLEBINDINGS):
        if _binds(binding, user, ""):
            yield from _role_rules(store, binding, "")
    if attributes.namespace:
        for binding in store.select(ROLEBINDINGS, attributes.namespace):
            if _binds(binding, user, attributes.namespace):
                yield from _role_rules(store, binding, attributes.namespace)


def _binds(binding: Mapping[str, Any], user: UserInfo, namespace: str) -> bool:
    for subject in binding.get("subjects") or []:
        kind, name = subject.get("kind"), subject.get("name")
        if kind == "User" and name == user.name:
            return True
        if kind == "Group" and name in user.groups:
            return True
        if kind == "ServiceAccount":
            account_namespace = subject.get("namespace") or namespace
            if user.name == f"{SERVICE_ACCOUNT_PREFIX}{account_namespace}:{name}":
                return True
    return False


def _role_rules(
    store: Store, binding: Mapping[str, Any], namespace: str
) -> list[Mapping[str, Any]]:
    ref = binding.get("roleRef") or {}
    name = str(ref.get("name") or "")
    if ref.get("kind") == "Role" and namespace:
        role = store.get(ROLES, namespace, name)
    elif ref.get("kind") == "ClusterRole":
        role = store.get(CLUSTERROLES, None, name)
    else:
        role = None
    rules: list[Mapping[str, Any]] = (role or {}).get("rules") or []
    return rules


def _rule_allows(rule: Mapping[str, Any], attributes: RequestAttributes) -> bool:
    if not _has(rule.get("verbs"), attributes.verb):
        return False
    if not attributes.resource_request:
        return any(
            url == "*"
            or url == attributes.path
            or (url.endswith("*") and attributes.path.startswith(url[:-1]))
            for url in rule.get("nonResourceURLs") or []
        )
    if not _has(rule.get("apiGroups"), attributes.api_group):
        return False
    combined = (
        f"{attributes.resource}/{attributes.subresource}"
        if attributes.subresource
        else attributes.resource
    )
    resources = rule.get("resources") or []
    if not any(
        r in ("*", combined) or (attributes.subresource and r == f"*/{attributes.subresource}")
        for r in resources
    ):
        return False
    names = rule.get("resourceNames") or []
    return not names or attributes.name in names


def _has(values: Any, wanted: str) -> bool:
    return any(v in ("*", wanted) for v in values or [])


# ------------------------------------------------------------ bootstrap policy

_DISCOVERY_URLS = [
    "/api",
    "/api/*",
    "/apis",
    "/apis/*",
    "/healthz",
    "/livez",
    "/openapi",
    "/openapi/*",
    "/readyz",
    "/version",
    "/version/",
]
_PUBLIC_URLS = ["/healthz", "/livez", "/readyz", "/version", "/version/"]
BOOTSTRAP_CLUSTER_ROLES: dict[str, list[dict[str, Any]]] = {
    "cluster-admin": [
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
        {"nonResourceURLs": ["*"], "verbs": ["*"]},
    ],
    "system:discovery": [{"nonResourceURLs": _DISCOVERY_URLS, "verbs": ["get"]}],
    "system:public-info-viewer": [{"nonResourceURLs": _PUBLIC_URLS, "verbs": ["get"]}],
    "system:basic-user": [
        {
            "apiGroups": ["authorization.k8s.io"],
            "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
            "verbs": ["create"],
        },
        {
            "apiGroups": ["authentication.k8s.io"],
            "resources": ["selfsubjectreviews"],
            "verbs": ["create"],
        },
    ],
}
BOOTSTRAP_BINDINGS: dict[str, tuple[str, ...]] = {
    "cluster-admin": (MASTERS_GROUP,),
    "system:discovery": (AUTHENTICATED_GROUP,),
    "system:public-info-viewer": (AUTHENTICATED_GROUP, UNAUTHENTICATED_GROUP),
    "system:basic-user": (AUTHENTICATED_GROUP,),
}


def to_bootstrap_objects() -> list[tuple[ResourceKind, dict[str, Any]]]:
    """The ClusterRoles and ClusterRoleBindings kube-apiserver creates at start."""
    labels = {"kubernetes.io/bootstrapping": "rbac-defaults"}
    annotations = {"rbac.authorization.kubernetes.io/autoupdate": "true"}
    objects: list[tuple[ResourceKind, dict[str, Any]]] = []
    for name, rules in BOOTSTRAP_CLUSTER_ROLES.items():
        metadata = {"name": name, "labels": labels, "annotations": annotations}
        objects.append((CLUSTERROLES, {"metadata": dict(metadata), "rules": rules}))
        objects.append(
            (
                CLUSTERROLEBINDINGS,
                {
                    "metadata": dict(metadata),
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": name,
                    },
                    "subjects": [
                        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}
                        for group in BOOTSTRAP_BINDINGS[name]
                    ],
                },
            )
        )
    return objects
