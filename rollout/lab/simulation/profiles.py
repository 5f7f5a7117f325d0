"""Device-plugin sharing profiles: which time-slicing config a node's device plugin loads.

ClusterPolicy spec.devicePlugin.config.{name, default} names a ConfigMap in the operator
namespace whose keys are profiles; the node label nvidia.com/device-plugin.config picks one.
A node without the label gets what the real config-manager falls back to (k8s-device-plugin
cmd/config-manager, FACTS.md): DEFAULT_CONFIG (`config.default`), else a key named
`default`, else the only key of the ConfigMap (strategies `named,single`), else no config.
A key that is not in the ConfigMap — named by the label or by `config.default` — makes the
config-manager exit with an error, and the device plugin does not come up (`ConfigManagerExit`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from rollout.errors import RolloutError

GPU_RESOURCE = "nvidia.com/gpu"
CONFIG_LABEL = "nvidia.com/device-plugin.config"


class ProfileError(RolloutError):
    """A device-plugin config the real plugin would refuse to start with."""


class ConfigManagerExit(ProfileError):
    """The config-manager was asked for a key the ConfigMap does not hold: it exits."""


NAMED_FALLBACK_KEY = "default"


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


def fallback_key(config_default: str, keys: Collection[str]) -> str | None:
    """The key a node without the label loads: `named,single`, as the config-manager does."""
    if config_default:
        return config_default
    if NAMED_FALLBACK_KEY in keys:
        return NAMED_FALLBACK_KEY
    if len(keys) == 1:
        return next(iter(keys))
    return None


def select_profile(
    cluster_policy: Mapping[str, Any] | None,
    configmap: Mapping[str, Any] | None,
    node_labels: Mapping[str, str],
) -> SharingProfile:
    """The profile the device plugin of a node loads now (label, else the fallback)."""
    config = (((cluster_policy or {}).get("spec") or {}).get("devicePlugin") or {}).get(
        "config"
    ) or {}
    if not config.get("name") or configmap is None:
        return NO_SHARING
    data: Mapping[str, str] = configmap.get("data") or {}
    label = node_labels.get(CONFIG_LABEL) or ""
    key = label or fallback_key(str(config.get("default") or ""), data)
    if key is None:
        return NO_SHARING
    if key not in data:
        named_by = f"node label {CONFIG_LABEL}" if label else "ClusterPolicy config.default"
        raise ConfigManagerExit(
            f"config-manager: configmap {config['name']} has no key {key!r} ({named_by}): exiting"
        )
    return parse_profile(data[key], source=f"{config['name']}/{key}")


def config_manager_error(
    cluster_policy: Mapping[str, Any] | None,
    configmap: Mapping[str, Any] | None,
    node_labels: Mapping[str, str],
) -> str | None:
    """Why the node's config-manager exits (its device plugin then does not come up); None
    when it loads a config. Only a missing key stops it: the lab's kubelet reports a
    config the plugin cannot parse as an Event instead."""
    try:
        select_profile(cluster_policy, configmap, node_labels)
    except ConfigManagerExit as error:
        return str(error)
    except ProfileError:
        return None
    return None


def config_name(cluster_policy: Mapping[str, Any] | None) -> str:
    """The ConfigMap the ClusterPolicy points the device plugin at ("" for none)."""
    config = (((cluster_policy or {}).get("spec") or {}).get("devicePlugin") or {}).get(
        "config"
    ) or {}
    return str(config.get("name") or "")
