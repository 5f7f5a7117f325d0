"""The operand DaemonSets diagnose compares with each node: where their pods should run.

A DaemonSet should have a pod on a node when its pod template's nodeSelector matches the
node's labels and the node carries no NoSchedule or NoExecute taint the template does not
tolerate (the controller adds its own tolerations for the node conditions: not-ready,
unreachable, the pressures and unschedulable, so a cordoned node keeps its daemons).
Recorded facts keep each DaemonSet as a small manifest: `to_manifest` and `from_manifest`
are inverses, so `rollout facts record` and `plan --facts` read the same thing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.facts.pods import Toleration

# What the real DaemonSet controller adds to every pod it creates (pkg/controller/daemon/util).
CONTROLLER_TOLERATIONS = (
    Toleration("node.kubernetes.io/not-ready", "Exists", "", "NoExecute"),
    Toleration("node.kubernetes.io/unreachable", "Exists", "", "NoExecute"),
    Toleration("node.kubernetes.io/disk-pressure", "Exists", "", "NoSchedule"),
    Toleration("node.kubernetes.io/memory-pressure", "Exists", "", "NoSchedule"),
    Toleration("node.kubernetes.io/pid-pressure", "Exists", "", "NoSchedule"),
    Toleration("node.kubernetes.io/unschedulable", "Exists", "", "NoSchedule"),
)
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class DaemonSetFacts:
    """One DaemonSet: where its pods go, and the controller's counts over the cluster."""

    namespace: str
    name: str
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    desired: int = 0
    ready: int = 0

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def excluded_by(self, labels: Mapping[str, str], taints: tuple[str, ...]) -> str:
        """Why the DaemonSet places no pod on a node with these labels and taints; "" if it does.

        Taints are written `key=value:Effect` (or `key:Effect`), as NodeFacts keeps them.
        """
        for key, value in sorted(self.node_selector.items()):
            if labels.get(key) != value:
                return f"nodeSelector {key}={value} (node has {labels.get(key, 'no such label')})"
        tolerations = self.tolerations + CONTROLLER_TOLERATIONS
        for taint in taints:
            head, _, effect = taint.rpartition(":")
            key, _, value = head.partition("=")
            if effect in BLOCKING_EFFECTS and not any(
                t.tolerates(key, value, effect) for t in tolerations
            ):
                return f"taint {taint} not tolerated"
        return ""

    def to_manifest(self) -> dict[str, Any]:
        """The DaemonSet as the API writes it, reduced to what diagnose reads."""
        template_spec: dict[str, Any] = {}
        if self.node_selector:
            template_spec["nodeSelector"] = dict(self.node_selector)
        if self.tolerations:
            template_spec["tolerations"] = [_toleration_json(t) for t in self.tolerations]
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"namespace": self.namespace, "name": self.name},
            "spec": {"template": {"spec": template_spec}},
            "status": {"desiredNumberScheduled": self.desired, "numberReady": self.ready},
        }

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> DaemonSetFacts:
        """A DaemonSet from the API's JSON (or a recorded manifest); missing parts are empty."""
        metadata = _mapping(manifest.get("metadata"))
        spec = _mapping(_mapping(_mapping(manifest.get("spec")).get("template")).get("spec"))
        status = _mapping(manifest.get("status"))
        return cls(
            namespace=str(metadata.get("namespace") or ""),
            name=str(metadata.get("name") or ""),
            node_selector={str(k): str(v) for k, v in _mapping(spec.get("nodeSelector")).items()},
            tolerations=tuple(
                Toleration(
                    key=str(t.get("key") or ""),
                    operator=str(t.get("operator") or "Equal"),
                    value=str(t.get("value") or ""),
                    effect=str(t.get("effect") or ""),
                )
                for t in spec.get("tolerations") or []
                if isinstance(t, Mapping)
            ),
            desired=_count(status.get("desiredNumberScheduled")),
            ready=_count(status.get("numberReady")),
        )


def _toleration_json(toleration: Toleration) -> dict[str, str]:
    document = {"key": toleration.key, "operator": toleration.operator}
    if toleration.value:
        document["value"] = toleration.value
    if toleration.effect:
        document["effect"] = toleration.effect
    return {k: v for k, v in document.items() if v}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
