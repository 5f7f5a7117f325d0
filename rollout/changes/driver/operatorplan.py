"""`mode: operator` driver upgrades, planned for the whole cluster: what changes on the
ClusterPolicy (or the NVIDIADriver the change names), which nodes its driver DaemonSet
serves, who stays pinned, and the budget.

The GPU Operator's upgrade controller does the upgrade; rollout paces it through the skip
label (FACTS.md): every served node is labelled `nvidia.com/gpu-driver-upgrade.skip=true`
before the version changes, and each wave's nodes are released by removing it. Served nodes
that are not targeted stay pinned on the old driver; the plan and the run summary say so
with the command that releases them. Nodes another NVIDIADriver serves are not touched at all:
the version change is not theirs, and the plan says they stay on their driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.driver.operator import (
    DEFAULT_CLUSTER_POLICY,
    MANAGED_BY_LABEL,
    UPGRADE_SKIP_LABEL,
    DriverSource,
    OperatorDriver,
    is_pinned,
    served_by_driver_daemonset,
    upgrade_state,
)
from rollout.errors import BadInput, SourceLocation
from rollout.facts import ClusterFacts, FleetFacts, NodeFacts
from rollout.operatornames import UPGRADE_DONE
from rollout.plan import ClusterChange, Plan, StepPlan
from rollout.spec import Spec

# rollout marks the skip labels it set, so a label someone else set is told apart and left alone
PINNED_BY_ANNOTATION = "rollout.dev/driver-pinned-by"
# The driver pod's controller-revision-hash before the version changed (set with the pin)
REVISION_BEFORE_ANNOTATION = "rollout.dev/driver-revision-before"
# On the ClusterPolicy (or NVIDIADriver): the version rollout changed it from
VERSION_BEFORE_ANNOTATION = "rollout.dev/driver-version-before"
PINNED_WARNING_PREFIX = "NOT UPGRADED"
AUTO_UPGRADE_PATCH = '{"spec":{"driver":{"upgradePolicy":{"autoUpgrade":true}}}}'


class OperatorUpgradeRefused(BadInput):
    """The plan cannot drive this operator-mode upgrade; the message says what to do."""


def operator_change(spec: Spec) -> DriverUpgradeChange | None:
    """The spec's `driver-upgrade` change in mode: operator, if there is one."""
    change = spec.change_of(DriverUpgradeChange)
    return change if change is not None and change.mode is DriverMode.OPERATOR else None


def planned_driver(change: DriverUpgradeChange, cluster: ClusterFacts) -> OperatorDriver:
    """The driver the change moves, as the facts state it: the ClusterPolicy's, or the named
    NVIDIADriver's version under the ClusterPolicy's upgradePolicy (version "" when absent)."""
    driver = OperatorDriver.from_cluster_policy(cluster.cluster_policy)
    if change.nvidiadriver is None:
        return driver
    spec = cluster.nvidia_drivers.get(change.nvidiadriver) or {}
    return driver.with_nvidia_driver(change.nvidiadriver, spec)


def node_upgraded(facts: NodeFacts, target: str) -> bool:
    return facts.gpus.driver_version == target and upgrade_state(facts.labels) in ("", UPGRADE_DONE)


def plan_node_work(facts: NodeFacts, spec: Spec, kind: str, action: str) -> StepPlan:
    """The shared decision of release and confirm: act unless the node is already there or
    someone else's skip label holds it."""
    change = operator_change(spec)
    reason = _no_node_work(facts, change)
    if reason is not None:
        return StepPlan.skipping(kind, reason)
    assert change is not None  # _no_node_work gave a reason otherwise
    return StepPlan.acting(
        kind, action.format(current=facts.gpus.driver_version or "(unknown)", target=change.version)
    )


def operator_driver_pending(spec: Spec, facts: NodeFacts) -> bool:
    """An operator-mode driver change has work on this node (release and confirm act)."""
    return _no_node_work(facts, operator_change(spec)) is None


