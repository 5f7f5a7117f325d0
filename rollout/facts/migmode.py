"""MIG as a node's state, whoever put its GPUs in MIG mode: what GPU feature discovery's labels
and the device plugin's resources say of it. Every change meets it (a registry mirror on a
node an operator partitioned with `kubectl label ... nvidia.com/mig.config=...`); the MIG
change kind is only one way a node gets there, and this module knows nothing of it.

Under the ClusterPolicy's `mig.strategy: mixed` the device plugin advertises each MIG profile
as `nvidia.com/mig-<profile>` and GFD labels `nvidia.com/mig-<profile>.count`; under `single`
it advertises the MIG devices as `nvidia.com/gpu`, and GFD labels `nvidia.com/mig.strategy=
single` and overrides `nvidia.com/gpu.product` with `<product>-MIG-<profile>` and
`nvidia.com/gpu.count` with the MIG devices' count (FACTS.md, MIG manager; GFD's README,
"Generated Labels"). GFD writes its labels whole, so a layout put back to all-disabled leaves
none of them behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import yaml

from rollout.errors import RolloutError
from rollout.operatornames import MIG_RESOURCE_PREFIX, OPERATOR_NAMESPACE

# The MIG manager's contract (GPU Operator; FACTS.md, MIG manager): it applies the layout the
# node's CONFIG_LABEL names, from its ConfigMap's CONFIG_KEY, and reports STATE_LABEL
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
CAPABLE_LABEL = "nvidia.com/mig.capable"
DEFAULT_CONFIGMAP = "default-mig-parted-config"
CONFIG_KEY = "config.yaml"
DEFAULT_STRATEGY = "single"
# the label of the MIG manager's pods (DaemonSet nvidia-mig-manager)
MANAGER_APP = "nvidia-mig-manager"
MANAGER_SELECTOR = f"app={MANAGER_APP}"

STRATEGY_LABEL = "nvidia.com/mig.strategy"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# what GFD puts between the GPU's model and the MIG profile under the single strategy
SINGLE_PRODUCT_MARK = "-MIG-"
_COUNT_SUFFIX = ".count"


class MigMode(Enum):
    """Whether some GPU of the node is in MIG mode, and how the device plugin advertises it."""

    OFF = "off"
    SINGLE = "single"
    MIXED = "mixed"


def read_mig_mode(labels: Mapping[str, str], allocatable: Mapping[str, str]) -> MigMode:
    """The node's MIG mode from its labels and allocatable: mixed where GFD counts, or the node
    offers, a `nvidia.com/mig-<profile>` device; single where GFD's product label names a MIG
    profile; else off. Allocatable, not capacity: the kubelet keeps a gone resource's capacity
    for minutes (FACTS.md, kubelet device manager), a layout put back to all-disabled too."""
    if any(_is_mig_resource(name, count) for name, count in allocatable.items()) or any(
        key.startswith(MIG_RESOURCE_PREFIX) and key.endswith(_COUNT_SUFFIX) for key in labels
    ):
        return MigMode.MIXED
    if SINGLE_PRODUCT_MARK in labels.get(PRODUCT_LABEL, ""):
        return MigMode.SINGLE
    return MigMode.OFF


def _is_mig_resource(name: str, count: str) -> bool:
    return name.startswith(MIG_RESOURCE_PREFIX) and count.strip() not in ("", "0")


class MigState:
    """The values of nvidia.com/mig.config.state the MIG manager writes."""

    PENDING = "pending"
    REBOOTING = "rebooting"
    SUCCESS = "success"
    FAILED = "failed"


@dataclass(frozen=True)
class NodeMig:
    """A node's MIG labels: the layout asked for, the manager's state, whether GFD found a
    MIG-capable GPU."""

    config: str | None
    state: str | None
    capable: bool

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> NodeMig:
        return cls(
            labels.get(CONFIG_LABEL),
            labels.get(STATE_LABEL),
            labels.get(CAPABLE_LABEL) == "true",
        )

    def on_layout(self, name: str) -> bool:
        """Whether the manager reports the node done with layout `name`."""
        return self.config == name and self.state == MigState.SUCCESS


@dataclass(frozen=True)
class MigSettings:
    """The ClusterPolicy's MIG settings: `mig.strategy` and the MIG manager's ConfigMap."""

    strategy: str
    configmap: str
    manager_enabled: bool
    namespace: str = OPERATOR_NAMESPACE

    @classmethod
    def from_cluster_policy(cls, spec: Mapping[str, Any]) -> MigSettings:
        """Read from a ClusterPolicy's spec; the operator's defaults where a field is unset
        (strategy single, ConfigMap default-mig-parted-config, the manager enabled)."""
        mig = _mapping(spec.get("mig"))
        manager = _mapping(spec.get("migManager"))
        config = _mapping(manager.get("config"))
        return cls(
            strategy=str(mig.get("strategy") or DEFAULT_STRATEGY),
            configmap=str(config.get("name") or DEFAULT_CONFIGMAP),
            manager_enabled=manager.get("enabled", True) is not False,
        )

    @property
    def configmap_key(self) -> str:
        """The ConfigMap's key in the cluster facts: `namespace/name`."""
        return f"{self.namespace}/{self.configmap}"


class MigConfigError(RolloutError):
    """The MIG manager's config cannot be read: not YAML, or not the mig-parted v1 shape."""


def read_layout_entries(text: str) -> Mapping[str, Any]:
    """`config.yaml` of the MIG manager's ConfigMap -> its `mig-configs`: each layout's name
    and its entries as written; MigConfigError where it is not mig-parted's v1 shape."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MigConfigError(f"not YAML: {exc}") from exc
    if not isinstance(document, Mapping):
        raise MigConfigError("expected a mapping with version and mig-configs")
    if document.get("version") != "v1":
        raise MigConfigError(f"version {document.get('version')!r}; rollout reads v1")
    configs = document.get("mig-configs")
    if not isinstance(configs, Mapping):
        raise MigConfigError("mig-configs is not a mapping of layout names")
    return {str(name): entries for name, entries in configs.items()}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
