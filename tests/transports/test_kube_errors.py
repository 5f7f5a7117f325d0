"""ApiException and urllib3 errors become rollout's KubeError tree at the client boundary."""

from __future__ import annotations

import json
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from rollout.errors import ExitCode, RolloutError, TransientError
from rollout.transports.errors import (
    MAX_MESSAGE_CHARS,
    BadRequest,
    Conflict,
    EvictionBlocked,
    Forbidden,
    Invalid,
    KubeError,
    KubeUnreachable,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
)
from rollout.transports.kube import error_from_api_exception, translate_api_errors


def status_body(
    code: int, reason: str, message: str, causes: list[dict[str, Any]] | None = None
) -> str:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if causes is not None:
        status["details"] = {"causes": causes}
    return json.dumps(status)


@pytest.mark.parametrize(
    ("code", "http_reason", "expected"),
    [
        (400, "Bad Request", BadRequest),
        (401, "Unauthorized", Unauthorized),
        (403, "Forbidden", Forbidden),
        (404, "Not Found", NotFound),
        (409, "Conflict", Conflict),
        (422, "Unprocessable Entity", Invalid),
        (429, "Too Many Requests", TooManyRequests),
        (500, "Internal Server Error", ServerError),
        (503, "Service Unavailable", ServerError),
        (410, "Gone", KubeError),
    ],
)
def test_status_codes_map_to_classes(
    code: int, http_reason: str, expected: type[KubeError]
) -> None:
    exc = ApiException(status=code, reason=http_reason, body=status_body(code, "X", "the message"))
    error = error_from_api_exception(exc, "patch", "node lab-node-1")
    assert type(error) is expected
    assert error.status == code
    assert error.reason == http_reason
    assert error.message == "the message"
    assert error.verb == "patch" and error.obj == "node lab-node-1"
    assert str(error).startswith(f"patch node lab-node-1: {code} {http_reason}: the message")
    assert isinstance(error, RolloutError)
    assert error.exit_code == ExitCode.FAILED


def test_the_cause_is_chained_by_the_context_manager() -> None:
    cause = ApiException(
        status=404, reason="Not Found", body=status_body(404, "NotFound", 'nodes "n9" not found')
    )
    with pytest.raises(NotFound) as raised, translate_api_errors("get", "node n9"):
        raise cause
    assert raised.value.__cause__ is cause
    assert 'nodes "n9" not found' in str(raised.value)


def test_a_conflict_keeps_the_servers_explanation() -> None:
    message = (
        'Operation cannot be fulfilled on leases.coordination.k8s.io "rollout": the object has '
        "been modified; please apply your changes to the latest version and try again"
    )
    exc = ApiException(status=409, reason="Conflict", body=status_body(409, "Conflict", message))
    error = error_from_api_exception(exc, "replace", "lease kube-system/rollout")
    assert isinstance(error, Conflict)
    assert "the object has been modified" in str(error)


@pytest.mark.parametrize(
    ("cause", "pdb"),
    [
        (
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget web-pdb needs 2 healthy pods and has 2 currently",
            },
            "web-pdb",
        ),
        # the kind of cause in `type` rather than `reason` counts too
        ({"type": "DisruptionBudget", "message": "The disruption budget db needs 1"}, "db"),
    ],
)
def test_eviction_refused_by_a_budget_names_the_budget(cause: dict[str, str], pdb: str) -> None:
    message = "Cannot evict pod as it would violate the pod's disruption budget."
    body = status_body(429, "TooManyRequests", message, [cause])
    exc = ApiException(status=429, reason="Too Many Requests", body=body)
    error = error_from_api_exception(exc, "evict", "pod default/web-1")
    assert isinstance(error, EvictionBlocked)
    assert isinstance(error, TooManyRequests) and isinstance(error, TransientError)
    assert error.pdb == pdb
    assert "disruption budget" in str(error)


def test_plain_throttling_is_not_an_eviction_block() -> None:
    exc = ApiException(
        status=429,
        reason="Too Many Requests",
        body=status_body(429, "TooManyRequests", "slow down"),
    )
    error = error_from_api_exception(exc, "list", "pods")
    assert type(error) is TooManyRequests


