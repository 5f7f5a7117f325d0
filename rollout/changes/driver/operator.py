# long module: one job, the operator-mode upgrade: its three steps share its reads of the cluster
"""`mode: operator` driver upgrades: pin, release wave by wave, confirm.

- `driver.pin` is cluster-wide but runs in a node's context, like `configmap.update`: the
  first node of a run labels every node the driver DaemonSet serves
  `nvidia.com/gpu-driver-upgrade.skip=true` (a label someone else set is recorded and left
  alone), records each node's driver-pod revision, and only then sets the ClusterPolicy's
  `spec.driver.version` (or the named NVIDIADriver's `spec.version`, whose own DaemonSet's
  nodes are the served ones); every later node finds it done. The skip label is read only when a
  node leaves `upgrade-required` (FACTS.md), so it must be on before the version moves.
- `driver.release` takes the label off its node once rollout's max_unavailable allows and no
  served node is `upgrade-failed`, then watches `nvidia.com/gpu-driver-upgrade-state` until
  `upgrade-done` on a new driver pod (a timeout, or `upgrade-failed`, fails the node).
- `driver.confirm` proves it: the driver pod Ready and not the one from before the change,
  `nvidia-smi` on the node reporting the target version, GFD's driver label agreeing.

Everything each step needs to resume is on the cluster (labels and annotations), so a
resumed run derives its progress from the labels. Nothing is undone automatically: a driver
already upgraded stays, the nodes not reached stay pinned, and the run summary says how to go
back (operatorplan.operator_run_notes, the kind's `run_notes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import ClassVar

from rollout.budget import NodeAvailability, RunBudget, Verdict
from rollout.changes.base import PlanningContext
from rollout.changes.driver.model import DEFAULT_OPERATOR_UPGRADE_TIMEOUT_S, DriverUpgradeChange
from rollout.changes.driver.operatorplan import (
    AUTO_UPGRADE_PATCH,
    PINNED_BY_ANNOTATION,
    REVISION_BEFORE_ANNOTATION,
    VERSION_BEFORE_ANNOTATION,
    operator_change,
    plan_node_work,
    planned_driver,
)
from rollout.driver.operator import (
    IDLE_STATES,
    UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION,
    UPGRADE_SKIP_LABEL,
    DriverSource,
    OperatorDriver,
    is_pinned,
    served_by_driver_daemonset,
    upgrade_state,
)
from rollout.errors import RolloutError
from rollout.fact import read_fact
from rollout.facts import NodeFacts
from rollout.facts.gpu import GpuQueryFact
from rollout.operatornames import (
    UPGRADE_DONE,
    UPGRADE_FAILED,
    UPGRADE_REQUIRED,
    UPGRADE_STATE_LABEL,
)
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import POLL_INTERVAL_S, Deadline
from rollout.steps.nodemarks import RUN_ANNOTATION, report_step
from rollout.steps.traits import StepTraits, bounded_by_requests, fixed_s
from rollout.transports.errors import NotFound
from rollout.transports.kube import Node, Pod

REVISION_LABEL = "controller-revision-hash"
GFD_DRIVER_LABEL = "nvidia.com/cuda.driver-version.full"
LOG_LINES = 5


def driver_pod(ctx: StepContext, change: DriverUpgradeChange, node: str) -> Pod | None:
    """The live pod of the change's driver DaemonSet on the node, if any."""
    selector = DriverSource(change.nvidiadriver).pod_selector
    pods = ctx.kube.list_pods(None, selector, f"spec.nodeName={node}")
    live = [p for p in pods if not p.deleting]
    return live[0] if live else None


