"""Self reviews: what `kubectl auth can-i` (one request, or `--list`) and `kubectl auth whoami`
ask, answered by the same authenticator and authorizer that guard the caller's requests."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.rbac import RequestAttributes, UserInfo
from rollout.lab.apiserver.resources import (
    SELFSUBJECTACCESSREVIEWS,
    SELFSUBJECTREVIEWS,
    SELFSUBJECTRULESREVIEWS,
)


def review_self_access(body: Any, decide: Callable[[RequestAttributes], bool]) -> dict[str, Any]:
    """The answered SelfSubjectAccessReview (201), or 422 as the real server words it."""
    if not isinstance(body, dict):
        raise ApiError.bad_request("the request body is not a SelfSubjectAccessReview")
    spec = body.get("spec") or {}
    resource, non_resource = spec.get("resourceAttributes"), spec.get("nonResourceAttributes")
    if (resource is None) == (non_resource is None):
        field, message = (
            (
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
            if resource is None
            else (
                "spec.nonResourceAttributes",
                "cannot be specified in combination with resourceAttributes",
            )
        )
        raise ApiError.invalid(
            SELFSUBJECTACCESSREVIEWS.kind,
            SELFSUBJECTACCESSREVIEWS.group,
            "",
            [StatusCause("FieldValueInvalid", f"Invalid value: null: {message}", field)],
        )
    review = copy.deepcopy(body)
    review["apiVersion"] = SELFSUBJECTACCESSREVIEWS.api_version
    review["kind"] = SELFSUBJECTACCESSREVIEWS.kind
    review.setdefault("metadata", {}).setdefault("creationTimestamp", None)
    if resource is not None:
        attributes = RequestAttributes(
            verb=str(resource.get("verb") or ""),
            api_group=str(resource.get("group") or ""),
            resource=str(resource.get("resource") or ""),
            subresource=str(resource.get("subresource") or ""),
            namespace=str(resource.get("namespace") or ""),
            name=str(resource.get("name") or ""),
        )
    else:
        non_resource = non_resource or {}
        attributes = RequestAttributes.for_path(
            str(non_resource.get("verb") or ""), str(non_resource.get("path") or "")
        )
    review["status"] = {"allowed": decide(attributes)}
    return review


def review_self_rules(body: Any, rules: Callable[[str], list[Mapping[str, Any]]]) -> dict[str, Any]:
    """The answered SelfSubjectRulesReview: the caller's rules in spec.namespace."""
    spec = (body.get("spec") if isinstance(body, dict) else None) or {}
    namespace = str(spec.get("namespace") or "")
    resource_rules, non_resource_rules = [], []
    for rule in rules(namespace):
        if rule.get("nonResourceURLs"):
            non_resource_rules.append(
                {"verbs": list(rule.get("verbs") or []), "nonResourceURLs": rule["nonResourceURLs"]}
            )
        else:
            resource_rule = {
                "verbs": list(rule.get("verbs") or []),
                "apiGroups": list(rule.get("apiGroups") or []),
                "resources": list(rule.get("resources") or []),
            }
            if rule.get("resourceNames"):
                resource_rule["resourceNames"] = list(rule["resourceNames"])
            resource_rules.append(resource_rule)
    return {
        "kind": SELFSUBJECTRULESREVIEWS.kind,
        "apiVersion": SELFSUBJECTRULESREVIEWS.api_version,
        "metadata": {"creationTimestamp": None},
        "spec": {"namespace": namespace} if namespace else {},
        "status": {
            "resourceRules": resource_rules,
            "nonResourceRules": non_resource_rules,
            "incomplete": False,
        },
    }


def review_self(user: UserInfo) -> dict[str, Any]:
    """The answered SelfSubjectReview (kubectl auth whoami): who the server thinks you are."""
    user_info: dict[str, Any] = {"username": user.name, "groups": list(user.groups)}
    if user.uid:
        user_info["uid"] = user.uid
    if user.extra:
        user_info["extra"] = {key: list(values) for key, values in user.extra}
    return {
        "kind": SELFSUBJECTREVIEWS.kind,
        "apiVersion": SELFSUBJECTREVIEWS.api_version,
        "metadata": {"creationTimestamp": None},
        "status": {"userInfo": user_info},
    }