def _no_node_work(facts: NodeFacts, change: DriverUpgradeChange | None) -> str | None:
    """Why the node has nothing to do for the change; None when it has."""
    if change is None:
        return "no operator-mode driver change"
    if is_pinned(facts.labels) and PINNED_BY_ANNOTATION not in facts.annotations:
        return f"{UPGRADE_SKIP_LABEL}=true was set before this run: left alone"
    if node_upgraded(facts, change.version) and not is_pinned(facts.labels):
        return f"already runs driver {change.version}"
    return None


def release_command(nodes: Sequence[str]) -> str:
    """What releases pinned nodes to the operator's own pace."""
    return f"kubectl label node {' '.join(nodes)} {UPGRADE_SKIP_LABEL}-"


@dataclass(frozen=True)
class Budget:
    """How many served nodes may upgrade at once, and which limit binds."""

    rollout_max_unavailable: int
    max_parallel: int  # 0: unlimited
    operator_max_unavailable: int
    already_unavailable: int
    largest_wave: int

    @property
    def limits(self) -> dict[str, int]:
        limits = {
            "rollout's max_unavailable": self.rollout_max_unavailable,
            "the operator's maxUnavailable": max(
                0, self.operator_max_unavailable - self.already_unavailable
            ),
            "the wave size": self.largest_wave,
        }
        if self.max_parallel > 0:
            limits["the operator's maxParallelUpgrades"] = self.max_parallel
        return limits

    @property
    def at_once(self) -> int:
        return min(self.limits.values())

    def explain(self) -> str:
        binding = [name for name, value in self.limits.items() if value == self.at_once]
        parallel = "unlimited" if self.max_parallel == 0 else str(self.max_parallel)
        verb = "binds" if len(binding) == 1 else "bind"
        return (
            f"at most {self.at_once} node(s) upgrade at once: {' and '.join(binding)} {verb} "
            f"(rollout max_unavailable {self.rollout_max_unavailable}; operator "
            f"maxParallelUpgrades {parallel}, maxUnavailable {self.operator_max_unavailable} "
            f"with {self.already_unavailable} served node(s) already cordoned or NotReady; "
            f"largest wave {self.largest_wave})"
        )


