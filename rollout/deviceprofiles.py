"""The device plugin's config profiles: which one a node loads and what it shares.

Pure rules over the profile documents the GPU Operator's ConfigMap holds (FACTS.md): the
node label nvidia.com/device-plugin.config picks a key; an unlabelled node's config-manager
falls back to ClusterPolicy `config.default`, else a key named `default`, else the only key
(strategies `named,single`); a profile shares a resource by listing it under
`sharing.timeSlicing.resources` with its replicas, and `renameByDefault` advertises shared
GPUs as `<resource>.shared`. The time-slicing plan model, its planner and diagnose read
profiles only through these functions.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import yaml

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
# The most slices of one GPU a profile may ask for: 1 shares nothing, and more than 64 is a
# typo (the time-slicing model refuses it; diagnose trusts no label beyond it).
MAX_REPLICAS = 64
# The config-manager's "named" fallback: the key an unlabelled node loads without config.default.
DEFAULT_KEY = "default"


def fallback_key(config_default: str, keys: Collection[str]) -> str | None:
    """The key the config-manager loads on a node without the label; None: no config at all.

    `config.default` when set (even naming a key that is absent: the config-manager then
    exits), else a key named `default`, else the only key (strategies `named,single`).
    """
    if config_default:
        return config_default
    if DEFAULT_KEY in keys:
        return DEFAULT_KEY
    if len(keys) == 1:
        return next(iter(keys))
    return None


def load_profile(text: str) -> Any:
    """A stored profile's document; the text itself when it is not YAML."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def time_slicing_of(document: Any) -> Mapping[str, Any]:
    """A profile document's `sharing.timeSlicing` block; empty when it has none (or is not
    a profile at all)."""
    sharing = document.get("sharing") if isinstance(document, Mapping) else None
    slicing = sharing.get("timeSlicing") if isinstance(sharing, Mapping) else None
    return slicing if isinstance(slicing, Mapping) else {}


def shared_replicas(document: Any, resource: str) -> int | None:
    """The replicas a profile gives each device of `resource` (1 for a value that is not a
    positive integer); None when the profile does not share `resource`."""
    for shared in time_slicing_of(document).get("resources") or []:
        if isinstance(shared, Mapping) and shared.get("name") == resource:
            replicas = shared.get("replicas")
            return replicas if isinstance(replicas, int) and replicas > 0 else 1
    return None


def renames_by_default(document: Any) -> bool:
    """Whether the profile's `renameByDefault` advertises shared devices as `<name>.shared`."""
    return bool(time_slicing_of(document).get("renameByDefault"))
