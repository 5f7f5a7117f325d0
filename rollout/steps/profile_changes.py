"""What a time-slicing change does to the cluster and to one node, decided once.

The cluster side: the profile's key in the ConfigMap and the ClusterPolicy pointing at it.
The node side: the node's profile label, or — when the node already carries the label and
only the profile's content changes — a device-plugin restart, because the plugin's
config-manager reacts to label changes only (FACTS.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from rollout.facts import ClusterFacts, NodeFacts
from rollout.plan import ClusterChange, FileChange, LabelChange
from rollout.spec import Spec, TimeSlicingChange

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
SHARED_MEMORY_WARNING = (
    "time-slicing shares each GPU, it does not divide it: every replica can use all of the "
    "GPU's memory and a fault in one workload can affect the others"
)


def time_slicing_change(spec: Spec) -> TimeSlicingChange | None:
    """The spec's time-slicing change; a node carries one profile label, so the first counts."""
    changes = spec.changes_of(TimeSlicingChange)
    return changes[0] if changes else None


def plan_cluster_changes(spec: Spec, cluster: ClusterFacts) -> list[ClusterChange]:
    """ConfigMap and ClusterPolicy changes for time-slicing, made once before wave 1."""
    result: list[ClusterChange] = []
    for change in spec.changes:
        if not isinstance(change, TimeSlicingChange):
            continue
        ref = f"{change.configmap.namespace}/{change.configmap.name}"
        current = cluster.configmaps.get(ref, {})
        wanted_text = yaml.safe_dump(change.config_document(), sort_keys=False)
        before_text = current.get(change.profile)
        if before_text is not None and yaml.safe_load(before_text) == change.config_document():
            result.append(
                ClusterChange(
                    "configmap",
                    ref,
                    None,
                    noop_reason=f"key {change.profile!r} already holds this profile",
                )
            )
        else:
            diff = FileChange(
                f"/{ref}/{change.profile}", before_text, wanted_text, ""
            ).unified_diff()
            others = sorted(k for k in current if k != change.profile)
            keep = f"; other profiles kept: {', '.join(others)}" if others else ""
            verb = "update" if before_text is not None else "add"
            result.append(
                ClusterChange("configmap", ref, f"{verb} key {change.profile!r}{keep}", diff)
            )
        policy_config = (cluster.cluster_policy.get("devicePlugin") or {}).get("config") or {}
        if policy_config.get("name") != change.configmap.name:
            result.append(
                ClusterChange(
                    "clusterpolicy",
                    "cluster-policy",
                    f"set spec.devicePlugin.config.name = {change.configmap.name!r} "
                    f"(now {policy_config.get('name') or 'unset'!r})",
                )
            )
    return result


@dataclass(frozen=True)
class ProfileChange:
    """What time-slicing changes on one node: its profile label, or a device-plugin restart."""

    label: LabelChange | None = None
    restart_device_plugin: bool = False
    noop_reason: str | None = None

    @property
    def changes_node(self) -> bool:
        return self.label is not None or self.restart_device_plugin


def plan_profile(spec: Spec, node: NodeFacts, cluster: ClusterFacts) -> ProfileChange:
    """The node's profile label change, or the device-plugin restart a new profile needs."""
    change = next(iter(spec.changes_of(TimeSlicingChange)), None)
    if change is None:
        return ProfileChange(noop_reason="no time-slicing change")
    current = node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
    if current != change.profile:
        return ProfileChange(label=LabelChange(DEVICE_PLUGIN_CONFIG_LABEL, current, change.profile))
    configmap_changed = any(
        c.kind == "configmap" and c.action is not None for c in plan_cluster_changes(spec, cluster)
    )
    if configmap_changed:
        # The config-manager watches labels, not ConfigMaps: a new profile under the same
        # label needs a device-plugin restart.
        return ProfileChange(
            restart_device_plugin=True, noop_reason=f"already labelled {change.profile}"
        )
    return ProfileChange(
        noop_reason=f"already labelled {change.profile} and the profile is unchanged"
    )