@dataclass(frozen=True)
class OperatorUpgrade:
    """The cluster-wide side of an operator-mode driver upgrade."""

    driver: OperatorDriver
    target: str
    served: tuple[str, ...]
    targets: tuple[str, ...]
    # served, not targeted: pinned by this run, and left pinned
    pinned: tuple[str, ...]
    # carried the skip label before this run: left alone (not upgraded, not released)
    held: tuple[str, ...]
    budget: Budget
    versions: Mapping[str, str]
    # served by another NVIDIADriver's DaemonSet (node -> that resource): not touched
    elsewhere: Mapping[str, str]

    def to_cluster_changes(self) -> tuple[ClusterChange, ...]:
        to_pin = [n for n in self.served if n not in self.held]
        lines = [
            f"+ {n}: {UPGRADE_SKIP_LABEL}=true"
            + (" (target: released in its wave)" if n in self.targets else " (stays pinned)")
            for n in to_pin
        ] + [f"  {n}: skip label set before this run, left alone" for n in self.held]
        moving = self.driver.version != self.target
        source = self.driver.source
        daemonset = "the driver DaemonSet" if source.resource is None else _daemonset_of(source)
        pin = ClusterChange(
            kind="driver.pin",
            target=f"{len(self.served)} node(s) {daemonset} serves",
            action=(
                f"label {UPGRADE_SKIP_LABEL}=true on {', '.join(to_pin) or 'no node'} "
                "before the version changes"
                + (f"; already skipped, left alone: {', '.join(self.held)}" if self.held else "")
            )
            if moving
            else None,
            diff="\n".join(lines) if moving else "",
            noop_reason=None if moving else f"{source.what} already asks for {self.target}",
        )
        version = ClusterChange(
            kind="driver.version",
            target=source.target,
            action=f"{self.driver.version or '(unset)'} -> {self.target}" if moving else None,
            diff=f"- version: {self.driver.version}\n+ version: {self.target}" if moving else "",
            noop_reason=None if moving else f"already {self.target}",
            before=self.driver.version or None,
        )
        policy = ClusterChange(
            kind="driver.upgradePolicy",
            target="in force",
            action=None,
            noop_reason=f"{self.driver.policy.describe()}; {self.budget.explain()}",
        )
        return (pin, version, policy)

    def warnings(self) -> tuple[str, ...]:
        found: list[str] = []
        for name in self.pinned:
            found.append(
                f"{PINNED_WARNING_PREFIX}: {name} is served by the driver DaemonSet but not "
                f"targeted: it stays pinned on driver {self.versions.get(name) or '(unknown)'} "
                f"({UPGRADE_SKIP_LABEL}=true) after this run; release it with: "
                f"{release_command([name])}"
            )
        for name, other in self.elsewhere.items():
            found.append(
                f"{PINNED_WARNING_PREFIX}: {name} is served by NVIDIADriver {other}, not "
                f"{self.driver.source.resource}: it stays on driver "
                f"{self.versions.get(name) or '(unknown)'} (its DaemonSet is not changed); "
                f"upgrade it with a change naming nvidiadriver: {other}"
            )
        for name in self.held:
            found.append(
                f"{name} carried {UPGRADE_SKIP_LABEL}=true before this run: left alone, it is "
                "not upgraded"
            )
        if self.driver.version == self.target:
            found.append(
                f"{self.driver.source.what} already asks for driver {self.target}: nodes "
                "without the skip label upgrade at the operator's pace, not in rollout's waves"
            )
        return tuple(found)


def plan_operator_upgrade(
    spec: Spec, fleet: FleetFacts, targets: Sequence[NodeFacts], max_unavailable: int
) -> OperatorUpgrade | None:
    """The operator-mode upgrade of the spec over the fleet; None without one; refuses
    (OperatorUpgradeRefused) what the operator would not do."""
    change = operator_change(spec)
    if change is None:
        return None
    where = spec.location_of("changes")
    if not fleet.cluster.cluster_policy:
        raise OperatorUpgradeRefused(
            f"{where}: mode: operator needs the GPU Operator's ClusterPolicy, and "
            f"{fleet.source} has none; gather live facts (--kubeconfig) or record them with "
            "`rollout facts record`"
        )
    driver = planned_driver(change, fleet.cluster)
    if not driver.enabled:
        raise OperatorUpgradeRefused(
            f"{where}: the ClusterPolicy has driver.enabled=false: the GPU Operator does not "
            "manage this driver; use mode: host"
        )
    if not driver.policy.auto_upgrade:
        raise OperatorUpgradeRefused(
            f"{where}: the ClusterPolicy's spec.driver.upgradePolicy.autoUpgrade is off, so "
            "the GPU Operator's upgrade controller will not move any node (and strips the "
            "upgrade-state labels rollout watches)\n  hint: turn it on first: kubectl patch "
            f"clusterpolicy {DEFAULT_CLUSTER_POLICY} --type merge -p '{AUTO_UPGRADE_PATCH}'"
        )
    if change.nvidiadriver is not None:
        check_nvidia_driver(where, change.nvidiadriver, driver, fleet)
    # every driver pod counts toward the operator's maxUnavailable, whichever DaemonSet's
    managed = [n for n in fleet.nodes if served_by_driver_daemonset(n.labels)]
    served = [n for n in managed if driver.source.serves(n.labels)]
    served_names = {n.name for n in served}
    strays = [n.name for n in targets if n.name not in served_names]
    if strays:
        raise OperatorUpgradeRefused(
            f"{spec.location_of('targets')}: {', '.join(strays)} not served by "
            f"{_daemonset_of(driver.source)} ({_serving(driver.source)}): the operator cannot "
            "upgrade their driver through it; target only served nodes, or use mode: host there"
        )
    target_names = {n.name for n in targets}
    held = tuple(
        n.name for n in served if is_pinned(n.labels) and PINNED_BY_ANNOTATION not in n.annotations
    )
    waves = spec.policy.wave_sizes(len(targets)) or [0]
    unavailable = sum(1 for n in managed if not n.available)
    budget = Budget(
        rollout_max_unavailable=max_unavailable,
        max_parallel=driver.policy.max_parallel,
        operator_max_unavailable=driver.policy.max_unavailable_count(len(managed)),
        already_unavailable=unavailable,
        largest_wave=max(waves),
    )
    return OperatorUpgrade(
        driver=driver,
        target=change.version,
        served=tuple(n.name for n in served),
        targets=tuple(n.name for n in served if n.name in target_names),
        pinned=tuple(n.name for n in served if n.name not in target_names and n.name not in held),
        held=held,
        budget=budget,
        versions={n.name: n.gpus.driver_version for n in managed},
        elsewhere={
            n.name: n.labels.get(MANAGED_BY_LABEL, "")
            for n in managed
            if n.name not in served_names and change.nvidiadriver is not None
        },
    )


