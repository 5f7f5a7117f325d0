"""The client's errors, translated once into rollout's KubeError tree (status -> class,
cause chained, the Status message kept, the blocking PodDisruptionBudget named)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

import pydantic
import urllib3
from kubernetes.client.exceptions import ApiException

from rollout.transports.errors import (
    EvictionBlocked,
    Invalid,
    KubeError,
    KubeUnreachable,
    kube_error_class,
)

# The eviction API names the budget only in the cause's message:
# "The disruption budget web-pdb needs 2 healthy pods and has 2 currently".
_BUDGET_IN_MESSAGE = re.compile(r"disruption budget (\S+)")
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"


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
        # a body checked against the client's models before it is sent (a pod's manifest)
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
    error: KubeError
    budget = _blocking_budget(parsed) if status == 429 else None
    if status == 429 and budget is not None:
        error = EvictionBlocked(
            verb, obj, status=status, reason=http_reason, message=message, pdb=budget or None
        )
    else:
        error = kube_error_class(status)(
            verb, obj, status=status, reason=http_reason, message=message
        )
    error.retry_after_s = _retry_after_s(exc.headers)
    return error


def _retry_after_s(headers: Any) -> float:
    """Retry-After in seconds (the API server sends seconds, never an HTTP date); 0 if none."""
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0


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
        where = ".".join(str(part) for part in error["loc"])
        problems.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    return "; ".join(problems)


def _describe_urllib3(exc: urllib3.exceptions.HTTPError) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc)
