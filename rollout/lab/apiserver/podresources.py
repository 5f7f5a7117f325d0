"""The API server's rules for a container's resources, as kube-apiserver validates a pod.

Only what rollout's users meet with GPUs is reproduced (pkg/apis/core/validation,
ValidateResourceRequirements): an extended resource — a name with a domain other than
kubernetes.io, such as nvidia.com/gpu — cannot be overcommitted, so

- its quantity must be a whole number: `Invalid value: "500m": must be an integer`;
- a request needs a limit: `Required value: Limit must be set for non overcommitable
  resources`, on the container's `resources.limits`;
- a request must equal its limit: `Invalid value: "1": must be equal to nvidia.com/gpu limit
  of 2`, on `resources.requests`.

A limit alone is the normal form: the request defaults to it.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from rollout.lab.apiserver.errors import StatusCause
from rollout.lab.apiserver.fielderrors import invalid, required
from rollout.lab.quantity import parse_quantity

NATIVE_DOMAIN = "kubernetes.io"


def is_extended_resource(name: str) -> bool:
    """A resource the API server will not let a pod overcommit (and counts in whole units)."""
    domain, slash, _ = name.partition("/")
    if not slash:
        return False
    return not (domain == NATIVE_DOMAIN or domain.endswith("." + NATIVE_DOMAIN))


def container_resource_causes(spec: Mapping[str, Any]) -> list[StatusCause]:
    """Every resources problem of the pod's init and app containers, in the server's order."""
    causes: list[StatusCause] = []
    for group in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(group) or []):
            if isinstance(container, Mapping):
                path = f"spec.{group}[{index}].resources"
                causes += _requirement_causes(container.get("resources") or {}, path)
    return causes


def _requirement_causes(resources: Mapping[str, Any], path: str) -> list[StatusCause]:
    limits = _quantities(resources.get("limits"))
    requests = _quantities(resources.get("requests"))
    causes: list[StatusCause] = []
    for name, (text, value) in limits.items():
        causes += _whole(name, text, value, f"{path}.limits[{name}]")
    for name, (text, value) in requests.items():
        causes += _whole(name, text, value, f"{path}.requests[{name}]")
        if not is_extended_resource(name):
            continue
        if name not in limits:
            causes.append(
                required(f"{path}.limits", "Limit must be set for non overcommitable resources")
            )
        elif value != limits[name][1]:
            why = f"must be equal to {name} limit of {limits[name][0]}"
            causes.append(invalid(f"{path}.requests", text, why))
    return causes


def _whole(name: str, text: str, value: Fraction | None, field: str) -> list[StatusCause]:
    if value is None or not is_extended_resource(name) or value.denominator == 1:
        return []
    return [invalid(field, text, "must be an integer")]


def _quantities(value: Any) -> dict[str, tuple[str, Fraction | None]]:
    """name -> (the quantity as written, its value; None where it does not parse)."""
    if not isinstance(value, Mapping):
        return {}
    found: dict[str, tuple[str, Fraction | None]] = {}
    for name, quantity in value.items():
        text = str(quantity)
        try:
            found[str(name)] = (text, parse_quantity(quantity))
        except (ValueError, TypeError, ZeroDivisionError):
            found[str(name)] = (text, None)
    return found
