"""Host-installed drivers (`mode: host`): the one planning decision every host step reads.

`plan_host_driver` decides, from a node's facts alone, what a host-mode driver upgrade does
there: which package versions apt installs (the version of each package whose upstream part
is the plan's driver version, as `apt-cache madison` offers it), from which driver version,
on which kernel, and whether the node reboots. `rollout plan` and every step's `plan` ask it,
so the decision exists once. It refuses (DriverNotInstallable, exit 2) a node whose apt
sources do not offer the version, naming the node and what they do offer, and warns when
Secure Boot is on and apt offers no signed module package for the running kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from rollout.changes.base import PlanningContext
from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.driver.host import (
    AptVersion,
    DriverHost,
    matching_version,
    signed_module_package,
)
from rollout.errors import InputError
from rollout.facts import NodeFacts
from rollout.operatornames import DEPLOY_LABEL_PREFIX
from rollout.plan import StepPlan
from rollout.spec import Spec
from rollout.spec.policy import DriverReload

MAX_OFFERED_SHOWN = 8


class DriverNotInstallable(InputError):
    """The node's apt sources do not offer the plan's driver version."""


class RebootDecision:
    """Whether a node reboots, in words the plan output shows."""

    YES = "yes"
    NO = "no"
    IF_BUSY = "only if a module stays in use"


@dataclass(frozen=True)
class HostDriverPlan:
    """What a host-mode driver upgrade does on one node."""

    node: str
    target: str
    current: str
    kernel: str
    # package -> the Debian version apt installs
    installs: tuple[tuple[str, str], ...]
    reboot: str
    pending: bool
    reason: str
    warnings: tuple[str, ...] = ()
    # the operand deploy labels that are `true` now (paused during the upgrade)
    operands: tuple[str, ...] = ()

    @property
    def pins(self) -> tuple[str, ...]:
        """`name=version` as apt-get install takes them."""
        return tuple(f"{name}={version}" for name, version in self.installs)


def host_change(spec: Spec) -> DriverUpgradeChange | None:
    """The spec's driver change when it installs the driver on the host; else None."""
    change = spec.change_of(DriverUpgradeChange)
    return change if change is not None and change.mode is DriverMode.HOST else None


def running_operands(labels: Mapping[str, str]) -> tuple[str, ...]:
    """The operand deploy labels set to `true` (the ones a driver upgrade pauses)."""
    return tuple(
        sorted(k for k, v in labels.items() if k.startswith(DEPLOY_LABEL_PREFIX) and v == "true")
    )


def describe_current(facts: NodeFacts) -> str:
    """The driver the node runs now, in words: a version, or why nvidia-smi cannot say."""
    host = facts.driver_host
    if host is not None:
        if host.driver.version is not None:
            return host.driver.version
        if host.driver.mismatch:
            return "(driver/library mismatch)"
        return "(no driver loaded)"
    return facts.gpus.driver_version or "(unknown)"


def reboot_decision(spec: Spec) -> str:
    driver = spec.policy.driver
    if driver.reload is DriverReload.REBOOT:
        return RebootDecision.YES
    return RebootDecision.IF_BUSY if driver.reboot_if_busy else RebootDecision.NO


def planned_host_driver(ctx: PlanningContext, facts: NodeFacts) -> HostDriverPlan | None:
    """plan_host_driver of one node, decided once per plan (every driver step reads it)."""
    return ctx.node_memo("host driver", facts, lambda: plan_host_driver(ctx.spec, facts))


