"""The Kubernetes side of a node's steps: cordon, drain, uncordon, and the two GPU health gates.

Every step reads fresh state from the API first, so each one is safe to repeat on resume,
and proves its effect by reading it back. Each also leaves its mark where operators look:
the node's `rollout.nvidia.com/run` and `rollout.nvidia.com/step` annotations and an Event
on the node, so `kubectl describe node` shows how far a run got (see `report_step`).

Safety invariant 4 lives in `CordonStep` and `UncordonStep`: the journal, not the node, says
whether rollout cordoned a node, and a node someone else cordoned is never uncordoned.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rollout.drain import EvictionBackoff, classify_for_policy, format_blocked
from rollout.errors import RolloutError
from rollout.facts import ClusterFacts, NodeFacts
from rollout.journal import CordonedByRollout, Uncordoned
from rollout.plan import StepPlan
from rollout.probe import pod_to_drain_json
from rollout.spec import Spec, TimeSlicingChange
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.nodechanges import node_changes
from rollout.transports.errors import EvictionBlocked, KubeError, NotFound, TooManyRequests
from rollout.transports.kube import EventType, Node, Pod

GPU_RESOURCE = "nvidia.com/gpu"
# renameByDefault: true makes the device plugin advertise shared GPUs under this name instead.
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
RUN_ANNOTATION = "rollout.nvidia.com/run"
STEP_ANNOTATION = "rollout.nvidia.com/step"
# The kubelet records node events in `default`; `kubectl describe node` finds them there.
EVENT_NAMESPACE = "default"
EVENT_REASON_PREFIX = "Rollout"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
# The GPU Operator's device-plugin DaemonSet labels its pods so (the lab copies it).
DEVICE_PLUGIN_SELECTOR = "app=nvidia-device-plugin-daemonset"
SMOKE_NAMESPACE = "default"
SMOKE_CONTAINER = "smoke"
SMOKE_RUNTIME_CLASS = "nvidia"
POLL_INTERVAL_S = 1.0
LOG_TAIL_LINES = 20
# nvidia-smi -L prints GPU-<uuid>, MIG-<uuid>, or on older drivers MIG-GPU-<uuid>/<gi>/<ci>;
# the alternation tries the MIG forms first so a GPU- inside a MIG token is not matched alone.
_UUID_TOKEN = re.compile(
    r"MIG-GPU-[0-9a-fA-F-]+/\d+/\d+|MIG-[0-9a-fA-F][0-9a-fA-F-]*|GPU-[0-9a-fA-F][0-9a-fA-F-]*"
)
_EMBEDDED_GPU = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+$")


# ------------------------------------------------------------------------- shared plumbing


class Deadline:
    """A step's time limit, counting both the clock and the context's sleeps.

    The sleeps count too so a step driven by a fake `sleep` (unit tests) times out after the
    same number of polls it would make for real, instead of spinning forever.
    """

    def __init__(self, limit_s: float, sleep: Callable[[float], None]) -> None:
        self.limit_s = limit_s
        self._sleep = sleep
        self._started = time.monotonic()
        self._slept_s = 0.0

    @property
    def elapsed_s(self) -> float:
        return max(time.monotonic() - self._started, self._slept_s)

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.limit_s - self.elapsed_s)

    @property
    def expired(self) -> bool:
        return self.elapsed_s >= self.limit_s

    def sleep(self, delay_s: float) -> None:
        """Sleep `delay_s`, never past the deadline."""
        delay_s = min(delay_s, self.remaining_s)
        if delay_s > 0:
            self._sleep(delay_s)
            self._slept_s += delay_s


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


def describe_pod(pod: Pod) -> str:
    """One line for an operator: namespace/name, phase, readiness and whatever went wrong."""
    parts = [f"pod {pod.namespace}/{pod.name}: {pod.phase}"]
    if pod.phase == "Running":
        parts.append("ready" if pod.ready else "not ready")
    if pod.deleting:
        parts.append("terminating")
    if pod.container_reasons:
        parts.append("containers: " + ", ".join(pod.container_reasons))
    if pod.reason:
        parts.append(f"reason {pod.reason}")
    if pod.message:
        parts.append(pod.message)
    return ", ".join(parts)


def find_device_plugin_pods(ctx: StepContext) -> list[Pod]:
    """The device-plugin pods bound to the node, in any namespace (operators vary)."""
    return ctx.kube.list_pods(
        None, label_selector=DEVICE_PLUGIN_SELECTOR, field_selector=f"spec.nodeName={ctx.node}"
    )


def time_slicing_change(spec: Spec) -> TimeSlicingChange | None:
    """The spec's time-slicing change; a node carries one profile label, so the first counts."""
    changes = spec.changes_of(TimeSlicingChange)
    return changes[0] if changes else None