def read_driver(
    ctx: StepContext, kind: str, change: DriverUpgradeChange
) -> tuple[str, OperatorDriver]:
    """The live ClusterPolicy's name and the driver the change moves (its driver section, or
    the named NVIDIADriver's version under its upgradePolicy)."""
    policies = ctx.kube.list_cluster_policies()
    if not policies:
        raise StepFailed(ctx.node, kind, "no ClusterPolicy: is the GPU Operator installed?")
    policy = policies[0]
    driver = OperatorDriver.from_cluster_policy(policy.get("spec") or {})
    if change.nvidiadriver is not None:
        try:
            found = ctx.kube.get_nvidia_driver(change.nvidiadriver)
        except NotFound as error:
            raise StepFailed(
                ctx.node, kind, f"no NVIDIADriver {change.nvidiadriver}: {error}"
            ) from error
        driver = driver.with_nvidia_driver(change.nvidiadriver, found.get("spec") or {})
    return str(policy["metadata"]["name"]), driver


def upgrade_timeout_s(spec: Spec) -> int:
    change = operator_change(spec)
    if change is None or change.upgrade_timeout_s is None:
        return DEFAULT_OPERATOR_UPGRADE_TIMEOUT_S
    return change.upgrade_timeout_s


class OperatorStep:
    """What the operator-mode steps share: applied through report_step, with nothing to do
    unless the plan has an operator-mode driver change."""

    kind: ClassVar[str]

    def apply(self, ctx: StepContext) -> StepResult:
        return report_step(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext) -> StepResult:
        change = operator_change(ctx.spec)
        if change is None:
            return StepResult.noop("no operator-mode driver change")
        return self.act(ctx, change)

    def act(self, ctx: StepContext, change: DriverUpgradeChange) -> StepResult:
        raise NotImplementedError


@dataclass(frozen=True)
class DriverPinStep(OperatorStep):
    """Pin every node the driver DaemonSet serves, then change the ClusterPolicy's version.

    Saved data: version_before, policy, pinned (the nodes this step labelled), held (skip
    labels found, left alone).
    """

    kind: ClassVar[str] = "driver.pin"
    # the skip label on every node the driver DaemonSet serves; the version it patches is the
    # plan's (the kind's `grants`, in kind.py)
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=True,
        takes_down=False,
        uses_ssh=False,
        grants=(
            *grants_of("", "nodes", "get list patch"),
            *grants_of("", "pods", "list"),
            *grants_of("nvidia.com", "clusterpolicies", "list"),
        ),
        expected_s=2.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        change = operator_change(ctx.spec)
        if change is None:
            return StepPlan.skipping(self.kind, "no operator-mode driver change")
        driver = planned_driver(change, ctx.cluster)
        if driver.version == change.version:
            return StepPlan.skipping(
                self.kind, f"{driver.source.what} already asks for {change.version}"
            )
        # cluster-wide: the first node's step makes the change, later ones find it made
        return StepPlan.acting(
            self.kind,
            f"label every node the driver DaemonSet serves {UPGRADE_SKIP_LABEL}=true, then "
            f"set {driver.source.target} {driver.version or '(unset)'} -> {change.version}",
        )

    def act(self, ctx: StepContext, change: DriverUpgradeChange) -> StepResult:
        name, driver = read_driver(ctx, self.kind, change)
        if driver.version == change.version:
            return StepResult.noop(f"{driver.source.what} already asks for {change.version}")
        if not driver.policy.auto_upgrade:
            raise StepFailed(
                ctx.node,
                self.kind,
                "spec.driver.upgradePolicy.autoUpgrade is off: the operator would upgrade "
                f"nothing; turn it on: kubectl patch clusterpolicy {name} --type merge -p "
                f"'{AUTO_UPGRADE_PATCH}'",
            )
        saved = ctx.load_data(self.kind)
        saved.setdefault("version_before", driver.version)
        saved["policy"] = name
        pinned, held = set(saved.get("pinned") or []), set(saved.get("held") or [])
        served = [n for n in ctx.kube.list_nodes() if driver.source.serves(n.labels)]
        for node in served:
            if is_pinned(node.labels) and PINNED_BY_ANNOTATION not in node.annotations:
                held.add(node.name)
                continue
            pinned.add(node.name)
            # recorded before the patch, so a resumed run knows which labels are rollout's
            ctx.save_data(self.kind, {**saved, "pinned": sorted(pinned), "held": sorted(held)})
            pod = driver_pod(ctx, change, node.name)
            annotations = {PINNED_BY_ANNOTATION: ctx.run_id}
            if pod is not None and pod.labels.get(REVISION_LABEL):
                annotations[REVISION_BEFORE_ANNOTATION] = pod.labels[REVISION_LABEL]
            ctx.kube.patch_node_annotations(node.name, annotations)
            ctx.kube.patch_node_labels(node.name, {UPGRADE_SKIP_LABEL: "true"})
        missing = [
            n.name
            for n in ctx.kube.list_nodes()
            if driver.source.serves(n.labels) and not is_pinned(n.labels)
        ]
        if missing:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"{', '.join(missing)} not pinned after labelling ({UPGRADE_SKIP_LABEL}); "
                "the version was not changed: is another tool removing the label?",
            )
        ctx.save_data(self.kind, {**saved, "pinned": sorted(pinned), "held": sorted(held)})
        annotations = {VERSION_BEFORE_ANNOTATION: driver.version, RUN_ANNOTATION: ctx.run_id}
        patch = {
            "metadata": {"annotations": annotations},
            **driver.source.version_patch(change.version),
        }
        if driver.source.resource is None:
            ctx.kube.patch_cluster_policy(name, patch)
        else:
            ctx.kube.patch_nvidia_driver(driver.source.resource, patch)
        _, after = read_driver(ctx, self.kind, change)
        what = f"ClusterPolicy {name}" if driver.source.resource is None else driver.source.what
        if after.version != change.version:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"{what} reads driver version {after.version!r} after the patch",
            )
        left = f"; left alone (skip label set before): {', '.join(sorted(held))}" if held else ""
        field = "spec.driver.version" if driver.source.resource is None else "spec.version"
        return StepResult.done(
            f"pinned {len(pinned)} node(s) with {UPGRADE_SKIP_LABEL}=true{left}; "
            f"{what} {field} {driver.version} -> {change.version}"
        )

    def undo(self, ctx: StepContext) -> None:
        """Nothing: the version stays and the nodes not reached stay pinned; going back is the
        operator's call, and the run summary prints the command."""