def plan_host_driver(spec: Spec, facts: NodeFacts) -> HostDriverPlan | None:
    """The host-mode driver upgrade of one node (None: the spec has none); refuses a node
    whose apt sources do not offer the version (DriverNotInstallable)."""
    change = host_change(spec)
    if change is None:
        return None
    host = facts.driver_host
    current = describe_current(facts)
    operands = running_operands(facts.labels)
    reboot = reboot_decision(spec)
    if host is None:
        pending = facts.gpus.driver_version != change.version
        return HostDriverPlan(
            node=facts.name,
            target=change.version,
            current=current,
            kernel=facts.driver_kernel.kernel if facts.driver_kernel else "(unknown)",
            installs=tuple((p, f"{change.version}-*") for p in change.apt_packages),
            reboot=reboot if pending else RebootDecision.NO,
            pending=pending,
            reason="" if pending else f"driver {change.version} already installed",
            warnings=(
                "no host driver facts (driver_host in node.yaml): the node's apt sources "
                "and packages were not read; apply reads them before installing (record "
                "them with `rollout facts record --plan PLAN`)",
            )
            if pending
            else (),
            operands=operands,
        )
    installs = _choose_versions(spec, change, facts, host)
    at_target = host.driver.version == change.version and all(
        (found := host.packages.get(name)) is not None
        and found.installed
        and found.version == version
        and name in host.held
        for name, version in installs
    )
    return HostDriverPlan(
        node=facts.name,
        target=change.version,
        current=current,
        kernel=host.kernel or "(unknown)",
        installs=installs,
        reboot=RebootDecision.NO if at_target else reboot,
        pending=not at_target,
        reason=f"driver {change.version} installed, loaded and held" if at_target else "",
        warnings=() if at_target else _secure_boot_warnings(change, facts.name, host),
        operands=operands,
    )


def _choose_versions(
    spec: Spec, change: DriverUpgradeChange, facts: NodeFacts, host: DriverHost
) -> tuple[tuple[str, str], ...]:
    chosen: list[tuple[str, str]] = []
    for name in change.apt_packages:
        installed = host.packages.get(name)
        offered = host.offered.get(name, ())
        match = matching_version(offered, change.version)
        if (
            match is None
            and installed is not None
            and installed.present
            and AptVersion(installed.version, "").upstream == change.version
        ):
            chosen.append((name, installed.version))
            continue
        if match is None:
            raise _refusal(spec, facts.name, name, change.version, offered)
        chosen.append((name, match.version))
    return tuple(chosen)


def _refusal(
    spec: Spec, node: str, package: str, version: str, offered: tuple[AptVersion, ...]
) -> DriverNotInstallable:
    index = next(i for i, c in enumerate(spec.changes) if isinstance(c, DriverUpgradeChange))
    if offered:
        listed = ", ".join(v.version for v in offered[:MAX_OFFERED_SHOWN])
        more = (
            f" and {len(offered) - MAX_OFFERED_SHOWN} more"
            if len(offered) > MAX_OFFERED_SHOWN
            else ""
        )
        sources = ", ".join(sorted({v.source for v in offered}))
        says = f"its apt sources offer {package} {listed}{more} (from {sources})"
    else:
        says = f"its apt sources offer no version of {package} (apt-cache madison {package})"
    return DriverNotInstallable(
        spec.location_of("changes", index, "driver-upgrade", "version"),
        f"node {node}: {package} {version} cannot be installed: {says}",
        field="version",
        hint="choose a version the node's sources offer, or add the repository that carries "
        f"it and run `apt-get update` on {node}",
    )


def _secure_boot_warnings(
    change: DriverUpgradeChange, node: str, host: DriverHost
) -> tuple[str, ...]:
    if host.secure_boot is not True or not host.kernel:
        return ()
    signed = signed_module_package(change.version, host.kernel)
    if host.offered.get(signed):
        return ()
    return (
        f"Secure Boot is enabled on {node} and its apt sources offer no signed module "
        f"package for kernel {host.kernel} ({signed}): a DKMS-built module is unsigned and "
        "will not load; install the signed package or enrol a MOK key first",
    )


def plan_pending_host_driver(
    kind: str, ctx: PlanningContext, facts: NodeFacts
) -> HostDriverPlan | StepPlan:
    """The host-mode driver change with work on the node, or the skip of step `kind` where
    there is none (no such change, or the node already runs the version)."""
    planned = planned_host_driver(ctx, facts)
    if planned is None:
        return StepPlan.skipping(kind, "no host-mode driver change")
    if not planned.pending:
        return StepPlan.skipping(kind, planned.reason)
    return planned


def host_driver_pending(ctx: PlanningContext, facts: NodeFacts) -> bool:
    """Whether a host-mode driver upgrade has work on the node (cordon, drain and the GPU
    checks act there); False when the spec has none or the node already runs the version."""
    planned = planned_host_driver(ctx, facts)
    return planned is not None and planned.pending