def test_a_huge_non_status_body_is_truncated() -> None:
    body = "<html>" + "x" * 10_000 + "</html>"
    exc = ApiException(status=502, reason="Bad Gateway", body=body)
    error = error_from_api_exception(exc, "get", "node n1")
    assert isinstance(error, ServerError) and isinstance(error, TransientError)
    assert len(error.message) < MAX_MESSAGE_CHARS + 50
    assert "more characters" in error.message
    assert len(str(error)) < MAX_MESSAGE_CHARS + 200


def test_bytes_body_and_no_body_are_handled() -> None:
    exc = ApiException(
        status=403, reason="Forbidden", body=status_body(403, "Forbidden", "no").encode()
    )  # type: ignore[arg-type]
    error = error_from_api_exception(exc, "list", "nodes")
    assert isinstance(error, Forbidden) and error.message == "no"
    assert "hint:" in str(error)
    bare = error_from_api_exception(
        ApiException(status=500, reason="Internal Server Error"), "get", "node n1"
    )
    assert isinstance(bare, ServerError) and bare.message == ""


def test_connection_errors_are_unreachable_and_transient() -> None:
    cause = urllib3.exceptions.NewConnectionError(
        None, "Failed to establish a new connection: [Errno 111] Connection refused"
    )  # type: ignore[arg-type]
    with pytest.raises(KubeUnreachable) as raised, translate_api_errors("list", "nodes"):
        raise cause
    assert raised.value.__cause__ is cause
    assert isinstance(raised.value, TransientError)
    assert "Connection refused" in str(raised.value)
    assert str(raised.value).startswith("list nodes: API server unreachable")


def test_max_retry_error_reports_its_reason() -> None:
    reason = urllib3.exceptions.ReadTimeoutError(None, "/api/v1/nodes", "Read timed out.")  # type: ignore[arg-type]
    cause = urllib3.exceptions.MaxRetryError(None, "/api/v1/nodes", reason)  # type: ignore[arg-type]
    with pytest.raises(KubeUnreachable) as raised, translate_api_errors("list", "nodes"):
        raise cause
    assert "Read timed out" in str(raised.value)


def test_other_exceptions_pass_through_untouched() -> None:
    with pytest.raises(KeyError), translate_api_errors("get", "node n1"):
        raise KeyError("a bug")


def forbidden(verb: str, obj: str) -> str:
    body = status_body(403, "Forbidden", "cannot")
    return str(error_from_api_exception(ApiException(403, "Forbidden", body=body), verb, obj))


@pytest.mark.parametrize(
    ("verb", "obj", "can_i"),
    [
        ("patch", "node lab-node-1", "patch nodes"),
        ("evict", "pod default/web-1", "create pods --subresource=eviction -n default"),
        (
            "replace",
            "lease kube-system/rollout",
            "update leases.coordination.k8s.io -n kube-system",
        ),
        ("list", "pods in all namespaces (spec.nodeName=n1)", "list pods --all-namespaces"),
        ("read log of", "pod ns/smoke", "get pods --subresource=log -n ns"),
        ("create", "event for node n1 in default", "create events -n default"),
    ],
)
def test_forbidden_says_what_to_grant(verb: str, obj: str, can_i: str) -> None:
    text = forbidden(verb, obj)
    rbac_verb, resource, *rest = can_i.split()
    if rest and rest[0].startswith("--subresource="):
        resource += "/" + rest[0].split("=", 1)[1]
    assert f"hint: grant the user or service account `{rbac_verb}` on `{resource}`" in text
    assert f"`kubectl auth can-i {can_i}` checks it" in text
    assert "rollout schedule" not in text


def test_forbidden_says_where_to_grant() -> None:
    assert "`pods/eviction` in namespace d (a Role or" in forbidden("evict", "pod d/p")
    assert "`pods` in every namespace (a Role or" in forbidden("list", "pods in all namespaces")
    assert "`nodes` (a Role or" in forbidden("list", "nodes")