# --------------------------------------------------------------------------------- cordon


@dataclass(frozen=True)
class CordonStep:
    """Mark the node unschedulable, journalled first, unless someone else already did."""

    kind: ClassVar[str] = "cordon"

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        if not node_changes(facts, cluster, spec).disruptive:
            return StepPlan.skipping(self.kind, "nothing restarts on this node")
        if facts.unschedulable:
            return StepPlan.skipping(
                self.kind, "already cordoned (by someone else: it stays cordoned afterwards)"
            )
        return StepPlan.acting(self.kind, "mark the node unschedulable")

    def apply(self, ctx: StepContext) -> StepResult:
        return report_step(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext) -> StepResult:
        node = ctx.kube.get_node(ctx.node)
        ours = ctx.journal.replay().node(ctx.node).cordoned_by_rollout
        if node.unschedulable and not ours:
            ctx.save_data(self.kind, {"cordoned_by_rollout": False, "cordoned_before": True})
            return StepResult.noop("cordoned by someone else; stays cordoned")
        if node.unschedulable:
            ctx.save_data(self.kind, {"cordoned_by_rollout": True, "cordoned_before": False})
            return StepResult.noop("already cordoned by this run")
        # The record goes first: a kill between it and the patch leaves a record of a cordon
        # that may have happened, which resume and rollback can act on; the other order
        # could leave a node cordoned with nothing saying rollout did it.
        ctx.journal.append(CordonedByRollout(node=ctx.node))
        ctx.save_data(self.kind, {"cordoned_by_rollout": True, "cordoned_before": False})
        ctx.kube.set_unschedulable(ctx.node, True)
        if not ctx.kube.get_node(ctx.node).unschedulable:
            raise StepFailed(
                ctx.node,
                self.kind,
                "the node still reads as schedulable after the cordon patch: check for a "
                "controller that uncordons nodes (an autoscaler, another rollout)",
            )
        return StepResult.done("marked unschedulable")

    def undo(self, ctx: StepContext) -> None:
        if ctx.journal.replay().node(ctx.node).cordoned_by_rollout:
            uncordon_node(ctx, self.kind)


def uncordon_node(ctx: StepContext, kind: str) -> None:
    """Mark the node schedulable, verify it, then journal that rollout's cordon is gone."""
    ctx.kube.set_unschedulable(ctx.node, False)
    if ctx.kube.get_node(ctx.node).unschedulable:
        raise StepFailed(
            ctx.node, kind, "the node still reads as unschedulable after the uncordon patch"
        )
    # After the patch: a kill in between leaves the journal saying "cordoned by rollout",
    # and a resume simply uncordons again.
    ctx.journal.append(Uncordoned(node=ctx.node))


