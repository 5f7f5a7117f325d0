"""The MIG kind's steps: mig.configure labels the node with the layout, mig.wait waits for
the MIG manager to report it applied.

The MIG manager (GPU Operator) does the work: it reads `nvidia.com/mig.config`, pauses the
node's GPU operands, applies the layout (rebooting the node where the MIG mode needs it) and
reports `nvidia.com/mig.config.state`: pending, rebooting, success or failed. It drains
nothing and paces nothing: rollout cordons and drains before, and checks what the node
advertises after (gpu.wait, gpu.smoke).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from rollout.changes.base import PlanningContext
from rollout.changes.mig.model import MigChange
from rollout.changes.mig.work import MigWork
from rollout.errors import RolloutError
from rollout.facts import NodeFacts
from rollout.facts.migmode import (
    CONFIG_LABEL,
    MANAGER_SELECTOR,
    STATE_LABEL,
    MigState,
    NodeMig,
)
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.spec import Policy
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import POLL_INTERVAL_S
from rollout.steps.nodemarks import MarkingStep
from rollout.steps.reboot import read_boot_id, wait_for_reboot
from rollout.steps.traits import StepTraits, bounded_by_requests
from rollout.transports.errors import KubeError

CONFIGURE = "mig.configure"
LOG_TAIL_LINES = 10
NO_MIG_CHANGE = "the plan changes no MIG layout"
# what reading the node's MIG manager pod's log asks (a failed state quotes its tail)
MANAGER_LOG_GRANTS = (*grants_of("", "pods", "list"), *grants_of("", "pods/log", "get"))


def mig_wait_worst_s(policy: Policy) -> float:
    """The MIG manager's time (verify.gpu_wait_timeout_s) and, where it reboots the node,
    the reboot's (driver.reboot_timeout_s)."""
    return float(policy.verify.gpu_wait_timeout_s + policy.driver.reboot_timeout_s)


def plan_layout(ctx: PlanningContext, node: NodeFacts, kind: str, action: str) -> StepPlan:
    """Acting where the node changes layout (`action` may name it: {label}), else why not."""
    work = ctx.work(node, "mig")
    if not isinstance(work, MigWork):
        return StepPlan.skipping(kind, NO_MIG_CHANGE)
    if work.already:
        return StepPlan.skipping(kind, work.already)
    return StepPlan.acting(kind, action.format(label=work.describe_label(), layout=work.layout))


def target_layout(ctx: StepContext) -> str:
    """The layout the plan gives the node."""
    change = next(c for c in ctx.spec.changes if isinstance(c, MigChange))
    return change.config


@dataclass(frozen=True)
class MigConfigure(MarkingStep):
    """Label the node nvidia.com/mig.config=<layout>; the previous label (and the boot id, so
    mig.wait can prove a reboot) are saved first. Undo puts the previous label back and waits
    for the manager to report it applied."""

    kind: ClassVar[str] = CONFIGURE
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(*grants_of("", "nodes", "get patch"), *MANAGER_LOG_GRANTS),
        expected_s=2.0,
        worst_s=lambda policy: bounded_by_requests(policy) + mig_wait_worst_s(policy),
    )

    def plan(self, ctx: PlanningContext, node: NodeFacts) -> StepPlan:
        return plan_layout(ctx, node, self.kind, "{label}")

    def _apply(self, ctx: StepContext) -> StepResult:
        layout = target_layout(ctx)
        labels = ctx.kube.get_node(ctx.node).labels
        record = ctx.load_data(self.kind)
        if "previous" not in record:
            # saved before the label changes: a resumed run undoes to what was there first
            record = {
                "previous": labels.get(CONFIG_LABEL),
                "boot_before": read_boot_id(ctx.runner),
            }
            ctx.save_data(self.kind, record)
        before = record["previous"] or "(none)"
        if labels.get(CONFIG_LABEL) == layout:
            return StepResult.noop(f"{CONFIG_LABEL} already {layout} (was {before})")
        relabel(ctx, layout)
        return StepResult.done(f"{CONFIG_LABEL} {before} -> {layout}")

    def undo(self, ctx: StepContext) -> None:
        """Put the previous layout back and wait for the manager's success."""
        record = ctx.load_data(self.kind)
        if "previous" not in record:
            return  # never labelled
        previous = record["previous"]
        labels = ctx.kube.get_node(ctx.node).labels
        if labels.get(CONFIG_LABEL) != previous:
            relabel(ctx, previous)
        if previous is None:
            return  # no layout to wait for: the manager keeps the GPUs as they are
        boot_before = read_boot_id(ctx.runner) or record.get("boot_before")
        detail = wait_for_layout(ctx, self.kind, previous, boot_before, undo=True)
        ctx.progress(f"{ctx.node}: {self.kind}: undo: {CONFIG_LABEL} back to {previous}: {detail}")


