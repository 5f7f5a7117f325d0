"""Access reviews: what `kubectl auth can-i` asks. The lab serves without authorization (its
kubeconfig carries no credentials), so every request is allowed, and the review says so."""

from __future__ import annotations

import copy
from typing import Any

from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.resources import SELFSUBJECTACCESSREVIEWS

_ALLOWED_REASON = "the lab API server authorizes every request"


def review_self_access(body: Any) -> dict[str, Any]:
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
    review["status"] = {"allowed": True, "reason": _ALLOWED_REASON}
    return review