@dataclass(frozen=True)
class UncordonStep:
    """Make the node schedulable again, only where rollout cordoned it (invariant 4)."""

    kind: ClassVar[str] = "uncordon"

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        if node_changes(facts, cluster, spec).disruptive and not facts.unschedulable:
            return StepPlan.acting(self.kind, "mark the node schedulable again")
        return StepPlan.skipping(self.kind, "rollout does not cordon this node")

    def apply(self, ctx: StepContext) -> StepResult:
        return report_step(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext) -> StepResult:
        if not ctx.journal.replay().node(ctx.node).cordoned_by_rollout:
            cordon = ctx.load_data(CordonStep.kind)
            if cordon.get("cordoned_before"):
                return StepResult.noop("cordoned by someone else; stays cordoned")
            if cordon.get("cordoned_by_rollout"):
                return StepResult.noop("already uncordoned by this run")
            return StepResult.noop("rollout did not cordon this node")
        uncordon_node(ctx, self.kind)
        ctx.save_data(self.kind, {"uncordoned": True})
        return StepResult.done("marked schedulable again")

    def undo(self, ctx: StepContext) -> None:
        if not ctx.load_data(self.kind).get("uncordoned"):
            return
        if ctx.journal.replay().node(ctx.node).cordoned_by_rollout:
            return  # already cordoned again by an earlier undo
        ctx.journal.append(CordonedByRollout(node=ctx.node))
        ctx.kube.set_unschedulable(ctx.node, True)
        ctx.save_data(self.kind, {"uncordoned": False})


# ---------------------------------------------------------------------------------- drain


def is_pod_gone(original: Pod, current: Pod | None) -> bool:
    """Gone, or replaced: a pod of the same name with another uid is a new pod."""
    return current is None or current.uid != original.uid


@dataclass(frozen=True)
class DrainStep:
    """Evict the node's pods through the Eviction API, as `kubectl drain` would."""

    kind: ClassVar[str] = "drain"

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        if not node_changes(facts, cluster, spec).disruptive:
            return StepPlan.skipping(self.kind, "nothing restarts on this node")
        action, refusal = describe_drain(spec, facts)
        return StepPlan.acting(self.kind, action, tuple(refusal))

    def apply(self, ctx: StepContext) -> StepResult:
        return report_step(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext) -> StepResult:
        policy = ctx.spec.policy.drain
        deadline = Deadline(policy.timeout_s, ctx.sleep)
        pods = ctx.kube.list_pods(None, field_selector=f"spec.nodeName={ctx.node}")
        selection = classify_for_policy([pod_to_drain_json(p) for p in pods], policy)
        if selection.refused:
            raise StepFailed(ctx.node, self.kind, selection.refusal_message())
        by_ref = {(p.namespace, p.name): p for p in pods}
        targets = [by_ref[(r.namespace, r.name)] for r in selection.to_evict]
        staying = f"{len(selection.skipped)} pod(s) stay (DaemonSet, mirror, finished, skipped)"
        if not targets:
            ctx.save_data(self.kind, {"evicted": []})
            return StepResult.noop(f"nothing to evict; {staying}")
        for warning in selection.warnings:
            ctx.progress(f"{ctx.node}: drain: WARNING: {warning}")
        # Pods already terminating are on their way out: wait for them, evict the rest.
        self._evict(ctx, [p for p in targets if not p.deleting], deadline)
        self._wait_until_gone(ctx, targets, deadline)
        names = [f"{p.namespace}/{p.name}" for p in targets]
        ctx.save_data(self.kind, {"evicted": names})
        return StepResult.done(f"evicted {len(names)} pod(s): {', '.join(names)}; {staying}")

    def _evict(self, ctx: StepContext, pods: Sequence[Pod], deadline: Deadline) -> None:
        """Evict every pod; those a budget protects are retried together on the backoff."""
        policy = ctx.spec.policy.drain
        backoff = EvictionBackoff(timeout_s=policy.timeout_s)
        pending = list(pods)
        retry = 0
        while pending:
            refused: list[tuple[Pod, TooManyRequests]] = []
            for pod in pending:
                try:
                    ctx.kube.evict_pod(pod.namespace, pod.name, policy.grace_period_s)
                except TooManyRequests as exc:
                    refused.append((pod, exc))
            if not refused:
                return
            delay_s = backoff.next_delay_s(retry, deadline.elapsed_s)
            if delay_s is None:
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    "\n".join(self._describe_refusal(p, e, deadline) for p, e in refused),
                )
            ctx.progress(
                f"{ctx.node}: drain: {len(refused)} eviction(s) refused, retrying in "
                f"{delay_s:g}s: " + ", ".join(f"{p.namespace}/{p.name}" for p, _ in refused)
            )
            deadline.sleep(delay_s)
            pending = [p for p, _ in refused]
            retry += 1

    @staticmethod
    def _describe_refusal(pod: Pod, error: TooManyRequests, deadline: Deadline) -> str:
        if isinstance(error, EvictionBlocked):
            return format_blocked(pod_to_drain_json(pod), error.pdb, deadline.elapsed_s)
        return (
            f"drain of {pod.node_name} timed out after {round(deadline.elapsed_s)}s: the "
            f"eviction of pod {pod.namespace}/{pod.name} kept being refused: {error}"
        )

    def _wait_until_gone(self, ctx: StepContext, pods: Sequence[Pod], deadline: Deadline) -> None:
        remaining = list(pods)
        while True:
            remaining = [p for p in remaining if not is_pod_gone(p, read_pod(ctx, p))]
            if not remaining:
                return
            if deadline.expired:
                still = [read_pod(ctx, p) or p for p in remaining]
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    f"drain timed out after {round(deadline.elapsed_s)}s: {len(still)} evicted "
                    "pod(s) still on the node (policy.drain.timeout_s, or the pods' "
                    "terminationGracePeriodSeconds):\n  " + "\n  ".join(map(describe_pod, still)),
                )
            deadline.sleep(POLL_INTERVAL_S)

    def undo(self, ctx: StepContext) -> None:
        """Nothing to put back: the pods' controllers reschedule them once the node is open."""


