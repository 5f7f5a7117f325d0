"""Access reviews: what `kubectl auth can-i` asks, answered by the same authorizer that
guards the caller's own requests."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.rbac import RequestAttributes
from rollout.lab.apiserver.resources import SELFSUBJECTACCESSREVIEWS


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
