"""The scheduler: binds pending pods to nodes that fit, or says why none does, as the real one.

Filters run in the real default order and a node is rejected by the first that fails:
NodeUnschedulable, TaintToleration, NodeAffinity (nodeSelector and required affinity),
NodeResourcesFit. The failure message is built like the real FitError's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rollout.lab.apiserver.errors import ApiError
from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import NODES, PODS
from rollout.lab.quantity import parse_quantity
from rollout.lab.simulation.events import EventRecorder
from rollout.lab.simulation.nodelifecycle import UNSCHEDULABLE_TAINT
from rollout.lab.simulation.pods import (
    is_deleting,
    is_terminal,
    node_of,
    pod_requests,
)

SCHEDULER_NAME = "default-scheduler"
UNSCHEDULABLE_REASON = "node(s) were unschedulable"
AFFINITY_REASON = "node(s) didn't match Pod's node affinity/selector"
# Reasons that preemption cannot cure: the real PostFilter says so per node.
_NOT_HELPFUL = "Preemption is not helpful for scheduling"
_NO_VICTIMS = "No preemption victims found for incoming pod"


def tolerates(tolerations: list[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """v1.Toleration.ToleratesTaint."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def _matches_term(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    labels = node["metadata"].get("labels") or {}
    for expression in term.get("matchExpressions") or []:
        if not _matches_expression(expression, labels.get(expression.get("key", ""))):
            return False
    for field in term.get("matchFields") or []:
        value = node["metadata"]["name"] if field.get("key") == "metadata.name" else None
        if not _matches_expression(field, value):
            return False
    return bool(term.get("matchExpressions") or term.get("matchFields"))


def _matches_expression(expression: Mapping[str, Any], value: str | None) -> bool:
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or []]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and value.lstrip("-").isdigit():
        bound = int(values[0])
        return int(value) > bound if operator == "Gt" else int(value) < bound
    return False