@dataclass(frozen=True)
class DriverReleaseStep(OperatorStep):
    """Take the skip label off the node; wait for the operator to reach upgrade-done."""

    kind: ClassVar[str] = "driver.release"
    # the operator's own upgrade of the node: drain, driver pod restart, validation
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=(
            *grants_of("", "nodes", "get list patch"),
            *grants_of("", "pods", "list"),
            *grants_of("", "pods/log", "get"),
        ),
        expected_s=300.0,
        worst_s=fixed_s(float(DEFAULT_OPERATOR_UPGRADE_TIMEOUT_S)),
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        planned = plan_node_work(
            facts,
            ctx.spec,
            self.kind,
            "remove the skip label; the GPU Operator upgrades the driver {current} -> {target} "
            "(cordon, GPU pods deleted, driver pod restarted, validation, uncordon; no reboot); "
            "wait for upgrade-done",
        )
        change = operator_change(ctx.spec)
        if planned.changes and change is not None and _retried(change, facts.labels):
            return StepPlan.acting(
                self.kind,
                f"relabel {UPGRADE_STATE_LABEL} {UPGRADE_FAILED} -> {UPGRADE_REQUIRED} (the "
                "documented manual fix: the cause must be fixed first); the GPU Operator "
                f"retries the upgrade to {change.version}; wait for upgrade-done",
            )
        return planned

    def act(self, ctx: StepContext, change: DriverUpgradeChange) -> StepResult:
        deadline = ctx.deadline(upgrade_timeout_s(ctx.spec), judges_own_node=True)
        node = ctx.kube.get_node(ctx.node)
        release: dict[str, str | None] = {}
        if is_pinned(node.labels):
            if PINNED_BY_ANNOTATION not in node.annotations:
                return StepResult.noop(
                    f"{UPGRADE_SKIP_LABEL}=true was set before this run: left alone"
                )
            release[UPGRADE_SKIP_LABEL] = None
        if _retried(change, node.labels):
            release[UPGRADE_STATE_LABEL] = UPGRADE_REQUIRED  # the documented manual fix
            if node.unschedulable and UPGRADE_INITIAL_UNSCHEDULABLE_ANNOTATION not in (
                node.annotations
            ):
                # the failed upgrade's own cordon: the operator would take the node as
                # cordoned before the retry and leave it so at upgrade-done
                ctx.save_data(self.kind, {"uncordon": True})
        budget = ctx.budget
        if budget is None:
            raise StepFailed(ctx.node, self.kind, "no unavailability budget: run it by apply")
        if release:
            self._release(ctx, budget, deadline, release)
        else:  # released already (a resumed run): watched, and counted against the budget
            budget.hold(ctx.node)
        try:
            before = node.annotations.get(REVISION_BEFORE_ANNOTATION)
            done = self._watch(ctx, change, before, deadline)
        finally:
            budget.settled(ctx.node)
        if not ctx.load_data(self.kind).get("uncordon"):
            return done
        ctx.kube.set_unschedulable(ctx.node, False)
        return StepResult.done(
            f"{done.detail}; uncordoned (the failed upgrade's cordon, which the operator keeps)"
        )

    def _release(
        self,
        ctx: StepContext,
        budget: RunBudget,
        deadline: Deadline,
        labels: Mapping[str, str | None],
    ) -> None:
        """Remove the skip label (and relabel a retried upgrade-failed node upgrade-required)
        once the run's budget takes one more node upgrading; never while another served node
        is upgrade-failed (it halts the run)."""
        while True:
            served = self._served(ctx)
            seen = [NodeAvailability(n.name, _taken_down(n), n.ready) for n in served]
            decision = budget.release(
                ctx.node,
                seen,
                datetime.now(UTC),
                lambda: ctx.kube.patch_node_labels(ctx.node, labels),
            )
            if decision.verdict is Verdict.START:
                done = ["skip label removed"] if UPGRADE_SKIP_LABEL in labels else []
                if UPGRADE_STATE_LABEL in labels:
                    done.append(f"relabelled {UPGRADE_FAILED} -> {UPGRADE_REQUIRED}")
                ctx.progress(f"{ctx.node}: driver.release: {'; '.join(done)}")
                return
            if deadline.expired:
                busy = budget.taken(ctx.node, seen)
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    f"max_unavailable {budget.limit} still taken by {', '.join(busy)} after "
                    f"{round(deadline.elapsed_s)}s",
                )
            deadline.sleep(POLL_INTERVAL_S)

    def _served(self, ctx: StepContext) -> list[Node]:
        """The nodes the driver DaemonSet serves; StepFailed while one is upgrade-failed."""
        served = [n for n in ctx.kube.list_nodes() if served_by_driver_daemonset(n.labels)]
        failed = [
            n.name
            for n in served
            if upgrade_state(n.labels) == UPGRADE_FAILED
            and not ctx.spec.retries_failed_upgrade_of(n.name, n.labels)
        ]
        if failed:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"{', '.join(failed)} {UPGRADE_STATE_LABEL}={UPGRADE_FAILED}: not releasing "
                "another node",
            )
        return served

    def _watch(
        self,
        ctx: StepContext,
        change: DriverUpgradeChange,
        before: str | None,
        deadline: Deadline,
    ) -> StepResult:
        seen: list[str] = []
        while True:
            node = ctx.kube.get_node(ctx.node)
            state = upgrade_state(node.labels)
            if not seen or seen[-1] != state:
                seen.append(state)
            pod = driver_pod(ctx, change, ctx.node)
            if state == UPGRADE_FAILED:
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    f"the GPU Operator labelled the node {UPGRADE_STATE_LABEL}={UPGRADE_FAILED}"
                    f" ({' -> '.join(s or '(none)' for s in seen)}); {self._describe(ctx, pod)}",
                )
            fresh = pod is not None and (before is None or pod.labels.get(REVISION_LABEL) != before)
            if state == UPGRADE_DONE and fresh and pod is not None and pod.ready:
                return StepResult.done(
                    f"{' -> '.join(s or '(none)' for s in seen)} on driver pod {pod.name}"
                )
            if deadline.expired:
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    f"not {UPGRADE_DONE} after {round(deadline.elapsed_s)}s "
                    f"(upgrade_timeout_s): {' -> '.join(s or '(none)' for s in seen)}; "
                    f"{self._describe(ctx, pod)}",
                )
            deadline.sleep(POLL_INTERVAL_S)

    @staticmethod
    def _describe(ctx: StepContext, pod: Pod | None) -> str:
        if pod is None:
            return "no driver pod on the node"
        reasons = ", ".join(pod.container_reasons) or pod.phase
        try:
            log = ctx.kube.read_pod_log(pod.namespace, pod.name, pod.containers[0])
        except (RolloutError, IndexError):
            log = ""
        # a crash-looping container repeats itself: its last distinct lines
        lines = list(dict.fromkeys(reversed(log.strip().splitlines())))[:LOG_LINES]
        tail = " | ".join(reversed(lines))
        return f"driver pod {pod.namespace}/{pod.name}: {reasons}" + (
            f"; log: {tail}" if tail else ""
        )

    def undo(self, ctx: StepContext) -> None:
        """Nothing: a driver the operator upgraded is not put back by pinning the node."""