def describe_drain(spec: Spec, node: NodeFacts) -> tuple[str, list[str]]:
    """The drain's action from the node's pods (live facts), and why it would refuse."""
    if not node.pods:
        return "evict pods through the Eviction API", []
    selection = classify_for_policy(node.pods, spec.policy.drain)
    gpus = {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p["spec"].get("gpuRequest", 0)
        for p in node.pods
    }
    names = [
        f"{p.namespace}/{p.name}"
        + (f" ({gpus[(p.namespace, p.name)]} GPU)" if gpus.get((p.namespace, p.name)) else "")
        for p in selection.to_evict
    ]
    shown = ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")
    if selection.refused:
        blocked = len(selection.blocking)
        return f"would refuse: {blocked} pod(s) block the drain (see the warning)", [
            selection.refusal_message()
        ]
    if not names:
        return "nothing to evict now (checked again at apply time)", []
    return f"evict {len(names)} pod(s) through the Eviction API: {shown}", []


def current_replicas(node: NodeFacts) -> int:
    """The replicas the node's device plugin runs now (its gpu.replicas label, else 1)."""
    text = node.labels.get("nvidia.com/gpu.replicas", "1")
    return int(text) if text.isdigit() and int(text) > 0 else 1


def read_pod(ctx: StepContext, pod: Pod) -> Pod | None:
    try:
        return ctx.kube.get_pod(pod.namespace, pod.name)
    except NotFound:
        return None


# ------------------------------------------------------------------------------- gpu.wait


@dataclass(frozen=True)
class GpuExpectation:
    """What the node must advertise: `count` of `resource` (0: the node has no GPUs)."""

    resource: str
    count: int
    physical: int
    replicas: int

    def describe(self) -> str:
        if self.replicas == 1:
            return f"{self.resource} = {self.count}"
        return f"{self.resource} = {self.count} ({self.physical} GPUs x {self.replicas} replicas)"


def expect_gpus(spec: Spec, facts: NodeFacts) -> GpuExpectation:
    """Physical GPUs (facts) x replicas: the spec's time-slicing change, else the node's label.

    The resource name follows renameByDefault, which moves shared GPUs to
    nvidia.com/gpu.shared. Both gpu.wait's plan and its apply read this one rule.
    """
    change = time_slicing_change(spec)
    if change is not None:
        replicas = change.replicas_for(GPU_RESOURCE)
        renamed = change.config.sharing.time_slicing.rename_by_default and replicas > 1
    else:
        replicas, renamed = current_replicas(facts), False
    return GpuExpectation(
        resource=SHARED_GPU_RESOURCE if renamed else GPU_RESOURCE,
        count=facts.gpus.count * replicas,
        physical=facts.gpus.count,
        replicas=replicas,
    )


