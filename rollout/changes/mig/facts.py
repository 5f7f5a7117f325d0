"""What the MIG manager's contract says of a node and of the cluster, read from facts alone:
the node's MIG labels, and the ClusterPolicy's MIG settings (strategy, the manager's
ConfigMap). Pure: node labels and the ClusterPolicy's spec as the facts hold them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.operatornames import OPERATOR_NAMESPACE

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
CAPABLE_LABEL = "nvidia.com/mig.capable"
DEFAULT_CONFIGMAP = "default-mig-parted-config"
DEFAULT_STRATEGY = "single"


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


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
