"""A finding: one cause diagnose found, with its evidence and the command that shows it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Severity(Enum):
    ERROR = "error"  # something is broken: GPU pods fail or cannot start
    WARNING = "warning"  # works today; breaks on the next restart, or needs a look
    INFO = "info"  # context; never changes the verdict

    @property
    def rank(self) -> int:
        return (Severity.ERROR, Severity.WARNING, Severity.INFO).index(self)


class Branch(Enum):
    """The branches of the seed guide's symptom tree."""

    ADVERTISING = "advertising"
    RUNTIME = "runtime"
    OPERATOR = "operator"
    PODS = "pods"


# Most specific cause first: a lost handler explains a plugin that cannot register, which
# explains `Insufficient nvidia.com/gpu`. Checks not listed sort after these, by name.
SPECIFICITY = (
    "runtime.containerd-down",
    "runtime.config-invalid",
    "runtime.shadowing",
    "runtime.dropin-ignored",
    "runtime.dropin-not-loaded",
    "runtime.handler-missing",
    "operator.driver-library-mismatch",
    "operator.driver-kernel-mismatch",
    "operator.upgrade-failed",
    "operator.profile-label-missing-key",
    "operator.mig-config-missing-layout",
    "operator.mig-config-failed",
    "operator.deploy-label-paused",
    "operator.nvidia-smi-failed",
    "operator.operand-failing",
    "operator.validator-not-ready",
    "operator.operand-excluded",
    "operator.operand-missing",
    "operator.mig-manager-missing",
    "node.not-ready",
    "advertising.unhealthy-devices",
    "advertising.row-remap-failed",
    "advertising.replicas-mismatch",
    "advertising.not-registered",
    "pods.runtimeclass-missing",
    "pods.requests-without-limits",
    "pods.fractional-request",
    "pods.request-differs-from-limit",
    "pods.no-gpu-node-fits",
    "pods.pending",
    "advertising.row-remap-pending",
    "advertising.slots-used",
    "runtime.files-changed",
    "runtime.shadowing-settings",
    "runtime.restarts",
    "operator.upgrade-in-progress",
    "operator.mig-config-in-progress",
    "advertising.resources",
)


@dataclass(frozen=True)
class Finding:
    """One cause: where, which branch and check, why (one sentence), the evidence, the command."""

    node: str | None
    pod: str | None
    branch: Branch
    check: str
    cause: str
    evidence: tuple[str, ...]
    command: str
    severity: Severity

    @property
    def sort_key(self) -> tuple[int, int, str, str, str]:
        rank = SPECIFICITY.index(self.check) if self.check in SPECIFICITY else len(SPECIFICITY)
        return (self.severity.rank, rank, self.check, self.node or "", self.pod or "")

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "pod": self.pod,
            "branch": self.branch.value,
            "check": self.check,
            "cause": self.cause,
            "evidence": list(self.evidence),
            "command": self.command,
            "severity": self.severity.value,
        }


def order_findings(findings: list[Finding]) -> tuple[Finding, ...]:
    """Errors first; within a severity the most specific cause first."""
    return tuple(sorted(findings, key=lambda f: f.sort_key))