def check_nvidia_driver(
    where: SourceLocation, name: str, driver: OperatorDriver, fleet: FleetFacts
) -> None:
    """Refuse an NVIDIADriver the cluster lacks, or one the operator does not reconcile."""
    present = sorted(fleet.cluster.nvidia_drivers)
    if name not in present:
        listed = ", ".join(present) if present else "none"
        raise OperatorUpgradeRefused(
            f"{where}: nvidiadriver: {name}: {fleet.source} has no NVIDIADriver {name}\n"
            f"  hint: the NVIDIADriver resources present: {listed} (`kubectl get nvidiadrivers`);"
            " without any, the ClusterPolicy's spec.driver.version is the driver's: drop"
            " nvidiadriver"
        )
    if not driver.uses_driver_crd:
        raise OperatorUpgradeRefused(
            f"{where}: nvidiadriver: {name}: the ClusterPolicy's spec.driver.useNvidiaDriverCRD "
            "is not true, so the GPU Operator does not reconcile NVIDIADriver resources and its "
            "version change would upgrade nothing\n  hint: drop nvidiadriver to change the "
            "ClusterPolicy's spec.driver.version, which drives the driver today"
        )


def _daemonset_of(source: DriverSource) -> str:
    if source.resource is None:
        return "the GPU Operator's driver DaemonSet"
    return f"the driver DaemonSet of {source.what}"


def _serving(source: DriverSource) -> str:
    """The node labels the DaemonSet needs."""
    if source.resource is None:
        return "no nvidia.com/gpu.deploy.driver=true"
    return f"needs nvidia.com/gpu.deploy.driver=true and {MANAGED_BY_LABEL}={source.resource}"


def operator_run_notes(plan: Plan, spec: Spec, outcome: str, *, pinned: bool) -> list[str]:
    """What the run summary says loudly after an operator-mode run: the nodes left pinned
    (with the command that releases them) and, when the run did not succeed after its own
    driver.pin moved the version (`pinned`), how to go back."""
    notes = [w for w in plan.warnings if w.startswith(PINNED_WARNING_PREFIX)]
    version = next(
        (c for c in plan.cluster_changes if c.kind == "driver.version" and c.action), None
    )
    change = spec.change_of(DriverUpgradeChange)
    if outcome != "succeeded" and pinned and version is not None and version.before and change:
        source = DriverSource(change.nvidiadriver)
        notes.append(
            "the remaining nodes stay pinned on the old driver; to go back to driver "
            f"{version.before} on the nodes already upgraded: "
            f"{source.version_command(version.before)} (the operator then moves every "
            f"unpinned node {source.what} serves back)"
        )
    return notes
