"""The plan (plan.yaml): its model, its loader, and the label selectors it uses.

`load_spec(path)` returns a validated, immutable `Spec` or raises `InputErrors` listing
every problem, each at file:line:column with its field path.
"""

from rollout.spec.changes.containerd import ContainerdChange
from rollout.spec.changes.driver import DEFAULT_DRIVER_PACKAGES, DriverMode, DriverUpgradeChange
from rollout.spec.changes.entry import Change, ChangeEntry
from rollout.spec.changes.kind import ChangeKind
from rollout.spec.changes.registry import (
    DEFAULT_CERTS_DIR,
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
from rollout.spec.fieldtypes import NodeAmount, SpecModel, parse_node_amount
from rollout.spec.plan import API_VERSION, Metadata, Spec, Targets, load_spec, parse_spec
from rollout.spec.policy import (
    DEFAULT_SMOKE_IMAGE,
    DRAIN_SKIP_LABEL,
    UPGRADE_FAILED_LABEL,
    DrainPolicy,
    Label,
    MaintenanceWindow,
    OnFailure,
    Policy,
    VerifyPolicy,
    Weekday,
    parse_label,
)
from rollout.spec.selector import (
    LabelSelector,
    LabelSelectorError,
    Requirement,
    SelectorOperator,
    parse_label_selector,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_CERTS_DIR",
    "DEFAULT_DRIVER_PACKAGES",
    "DEFAULT_SMOKE_IMAGE",
    "DRAIN_SKIP_LABEL",
    "MAX_REPLICAS",
    "UPGRADE_FAILED_LABEL",
    "Capability",
    "Change",
    "ChangeEntry",
    "ChangeKind",
    "ConfigMapRef",
    "ContainerdChange",
    "DevicePluginConfig",
    "DrainPolicy",
    "DriverMode",
    "DriverUpgradeChange",
    "Label",
    "LabelSelector",
    "LabelSelectorError",
    "MaintenanceWindow",
    "Metadata",
    "NodeAmount",
    "OnFailure",
    "Policy",
    "RegistryChange",
    "RegistryEndpoint",
    "Requirement",
    "SelectorOperator",
    "SharedResource",
    "Sharing",
    "Spec",
    "SpecModel",
    "Targets",
    "TimeSlicing",
    "TimeSlicingChange",
    "VerifyPolicy",
    "Weekday",
    "load_spec",
    "parse_label",
    "parse_label_selector",
    "parse_node_amount",
    "parse_spec",
]
