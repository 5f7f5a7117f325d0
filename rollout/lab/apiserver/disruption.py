"""PodDisruptionBudget status, computed as the disruption controller does, and eviction checks."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from rollout.lab.apiserver.errors import ApiError, StatusCause
from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.selectors import LabelSelector

DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"
EVICTION_REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."


def scale_int_or_percent(value: int | str, total: int, *, round_up: bool) -> int:
    """intstr.GetScaledValueFromIntOrPercent."""
    if isinstance(value, int):
        return value
    percent = int(value.rstrip("%"))
    scaled = total * percent / 100
    return math.ceil(scaled) if round_up else math.floor(scaled)


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def budget_selects(budget: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """policy/v1 semantics: an empty selector selects every pod of the namespace, null none."""
    if budget["metadata"].get("namespace") != pod["metadata"].get("namespace"):
        return False
    selector = LabelSelector.from_spec((budget.get("spec") or {}).get("selector"))
    return selector.matches(pod["metadata"].get("labels"))


def compute_budget_status(
    budget: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], now_s: float
) -> dict[str, Any]:
    """The status the disruption controller would write for `budget` given these pods.

    Expected pods are the pods the selector matches; the real controller takes the scale of
    their controllers for percentages and maxUnavailable, which equals this count for the
    DaemonSet and bare pods the lab runs.
    """
    spec = budget.get("spec") or {}
    selected = [p for p in pods if budget_selects(budget, p)]
    expected = len(selected)
    healthy = sum(
        1 for p in selected if not p["metadata"].get("deletionTimestamp") and is_pod_ready(p)
    )
    if spec.get("maxUnavailable") is not None:
        unavailable = scale_int_or_percent(spec["maxUnavailable"], expected, round_up=True)
        desired = max(0, expected - unavailable)
    elif spec.get("minAvailable") is not None:
        desired = scale_int_or_percent(spec["minAvailable"], expected, round_up=True)
    else:
        desired = 0
    allowed = max(0, healthy - desired)
    generation = int(budget["metadata"].get("generation", 1))
    previous = (budget.get("status") or {}).get("conditions") or []
    allowed_text = "True" if allowed > 0 else "False"
    transition = next(
        (
            c.get("lastTransitionTime")
            for c in previous
            if c.get("type") == "DisruptionAllowed" and c.get("status") == allowed_text
        ),
        None,
    ) or format_timestamp(now_s)
    return {
        "observedGeneration": generation,
        "disruptionsAllowed": allowed,
        "currentHealthy": healthy,
        "desiredHealthy": desired,
        "expectedPods": expected,
        "conditions": [
            {
                "type": "DisruptionAllowed",
                "status": allowed_text,
                "reason": "SufficientPods" if allowed > 0 else "InsufficientPods",
                "message": "",
                "observedGeneration": generation,
                "lastTransitionTime": transition,
            }
        ],
    }


def check_eviction(budget: Mapping[str, Any]) -> None:
    """Raise the real server's 429 when `budget` (with computed status) allows no disruption."""
    status = budget.get("status") or {}
    if int(status.get("disruptionsAllowed", 0)) > 0:
        return
    name = budget["metadata"]["name"]
    raise ApiError.too_many_requests(
        EVICTION_REFUSED,
        [
            StatusCause(
                DISRUPTION_BUDGET_CAUSE,
                f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy "
                f"pods and has {status.get('currentHealthy', 0)} currently",
            )
        ],
    )