def advertised_count(values: Mapping[str, str], resource: str) -> int | None:
    """A node's capacity or allocatable of `resource` as an integer; None when absent."""
    text = values.get(resource)
    return int(text) if text is not None and text.isdigit() else None


def gpus_match(node: Node, expected: GpuExpectation) -> bool:
    """Allocatable and capacity both at the expected count (absent counts as 0)."""
    allocatable = advertised_count(node.allocatable, expected.resource) or 0
    capacity = advertised_count(node.capacity, expected.resource) or 0
    return allocatable == expected.count and capacity == expected.count


@dataclass(frozen=True)
class GpuWaitStep:
    """Wait until the node advertises its GPUs again: allocatable = GPUs x replicas."""

    kind: ClassVar[str] = "gpu.wait"

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        if not node_changes(facts, cluster, spec).touches_node:
            return StepPlan.skipping(self.kind, "nothing changed on this node")
        expected = expect_gpus(spec, facts)
        return StepPlan.acting(
            self.kind, f"wait for allocatable {expected.resource} = {expected.count}"
        )

    def apply(self, ctx: StepContext) -> StepResult:
        return report_step(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext) -> StepResult:
        expected = expect_gpus(ctx.spec, ctx.facts)
        deadline = Deadline(ctx.spec.policy.verify.gpu_wait_timeout_s, ctx.sleep)
        while True:
            node = ctx.kube.get_node(ctx.node)
            # Allocatable alone can still show the old count for a moment after a restart,
            # before the kubelet notices the plugin went away; a plugin pod that is not
            # ready means it has not (re)registered yet.
            plugins = find_device_plugin_pods(ctx) if expected.count else []
            plugins_ready = all(p.ready and not p.deleting for p in plugins)
            if gpus_match(node, expected) and plugins_ready:
                if expected.count == 0:
                    return StepResult.done("the node has no GPUs (facts) and advertises none")
                return StepResult.done(
                    f"allocatable {expected.describe()} after {round(deadline.elapsed_s)}s"
                )
            if deadline.expired:
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    describe_gpu_shortfall(node, expected, plugins, deadline.elapsed_s),
                )
            deadline.sleep(POLL_INTERVAL_S)

    def undo(self, ctx: StepContext) -> None:
        """A check changes nothing."""


def describe_gpu_shortfall(
    node: Node, expected: GpuExpectation, plugins: Sequence[Pod], waited_s: float
) -> str:
    """Why the wait failed: capacity vs allocatable, and the device plugin's own state."""
    allocatable = advertised_count(node.allocatable, expected.resource)
    capacity = advertised_count(node.capacity, expected.resource)
    lines = [
        f"expected {expected.describe()} within {round(waited_s)}s; the node reports "
        f"capacity {_count_text(capacity)}, allocatable {_count_text(allocatable)}"
    ]
    if capacity and not allocatable:
        lines.append(
            "capacity without allocatable: the kubelet lost the device plugin (devices "
            "unhealthy); check the plugin pod and containerd's `nvidia` runtime handler"
        )
    elif capacity is None and expected.count:
        lines.append("no GPU resource at all: the device plugin never registered on this node")
    elif capacity is not None and capacity != expected.count:
        lines.append(
            "the device plugin advertises another count: check the node's "
            "nvidia.com/device-plugin.config label and the profile it selects"
        )
    if plugins:
        lines.extend(f"device plugin {describe_pod(p)}" for p in plugins)
    else:
        lines.append(f"no device-plugin pod ({DEVICE_PLUGIN_SELECTOR}) on the node")
    return "\n  ".join(lines)


