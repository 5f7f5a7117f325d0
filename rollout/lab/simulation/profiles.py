"""Device-plugin sharing profiles: which time-slicing config a node's device plugin loads.

ClusterPolicy spec.devicePlugin.config.{name, default} names a ConfigMap in the operator
namespace whose keys are profiles; the node label nvidia.com/device-plugin.config picks one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from rollout.errors import RolloutError

GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_LABEL = "nvidia.com/device-plugin.config"


class ProfileError(RolloutError):
    """A device-plugin config the real plugin would refuse to start with."""


@dataclass(frozen=True)
class SharingProfile:
    """What one device-plugin config means for advertising: replicas per physical GPU."""

    replicas: int = 1
    source: str = ""

    @property
    def strategy(self) -> str:
        """The nvidia.com/gpu.sharing-strategy label value."""
        return "time-slicing" if self.replicas > 1 else "none"


NO_SHARING = SharingProfile()


def parse_profile(text: str, source: str = "") -> SharingProfile:
    """Replicas of nvidia.com/gpu in a device-plugin config (YAML, or JSON)."""
    try:
        document = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise ProfileError(f"{source}: not YAML: {error}") from error
    if not isinstance(document, Mapping):
        raise ProfileError(f"{source}: a device-plugin config must be a mapping")
    sharing = document.get("sharing") or {}
    time_slicing = sharing.get("timeSlicing") or {} if isinstance(sharing, Mapping) else {}
    resources = time_slicing.get("resources") or [] if isinstance(time_slicing, Mapping) else []
    for resource in resources:
        if isinstance(resource, Mapping) and resource.get("name") == GPU_RESOURCE:
            replicas = resource.get("replicas", 1)
            if not isinstance(replicas, int) or replicas < 1:
                raise ProfileError(f"{source}: replicas must be a positive integer")
            return SharingProfile(replicas=replicas, source=source)
    return SharingProfile(source=source)


def select_profile(
    cluster_policy: Mapping[str, Any] | None,
    configmap: Mapping[str, Any] | None,
    node_labels: Mapping[str, str],
) -> SharingProfile:
    """The profile the device plugin of a node loads now (label, else the policy default)."""
    config = (((cluster_policy or {}).get("spec") or {}).get("devicePlugin") or {}).get(
        "config"
    ) or {}
    if not config.get("name") or configmap is None:
        return NO_SHARING
    data: Mapping[str, str] = configmap.get("data") or {}
    key = node_labels.get(CONFIG_LABEL) or config.get("default") or ""
    if not key and len(data) == 1:
        key = next(iter(data))
    if key not in data:
        raise ProfileError(
            f"configmap {config['name']} has no key {key!r} (node label {CONFIG_LABEL})"
        )
    return parse_profile(data[key], source=f"{config['name']}/{key}")


def config_name(cluster_policy: Mapping[str, Any] | None) -> str:
    """The ConfigMap the ClusterPolicy points the device plugin at ("" for none)."""
    config = (((cluster_policy or {}).get("spec") or {}).get("devicePlugin") or {}).get(
        "config"
    ) or {}
    return str(config.get("name") or "")