def relabel(ctx: StepContext, layout: str | None) -> None:
    """Ask the MIG manager for `layout` (None: remove the label). The state goes to pending
    in the same patch: until the manager takes the new label up, the node still says
    `success` of the layout before, which mig.wait would take for the new one's."""
    state = MigState.PENDING if layout is not None else None
    ctx.kube.patch_node_labels(ctx.node, {CONFIG_LABEL: layout, STATE_LABEL: state})


@dataclass(frozen=True)
class MigWait(MarkingStep):
    """Wait for nvidia.com/mig.config.state=success of the layout mig.configure set; `failed`
    or the time limit fails the node, `rebooting` waits for the node's new boot and Ready."""

    kind: ClassVar[str] = "mig.wait"
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(*grants_of("", "nodes", "get"), *MANAGER_LOG_GRANTS),
        expected_s=30.0,
        worst_s=mig_wait_worst_s,
    )

    def plan(self, ctx: PlanningContext, node: NodeFacts) -> StepPlan:
        return plan_layout(
            ctx,
            node,
            self.kind,
            "wait for nvidia.com/mig.config.state=success of {layout} (a reboot the MIG "
            "manager asks for is waited for)",
        )

    def _apply(self, ctx: StepContext) -> StepResult:
        boot_before = ctx.load_data(CONFIGURE).get("boot_before")
        return StepResult.done(wait_for_layout(ctx, self.kind, target_layout(ctx), boot_before))

    def undo(self, ctx: StepContext) -> None:
        """A wait changes nothing (mig.configure's undo puts the layout back)."""


def wait_for_layout(
    ctx: StepContext, step: str, layout: str, boot_before: Any, *, undo: bool = False
) -> str:
    """Wait, within verify.gpu_wait_timeout_s (plus driver.reboot_timeout_s for a reboot),
    for the MIG manager's success with `layout`; StepFailed on `failed`, on another layout
    label, or at the limit."""
    policy = ctx.spec.policy
    deadline = ctx.deadline(policy.verify.gpu_wait_timeout_s)
    rebooted = ""
    prefix = "undo: " if undo else ""
    while True:
        mig = NodeMig.from_labels(ctx.kube.get_node(ctx.node).labels)
        if mig.config != layout:
            raise StepFailed(
                ctx.node,
                step,
                f"{prefix}{CONFIG_LABEL} is {mig.config!r}, not {layout!r}: something else "
                "relabelled the node while rollout waited for the MIG manager",
            )
        if mig.state == MigState.SUCCESS:
            return f"layout {layout} applied (state success after {round(deadline.elapsed_s)}s)" + (
                f"; {rebooted}" if rebooted else ""
            )
        if mig.state == MigState.FAILED:
            raise StepFailed(ctx.node, step, prefix + describe_failed(ctx, layout))
        if mig.state == MigState.REBOOTING and not rebooted and boot_before:
            ctx.progress(f"{ctx.node}: {step}: the MIG manager reboots the node")
            try:
                done = wait_for_reboot(
                    ctx.runner,
                    str(boot_before),
                    float(policy.driver.reboot_timeout_s),
                    lambda: ctx.kube.get_node(ctx.node).ready,
                    ctx.sleep,
                )
            except RolloutError as exc:
                raise StepFailed(ctx.node, step, f"{prefix}state rebooting: {exc}") from exc
            rebooted = done.describe()
            # the manager finishes after the boot: its own time starts again
            deadline = ctx.deadline(policy.verify.gpu_wait_timeout_s)
            continue
        if deadline.expired:
            raise StepFailed(
                ctx.node,
                step,
                f"{prefix}the MIG manager did not report layout {layout} applied within "
                f"{round(deadline.elapsed_s)}s (policy.verify.gpu_wait_timeout_s): "
                f"nvidia.com/mig.config.state is {mig.state or '(absent)'}; "
                + manager_log_tail(ctx),
            )
        deadline.sleep(POLL_INTERVAL_S)


def describe_failed(ctx: StepContext, layout: str) -> str:
    """The manager's `failed`, with its pod's log tail where it can be read."""
    return (
        f"the MIG manager reports nvidia.com/mig.config.state=failed for layout {layout}; "
        + manager_log_tail(ctx)
    )


def manager_log_tail(ctx: StepContext) -> str:
    """The last lines of the node's MIG manager pod's log, or why there are none."""
    try:
        pods = ctx.kube.list_pods(
            None, label_selector=MANAGER_SELECTOR, field_selector=f"spec.nodeName={ctx.node}"
        )
        if not pods:
            return f"no MIG manager pod ({MANAGER_SELECTOR}) on the node"
        pod = pods[0]
        log = ctx.kube.read_pod_log(pod.namespace, pod.name, tail_lines=LOG_TAIL_LINES)
    except KubeError as exc:
        return f"the MIG manager's log could not be read: {exc}"
    lines = log.rstrip("\n").splitlines()[-LOG_TAIL_LINES:]
    shown = "\n    ".join(lines) if lines else "(empty)"
    return f"its pod {pod.namespace}/{pod.name} logs:\n    {shown}"