def matches_node_affinity(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """nodeSelector and required node affinity (terms ORed, expressions ANDed)."""
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms") or []
    return not terms or any(_matches_term(t, node) for t in terms)


@dataclass(eq=False)
class Scheduler:
    """Binds pods of the default scheduler; records FailedScheduling like the real one."""

    registry: Registry
    recorder: EventRecorder
    clock: Callable[[], float] = time.time

    def reconcile(self) -> None:
        nodes = self.registry.list_objects(NODES)
        pods = self.registry.list_objects(PODS)
        used: dict[str, dict[str, Fraction]] = {n["metadata"]["name"]: {} for n in nodes}
        counts: dict[str, int] = {n["metadata"]["name"]: 0 for n in nodes}
        for pod in pods:
            bound = node_of(pod)
            if bound in used and not is_terminal(pod):
                counts[bound] += 1
                for name, quantity in pod_requests(pod).items():
                    used[bound][name] = used[bound].get(name, Fraction(0)) + quantity
        pending = [
            p
            for p in pods
            if not node_of(p)
            and not is_deleting(p)
            and not is_terminal(p)
            and (p["spec"].get("schedulerName") or SCHEDULER_NAME) == SCHEDULER_NAME
        ]
        pending.sort(
            key=lambda p: (
                -int(p["spec"].get("priority") or 0),
                p["metadata"].get("creationTimestamp", ""),
            )
        )
        for pod in pending:
            self._schedule(pod, nodes, used, counts)

    def _schedule(
        self,
        pod: dict[str, Any],
        nodes: list[dict[str, Any]],
        used: dict[str, dict[str, Fraction]],
        counts: dict[str, int],
    ) -> None:
        requests = pod_requests(pod)
        feasible: list[tuple[Fraction, str]] = []
        failures: dict[str, list[str]] = {}
        for node in nodes:
            name = node["metadata"]["name"]
            reasons = self._filter(pod, node, requests, used[name], counts[name])
            if reasons:
                failures[name] = reasons
            else:
                feasible.append((self._load(node, requests, used[name]), name))
        if feasible:
            _, chosen = min(feasible)
            if self._bind(pod, chosen):
                counts[chosen] += 1
                for resource, quantity in requests.items():
                    used[chosen][resource] = used[chosen].get(resource, Fraction(0)) + quantity
            return
        self._mark_unschedulable(pod, len(nodes), failures)

    def _filter(
        self,
        pod: dict[str, Any],
        node: dict[str, Any],
        requests: Mapping[str, Fraction],
        used: Mapping[str, Fraction],
        count: int,
    ) -> list[str]:
        tolerations = pod["spec"].get("tolerations") or []
        unschedulable_taint = {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"}
        if node["spec"].get("unschedulable") and not tolerates(tolerations, unschedulable_taint):
            return [UNSCHEDULABLE_REASON]
        for taint in node["spec"].get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(
                tolerations, taint
            ):
                return [
                    f"node(s) had untolerated taint {{{taint.get('key')}: "
                    f"{taint.get('value') or ''}}}"
                ]
        if not matches_node_affinity(pod, node):
            return [AFFINITY_REASON]
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        reasons = []
        if count + 1 > int(parse_quantity(allocatable.get("pods", "110"))):
            reasons.append("Too many pods")
        for resource, quantity in sorted(requests.items()):
            if quantity <= 0:
                continue
            available = _quantity(allocatable.get(resource, "0")) - used.get(resource, Fraction(0))
            if quantity > available:
                reasons.append(f"Insufficient {resource}")
        return reasons

    @staticmethod
    def _load(
        node: dict[str, Any], requests: Mapping[str, Fraction], used: Mapping[str, Fraction]
    ) -> Fraction:
        """The LeastAllocated score's inverse over cpu and memory: lower is emptier."""
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        load = Fraction(0)
        for resource in ("cpu", "memory"):
            capacity = _quantity(allocatable.get(resource, "0"))
            if capacity > 0:
                load += (used.get(resource, Fraction(0)) + requests.get(resource, Fraction(0))) / (
                    capacity
                )
        return load

    def _bind(self, pod: dict[str, Any], node_name: str) -> bool:
        now = format_timestamp(self.clock())

        def bind(p: dict[str, Any]) -> None:
            p["spec"]["nodeName"] = node_name
            _set_condition(
                p,
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                },
            )

        metadata = pod["metadata"]
        try:
            bound = self.registry.mutate(PODS, metadata["namespace"], metadata["name"], bind)
        except ApiError:
            return False
        if bound is None:
            return False
        self.recorder.record(
            bound,
            "Normal",
            "Scheduled",
            f"Successfully assigned {metadata['namespace']}/{metadata['name']} to {node_name}",
        )
        return True

    def _mark_unschedulable(
        self, pod: dict[str, Any], node_count: int, failures: Mapping[str, list[str]]
    ) -> None:
        message = fit_error_message(node_count, failures)
        metadata = pod["metadata"]
        now = format_timestamp(self.clock())

        def mark(p: dict[str, Any]) -> None:
            _set_condition(
                p,
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                    "reason": "Unschedulable",
                    "message": message,
                },
            )

        before: dict[str, Any] = next(
            (
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ),
            {},
        )
        updated = self.registry.mutate(PODS, metadata["namespace"], metadata["name"], mark)
        # The real scheduler re-records on each retry; once per new verdict keeps the lab quiet.
        if updated is not None and before.get("message") != message:
            self.recorder.record(updated, "Warning", "FailedScheduling", message)


def fit_error_message(node_count: int, failures: Mapping[str, list[str]]) -> str:
    """The real FitError text, with the preemption PostFilter's summary appended."""
    histogram: dict[str, int] = {}
    preemption: dict[str, int] = {}
    for reasons in failures.values():
        for reason in reasons:
            histogram[reason] = histogram.get(reason, 0) + 1
        helpful = all(r.startswith(("Insufficient", "Too many pods")) for r in reasons)
        verdict = _NO_VICTIMS if helpful else _NOT_HELPFUL
        preemption[verdict] = preemption.get(verdict, 0) + 1
    main = ", ".join(sorted(f"{count} {reason}" for reason, count in histogram.items()))
    post = ", ".join(sorted(f"{count} {reason}" for reason, count in preemption.items()))
    message = f"0/{node_count} nodes are available: {main}."
    if post:
        message += f" preemption: 0/{node_count} nodes are available: {post}."
    return message


def _quantity(value: Any) -> Fraction:
    try:
        return parse_quantity(value)
    except ValueError:
        return Fraction(0)


def _set_condition(pod: dict[str, Any], condition: dict[str, Any]) -> None:
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != condition["type"]]
    previous = next(
        (c for c in status.get("conditions") or [] if c.get("type") == condition["type"]), None
    )
    if previous is not None and previous.get("status") == condition["status"]:
        condition["lastTransitionTime"] = previous.get("lastTransitionTime")
    conditions.append(condition)
    status["conditions"] = conditions
