"""The four kinds of change a plan can make on a GPU node, one module each, and the entry of
`changes:` that holds exactly one of them."""

from rollout.spec.changes.containerd import DEFAULT_RUNTIME_KEY, ContainerdChange
from rollout.spec.changes.driver import DEFAULT_DRIVER_PACKAGES, DriverMode, DriverUpgradeChange
from rollout.spec.changes.entry import Change, ChangeEntry
from rollout.spec.changes.kind import ChangeKind
from rollout.spec.changes.registry import (
    DEFAULT_CERTS_DIR,
    DEFAULT_HOST,
    Capability,
    RegistryChange,
    RegistryEndpoint,
)
from rollout.spec.changes.timeslicing import (
    MAX_REPLICAS,
    ConfigMapRef,
    DevicePluginConfig,
    SharedResource,
    Sharing,
    TimeSlicing,
    TimeSlicingChange,
)

__all__ = [
    "DEFAULT_CERTS_DIR",
    "DEFAULT_DRIVER_PACKAGES",
    "DEFAULT_HOST",
    "DEFAULT_RUNTIME_KEY",
    "MAX_REPLICAS",
    "Capability",
    "Change",
    "ChangeEntry",
    "ChangeKind",
    "ConfigMapRef",
    "ContainerdChange",
    "DevicePluginConfig",
    "DriverMode",
    "DriverUpgradeChange",
    "RegistryChange",
    "RegistryEndpoint",
    "SharedResource",
    "Sharing",
    "TimeSlicing",
    "TimeSlicingChange",
]
