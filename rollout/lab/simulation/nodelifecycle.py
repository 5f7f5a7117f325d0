"""The node lifecycle controller's taints: unschedulable and not-ready nodes repel new pods."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rollout.lab.apiserver.metadata import format_timestamp
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import NODES

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


def is_node_ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


@dataclass(eq=False)
class NodeLifecycleController:
    """Keeps the unschedulable and not-ready NoSchedule taints in step with node state."""

    registry: Registry
    clock: Callable[[], float] = time.time

    def reconcile(self) -> None:
        for node in self.registry.list_objects(NODES):
            wanted = {
                UNSCHEDULABLE_TAINT: bool((node.get("spec") or {}).get("unschedulable")),
                # A node that never reported conditions is not yet judged.
                NOT_READY_TAINT: bool((node.get("status") or {}).get("conditions"))
                and not is_node_ready(node),
            }
            taints = (node.get("spec") or {}).get("taints") or []
            present = {t.get("key") for t in taints if t.get("effect") == "NoSchedule"}
            if all((key in present) == want for key, want in wanted.items()):
                continue
            self.registry.mutate(NODES, None, node["metadata"]["name"], self._taint_change(wanted))

    def _taint_change(self, wanted: dict[str, bool]) -> Callable[[dict[str, Any]], None]:
        return lambda node: self._apply(node, wanted)

    def _apply(self, node: dict[str, Any], wanted: dict[str, bool]) -> None:
        spec = node.setdefault("spec", {})
        taints = [
            t
            for t in spec.get("taints") or []
            if not (t.get("key") in wanted and t.get("effect") == "NoSchedule")
        ]
        keep = {t.get("key") for t in spec.get("taints") or [] if t.get("effect") == "NoSchedule"}
        for key, want in wanted.items():
            if want:
                existing = next(
                    (
                        t
                        for t in spec.get("taints") or []
                        if t.get("key") == key and t.get("effect") == "NoSchedule"
                    ),
                    None,
                )
                taints.append(
                    existing
                    if existing is not None and key in keep
                    else {
                        "key": key,
                        "effect": "NoSchedule",
                        "timeAdded": format_timestamp(self.clock()),
                    }
                )
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
