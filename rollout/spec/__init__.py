"""The plan (plan.yaml): its model, its loader, and the label selectors it uses.

`load_spec(path)` returns a validated, immutable `Spec` or raises `InputErrors` listing
every problem, each at file:line:column with its field path.

It names no change kind: a kind's model (`RegistryChange`, `DriverUpgradeChange`, ...) and
constants are imported from the kind's package (rollout.changes.<kind>.model); the plan
loads them through the kinds' table (rollout.changes.KINDS).
"""

from rollout.inputs.fieldtypes import NodeAmount, SpecModel, parse_node_amount
from rollout.spec.changeentry import Change, ChangeEntry, ChangeKind
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
    "DEFAULT_SMOKE_IMAGE",
    "DRAIN_SKIP_LABEL",
    "UPGRADE_FAILED_LABEL",
    "Change",
    "ChangeEntry",
    "ChangeKind",
    "DrainPolicy",
    "Label",
    "LabelSelector",
    "LabelSelectorError",
    "MaintenanceWindow",
    "Metadata",
    "NodeAmount",
    "OnFailure",
    "Policy",
    "Requirement",
    "SelectorOperator",
    "Spec",
    "SpecModel",
    "Targets",
    "VerifyPolicy",
    "Weekday",
    "load_spec",
    "parse_label",
    "parse_label_selector",
    "parse_node_amount",
    "parse_spec",
]