@dataclass(frozen=True)
class DriverConfirmStep(OperatorStep):
    """The node runs the target driver: new driver pod Ready, nvidia-smi and GFD agree."""

    kind: ClassVar[str] = "driver.confirm"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(
            *grants_of("", "nodes", "get"),
            *grants_of("", "pods", "list"),
            *grants_of("", "pods/log", "get"),
            *grants_of("nvidia.com", "clusterpolicies", "list"),
        ),
        expected_s=5.0,
        worst_s=bounded_by_requests,
    )

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        return plan_node_work(
            facts,
            ctx.spec,
            self.kind,
            "the driver pod is in sync with the DaemonSet and Ready; nvidia-smi on the node "
            "reports {target}",
        )

    def act(self, ctx: StepContext, change: DriverUpgradeChange) -> StepResult:
        node = ctx.kube.get_node(ctx.node)
        pod = driver_pod(ctx, change, ctx.node)
        problems: list[str] = []
        before = node.annotations.get(REVISION_BEFORE_ANNOTATION)
        if pod is None or not pod.ready:
            problems.append("no Ready driver pod on the node")
        elif before is not None and pod.labels.get(REVISION_LABEL) == before:
            problems.append(
                f"driver pod {pod.name} still has the revision from before the change ({before})"
            )
        reported = read_fact(ctx.runner, GpuQueryFact()).driver_version
        if reported != change.version:
            problems.append(f"nvidia-smi on the node reports driver {reported or '(none)'}")
        gfd = node.labels.get(GFD_DRIVER_LABEL)
        if gfd is not None and gfd != change.version:
            problems.append(f"GFD labels the node {GFD_DRIVER_LABEL}={gfd}")
        if problems:
            raise StepFailed(
                ctx.node, self.kind, f"not on driver {change.version}: " + "; ".join(problems)
            )
        assert pod is not None
        revision = pod.labels.get(REVISION_LABEL, "?")
        return StepResult.done(
            f"driver pod {pod.name} Ready at revision {revision}; nvidia-smi reports "
            f"{reported}" + ("" if gfd is None else f"; GFD agrees ({GFD_DRIVER_LABEL})")
        )

    def undo(self, ctx: StepContext) -> None:
        """Nothing: confirm only reads."""


def _retried(change: DriverUpgradeChange, labels: Mapping[str, str]) -> bool:
    """The change retries failed targets and this node is one."""
    return change.retry_failed and upgrade_state(labels) == UPGRADE_FAILED


def _taken_down(node: Node) -> bool:  # counted against max_unavailable, as NotReady is
    return node.unschedulable or upgrade_state(node.labels) not in IDLE_STATES
