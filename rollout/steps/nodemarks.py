"""What rollout leaves on a Node object for operators: annotations and Events.

Each step marks the node it works on: the `rollout.dev/run` and `rollout.dev/step`
annotations and an Event, so `kubectl describe node` shows how far a run got
(`report_step`; a `MarkingStep` applies through it). A node rollout leaves cordoned after
a failed rollback also says so, why, and in which run (`mark_left_cordoned`); rollout's
own uncordon removes that mark again (`mark_released`). Rollout writes under a domain of
its own, never under `nvidia.com`, which belongs to the GPU Operator.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable
from typing import ClassVar

from rollout.errors import RolloutError
from rollout.steps.base import StepContext, StepResult
from rollout.transports.errors import KubeError
from rollout.transports.kube import EventType

ANNOTATION_DOMAIN = "rollout.dev"
RUN_ANNOTATION = f"{ANNOTATION_DOMAIN}/run"
STEP_ANNOTATION = f"{ANNOTATION_DOMAIN}/step"
LEFT_CORDONED_ANNOTATION = f"{ANNOTATION_DOMAIN}/left-cordoned"
# The kubelet records node events in `default`; `kubectl describe node` finds them there.
EVENT_NAMESPACE = "default"
EVENT_REASON_PREFIX = "Rollout"
LEFT_CORDONED_REASON = "RolloutLeftCordoned"
RELEASED_REASON = "RolloutReleased"
# An annotation is read in `kubectl describe`; the journal keeps the whole story.
MAX_REASON_CHARS = 1000


def event_reason(kind: str) -> str:
    """`gpu.smoke` -> `RolloutGpuSmoke`: Event reasons are CamelCase words."""
    words = re.split(r"[^A-Za-z0-9]+", kind)
    return EVENT_REASON_PREFIX + "".join(w[:1].upper() + w[1:] for w in words if w)


def mark_node(ctx: StepContext, kind: str, message: str, *, warning: bool = False) -> None:
    """Annotate the node with the run and step, and record an Event on it; best effort.

    Progress marks help an operator watching the cluster; they must never fail a step, so
    an API error here is reported as a progress line and swallowed.
    """
    try:
        ctx.kube.patch_node_annotations(
            ctx.node, {RUN_ANNOTATION: ctx.run_id, STEP_ANNOTATION: kind}
        )
        ctx.kube.create_event(
            EVENT_NAMESPACE,
            ctx.node,
            event_reason(kind),
            f"rollout run {ctx.run_id}: {kind}: {message}",
            EventType.WARNING if warning else EventType.NORMAL,
        )
    except KubeError as exc:
        ctx.progress(f"{ctx.node}: {kind}: could not record progress on the node: {exc}")


def report_step(
    ctx: StepContext, kind: str, body: Callable[[StepContext], StepResult]
) -> StepResult:
    """Run a step's body and mark the node with its outcome (a Warning Event on failure)."""
    try:
        result = body(ctx)
    except RolloutError as exc:
        mark_node(ctx, kind, f"failed: {exc}", warning=True)
        raise
    mark_node(ctx, kind, f"{result.kind.value}: {result.detail}")
    return result


class MarkingStep(abc.ABC):
    """A step that marks its node as it goes: `apply` runs `_apply` through `report_step`."""

    kind: ClassVar[str]

    def apply(self, ctx: StepContext) -> StepResult:
        return report_step(ctx, self.kind, self._apply)

    @abc.abstractmethod
    def _apply(self, ctx: StepContext) -> StepResult:
        """The step's work on the node."""


def short_reason(reason: str) -> str:
    """One line, bounded: what an annotation can carry of a failure."""
    line = " ".join(reason.split())
    return line if len(line) <= MAX_REASON_CHARS else line[: MAX_REASON_CHARS - 3] + "..."


def mark_left_cordoned(ctx: StepContext, reason: str) -> None:
    """Say on the Node that rollout leaves it cordoned, why, and which run; best effort.

    `kubectl describe node` then shows the `rollout.dev/left-cordoned` annotation and a
    Warning Event instead of a stale "step: drain". A node that is not cordoned (a rollback
    that failed on a node rollout never cordoned) gets the Warning Event only.
    """
    why = short_reason(reason)
    hint = (
        f"see `rollout status {ctx.run_id}`; fix the cause, then `kubectl uncordon {ctx.node}` "
        f"and `kubectl annotate node {ctx.node} {LEFT_CORDONED_ANNOTATION}-`"
    )
    try:
        cordoned = ctx.kube.get_node(ctx.node).unschedulable
        if cordoned:
            ctx.kube.patch_node_annotations(
                ctx.node,
                {
                    RUN_ANNOTATION: ctx.run_id,
                    STEP_ANNOTATION: "rollback",
                    LEFT_CORDONED_ANNOTATION: why,
                },
            )
        state = "left cordoned" if cordoned else "rollback failed (the node is schedulable)"
        ctx.kube.create_event(
            EVENT_NAMESPACE,
            ctx.node,
            LEFT_CORDONED_REASON,
            f"rollout run {ctx.run_id}: {state}: {why}; {hint}",
            EventType.WARNING,
        )
    except KubeError as exc:
        ctx.progress(f"{ctx.node}: could not mark the node left cordoned: {exc}")


def mark_released(ctx: StepContext, left_reason: str | None) -> None:
    """Remove the left-cordoned mark once rollout uncordons the node; best effort."""
    if left_reason is None:
        return
    try:
        ctx.kube.patch_node_annotations(ctx.node, {LEFT_CORDONED_ANNOTATION: None})
        ctx.kube.create_event(
            EVENT_NAMESPACE,
            ctx.node,
            RELEASED_REASON,
            f"rollout run {ctx.run_id}: uncordoned; it had been left cordoned: {left_reason}",
            EventType.NORMAL,
        )
    except KubeError as exc:
        ctx.progress(f"{ctx.node}: could not clear the left-cordoned mark: {exc}")