def _count_text(count: int | None) -> str:
    return "absent" if count is None else str(count)


# ------------------------------------------------------------------------------ gpu.smoke


@dataclass(frozen=True)
class SmokeVerdict:
    """What a smoke pod's `nvidia-smi -L` showed, and what is wrong with it (if anything)."""

    uuids: tuple[str, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


def parse_gpu_uuids(log: str) -> tuple[str, ...]:
    """Every GPU-/MIG- UUID token in `nvidia-smi -L` output, in order, without repeats.

    Tokens, not columns: the line format is not guaranteed stable (FACTS.md).
    """
    return tuple(dict.fromkeys(m.group(0) for m in _UUID_TOKEN.finditer(log)))


def judge_smoke_log(log: str, node_uuids: Iterable[str]) -> SmokeVerdict:
    """At least one GPU listed, and every GPU UUID printed is one of the node's own.

    A MIG device of the old form (MIG-GPU-<uuid>/gi/ci) names its GPU and is checked by it;
    a new-form MIG UUID cannot be tied to a GPU from the facts and is accepted.
    """
    uuids = parse_gpu_uuids(log)
    known = {u.upper() for u in node_uuids}
    problems: list[str] = []
    if not uuids:
        problems.append("nvidia-smi -L listed no GPU")
    elif known:
        for token in uuids:
            embedded = _EMBEDDED_GPU.match(token)
            gpu = embedded.group(1) if embedded else token
            if gpu.startswith("GPU-") and gpu.upper() not in known:
                problems.append(
                    f"{token} is not one of the node's GPUs ({', '.join(sorted(known))})"
                )
    return SmokeVerdict(uuids, tuple(problems))


def smoke_pod_name(node: str, run_id: str) -> str:
    """rollout-smoke-<node>-<6 hex of the run id>: the same on every attempt of one run."""
    short = hashlib.sha256(run_id.encode()).hexdigest()[:6]
    return f"rollout-smoke-{node}-{short}"[:253]


def smoke_pod_manifest(
    name: str, node: str, run_id: str, image: str, resource: str = GPU_RESOURCE
) -> dict[str, Any]:
    """A one-GPU pod that must land on `node`, through the scheduler.

    Node affinity on metadata.name rather than spec.nodeName: nodeName skips the scheduler,
    so the pod would not prove the node has a free GPU to give. The node is still cordoned
    here, so the pod tolerates the unschedulable taint, as DaemonSet pods do.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "rollout"},
            "annotations": {RUN_ANNOTATION: run_id},
        },
        "spec": {
            "restartPolicy": "Never",
            "runtimeClassName": SMOKE_RUNTIME_CLASS,
            "terminationGracePeriodSeconds": 0,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "In", "values": [node]}
                                ]
                            }
                        ]
                    }
                }
            },
            "tolerations": [
                {"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"},
                # GPU nodes are often tainted so only GPU pods land there.
                {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
            ],
            "containers": [
                {
                    "name": SMOKE_CONTAINER,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["nvidia-smi", "-L"],
                    # Strings: the client validates quantities as strings.
                    "resources": {"limits": {resource: "1"}},
                }
            ],
        },
    }


def tail_lines(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


@dataclass(frozen=True)
class GpuSmokeStep:
    """Run `nvidia-smi -L` in a one-GPU pod on the node; the node's GPUs must show up."""

    kind: ClassVar[str] = "gpu.smoke"

    def plan(self, facts: NodeFacts, cluster: ClusterFacts, spec: Spec) -> StepPlan:
        if not node_changes(facts, cluster, spec).touches_node:
            return StepPlan.skipping(self.kind, "nothing changed on this node")
        return StepPlan.acting(self.kind, "run nvidia-smi -L in a one-GPU pod pinned to the node")

    def apply(self, ctx: StepContext) -> StepResult:
        return report_step(ctx, self.kind, self._apply)

    def _apply(self, ctx: StepContext) -> StepResult:
        verify = ctx.spec.policy.verify
        expected = expect_gpus(ctx.spec, ctx.facts)
        name = smoke_pod_name(ctx.node, ctx.run_id)
        where = f"{SMOKE_NAMESPACE}/{name}"
        deadline = Deadline(verify.smoke_timeout_s, ctx.sleep)
        # A pod left by a killed attempt of this run would make the create a Conflict.
        self._remove_pod(ctx, name, deadline)
        try:
            ctx.kube.create_pod(
                SMOKE_NAMESPACE,
                smoke_pod_manifest(
                    name, ctx.node, ctx.run_id, verify.smoke_image, expected.resource
                ),
            )
            pod = self._wait_until_finished(ctx, name, deadline)
            log = self._read_log(ctx, name)
            if pod.phase != "Succeeded":
                raise StepFailed(ctx.node, self.kind, self._describe_failure(pod, log, deadline))
            verdict = judge_smoke_log(log, ctx.facts.gpus.uuids)
            if not verdict.ok:
                raise StepFailed(
                    ctx.node,
                    self.kind,
                    f"pod {where} ran, but: "
                    + "; ".join(verdict.problems)
                    + f"\n  log:\n{_indent(tail_lines(log))}",
                )
        finally:
            try:
                ctx.kube.delete_pod(SMOKE_NAMESPACE, name, grace_period_s=0, missing_ok=True)
            except KubeError as exc:
                ctx.progress(f"{ctx.node}: gpu.smoke: could not delete pod {where}: {exc}")
        checked = "" if ctx.facts.gpus.uuids else " (facts hold no UUIDs to check them against)"
        return StepResult.done(
            f"nvidia-smi -L in pod {where} listed {', '.join(verdict.uuids)}{checked}"
        )

    @staticmethod
    def _wait_until_finished(ctx: StepContext, name: str, deadline: Deadline) -> Pod:
        while True:
            pod = ctx.kube.get_pod(SMOKE_NAMESPACE, name)
            if pod.phase in ("Succeeded", "Failed") or deadline.expired:
                return pod
            deadline.sleep(POLL_INTERVAL_S)

    @staticmethod
    def _read_log(ctx: StepContext, name: str) -> str:
        try:
            return ctx.kube.read_pod_log(SMOKE_NAMESPACE, name, SMOKE_CONTAINER)
        except KubeError as exc:
            # A pod that never started has no log; the failure message says so instead.
            return f"(no log: {exc})"

    @staticmethod
    def _describe_failure(pod: Pod, log: str, deadline: Deadline) -> str:
        if pod.phase in ("Pending", "Running", "Unknown"):
            head = (
                f"not finished after {round(deadline.elapsed_s)}s (policy.verify.smoke_timeout_s)"
            )
        else:
            head = "failed"
        hint = ""
        if pod.phase == "Pending" and not pod.node_name:
            hint = (
                "\n  not scheduled: the node has no free GPU to give, or does not match "
                "(kubectl describe pod shows the scheduler's reason)"
            )
        elif "ContainerCreating" in pod.container_reasons:
            hint = "\n  stuck creating: check containerd's `nvidia` runtime handler on the node"
        return f"smoke {describe_pod(pod)}: {head}{hint}\n  log:\n{_indent(tail_lines(log))}"

    @staticmethod
    def _remove_pod(ctx: StepContext, name: str, deadline: Deadline) -> None:
        if not ctx.kube.delete_pod(SMOKE_NAMESPACE, name, grace_period_s=0, missing_ok=True):
            return
        while not deadline.expired:
            try:
                ctx.kube.get_pod(SMOKE_NAMESPACE, name)
            except NotFound:
                return
            deadline.sleep(POLL_INTERVAL_S)

    def undo(self, ctx: StepContext) -> None:
        """Remove the smoke pod should a killed run have left it behind."""
        ctx.kube.delete_pod(
            SMOKE_NAMESPACE, smoke_pod_name(ctx.node, ctx.run_id), grace_period_s=0, missing_ok=True
        )


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in (text.splitlines() or [""]))
