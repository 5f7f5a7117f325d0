"""gpu.smoke: run `nvidia-smi -L` in a one-GPU pod on the node; the node's GPUs must show up,
and the driver the pod reports (`nvidia-smi --query-gpu=driver_version`) must be the plan's
target when the plan upgrades the driver."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from rollout.facts import NodeFacts
from rollout.facts.gpu_operator import OPERATOR_RUNTIME_CLASS
from rollout.facts.migmode import MigMode
from rollout.facts.pods import GPU_RESOURCE
from rollout.inputs.fieldproblems import shorten
from rollout.operatornames import MIG_RESOURCE_PREFIX
from rollout.plan import NodePlan, StepPlan
from rollout.rbac import grants_of
from rollout.spec import Spec
from rollout.steps.base import StepContext, StepFailed, StepResult
from rollout.steps.deadline import POLL_INTERVAL_S, Deadline
from rollout.steps.gpu_wait import expect_gpus, forecast_expectations, kept_mig_mode
from rollout.steps.nodechanges import Reach, ReachingStep
from rollout.steps.nodemarks import RUN_ANNOTATION, MarkingStep
from rollout.steps.pods import describe_pod
from rollout.steps.traits import StepTraits
from rollout.transports.errors import KubeError, NotFound
from rollout.transports.kube import Event, Pod
from rollout.transports.kube.objects import LABEL_MANAGED_BY

UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
SMOKE_NAMESPACE = "default"
SMOKE_CONTAINER = "smoke"
LOG_TAIL_LINES = 20
# A failed smoke pod's Warning events quoted, latest first: how many, each cut to how long.
WARNINGS_SHOWN = 3
WARNING_CHARS = 300
# containerd's words (1.6 to 2.1) when the sandbox's runtime handler is not configured
_NO_HANDLER = re.compile(r'no runtime for "(?P<handler>[^"]*)" is configured')
# nvidia-smi -L prints GPU-<uuid>, MIG-<uuid>, or on older drivers MIG-GPU-<uuid>/<gi>/<ci>;
# the alternation tries the MIG forms first so a GPU- inside a MIG token is not matched alone.
_UUID_TOKEN = re.compile(
    r"MIG-GPU-[0-9a-fA-F-]+/\d+/\d+|MIG-[0-9a-fA-F][0-9a-fA-F-]*|GPU-[0-9a-fA-F][0-9a-fA-F-]*"
)
_EMBEDDED_GPU = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/\d+/\d+$")
# --query-gpu=driver_version --format=csv,noheader: one version per visible GPU
_DRIVER_LINE = re.compile(r"^\s*(\d{3}\.\d{1,3}(?:\.\d{1,3})?)\s*$")
SMOKE_SCRIPT = "nvidia-smi -L && nvidia-smi --query-gpu=driver_version --format=csv,noheader"


@dataclass(frozen=True)
class SmokeVerdict:
    """What a smoke pod's `nvidia-smi -L` showed, and what is wrong with it (if anything)."""

    uuids: tuple[str, ...]
    problems: tuple[str, ...]
    drivers: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems


def parse_gpu_uuids(log: str) -> tuple[str, ...]:
    """Every GPU-/MIG- UUID token in `nvidia-smi -L` output, in order, without repeats.

    Tokens, not columns: the line format is not guaranteed stable (FACTS.md).
    """
    return tuple(dict.fromkeys(m.group(0) for m in _UUID_TOKEN.finditer(log)))


def parse_driver_versions(log: str) -> tuple[str, ...]:
    """The driver versions `--query-gpu=driver_version` printed, without repeats."""
    found = (_DRIVER_LINE.match(line) for line in log.splitlines())
    return tuple(dict.fromkeys(m.group(1) for m in found if m))


def judge_smoke_log(
    log: str, node_uuids: Iterable[str], target_driver: str | None = None
) -> SmokeVerdict:
    """At least one GPU listed, every GPU UUID printed one of the node's own, and the driver
    the pod sees the target one (when the plan upgrades it).

    A MIG device of the old form (MIG-GPU-<uuid>/gi/ci) names its GPU and is checked by it;
    a new-form MIG UUID cannot be tied to a GPU from the facts and is accepted.
    """
    uuids = parse_gpu_uuids(log)
    drivers = parse_driver_versions(log)
    known = {u.upper() for u in node_uuids}
    problems: list[str] = []
    if target_driver is not None and drivers != (target_driver,):
        problems.append(
            f"the pod sees driver {', '.join(drivers) or '(none reported)'}, not {target_driver}"
        )
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
    return SmokeVerdict(uuids, tuple(problems), drivers)


# What run_pod_once asks of the API: the pod, its log, and its Warning events (quoted when
# it fails). The smoke pod's step and the DCGM gate's both ask for them.
POD_RUN_GRANTS = (
    *grants_of("", "pods", "create get delete", SMOKE_NAMESPACE),
    *grants_of("", "pods/log", "get", SMOKE_NAMESPACE),
    *grants_of("", "events", "list", SMOKE_NAMESPACE),
)


def smoke_pod_name(node: str, run_id: str, prefix: str = "rollout-smoke") -> str:
    """<prefix>-<node>-<6 hex of the run id>: the same on every attempt of one run."""
    short = hashlib.sha256(run_id.encode()).hexdigest()[:6]
    return f"{prefix}-{node}-{short}"[:253]


def smoke_pod_manifest(
    name: str,
    node: str,
    run_id: str,
    image: str,
    resource: str = GPU_RESOURCE,
    *,
    command: tuple[str, ...] = ("sh", "-c", SMOKE_SCRIPT),
    gpus: int = 1,
    container: str = SMOKE_CONTAINER,
) -> dict[str, Any]:
    """A pod of `gpus` GPUs running `command` that must land on `node`, through the scheduler.

    Node affinity on metadata.name rather than spec.nodeName: nodeName skips the scheduler,
    so the pod would not prove the node has a free GPU to give. The node is still cordoned
    here, so the pod tolerates the unschedulable taint, as DaemonSet pods do.
    """
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {LABEL_MANAGED_BY: "rollout"},
            "annotations": {RUN_ANNOTATION: run_id},
        },
        "spec": {
            "restartPolicy": "Never",
            "runtimeClassName": OPERATOR_RUNTIME_CLASS,
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
                    "name": container,
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": list(command),
                    # Strings: the client validates quantities as strings.
                    "resources": {"limits": {resource: str(gpus)}},
                }
            ],
        },
    }


def tail_lines(text: str, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


@dataclass(frozen=True)
class GpuSmokeStep(ReachingStep, MarkingStep):
    """Run `nvidia-smi -L` in a one-GPU pod on the node; the node's GPUs must show up."""

    kind: ClassVar[str] = "gpu.smoke"
    # the pod is scheduled, pulls its image and runs
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=False,
        grants=POD_RUN_GRANTS,
        expected_s=20.0,
        worst_s=lambda policy: float(policy.verify.smoke_timeout_s),
    )
    reach: ClassVar[Reach] = Reach.NODE

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        target = _target_driver(spec)
        driver = f"; the pod must see driver {target}" if target is not None else ""
        return StepPlan.acting(
            self.kind, f"run nvidia-smi -L in a one-GPU pod pinned to the node{driver}"
        )

    def _apply(self, ctx: StepContext) -> StepResult:
        verify = ctx.spec.policy.verify
        resource = smoke_resource(ctx)
        name = smoke_pod_name(ctx.node, ctx.run_id)
        where = f"{SMOKE_NAMESPACE}/{name}"
        deadline = ctx.deadline(verify.smoke_timeout_s)
        manifest = smoke_pod_manifest(name, ctx.node, ctx.run_id, verify.smoke_image, resource)
        pod, log = run_pod_once(ctx, self.kind, manifest, deadline)
        if pod.phase != "Succeeded":
            warnings = read_pod_warnings(ctx, pod)
            raise StepFailed(
                ctx.node, self.kind, describe_smoke_failure(pod, log, warnings, deadline)
            )
        verdict = judge_smoke_log(log or "", ctx.facts.gpus.uuids, _target_driver(ctx.spec))
        if wants_mig_device(resource, ctx.facts, ctx.node_plan) and not any(
            u.startswith("MIG-") for u in verdict.uuids
        ):
            verdict = replace(verdict, problems=(*verdict.problems, f"{resource}: no MIG- UUID"))
        if not verdict.ok:
            raise StepFailed(
                ctx.node,
                self.kind,
                f"pod {where} ran, but: "
                + "; ".join(verdict.problems)
                + f"\n  log:\n{_indent(tail_lines(log or ''))}",
            )
        checked = "" if ctx.facts.gpus.uuids else " (facts hold no UUIDs to check them against)"
        driver = f"; driver {', '.join(verdict.drivers)}" if verdict.drivers else ""
        return StepResult.done(
            f"nvidia-smi -L in pod {where} (one {resource}) listed {', '.join(verdict.uuids)}"
            f"{checked}{driver}"
        )

    def undo(self, ctx: StepContext) -> None:
        """Remove the smoke pod should a killed run have left it behind."""
        ctx.kube.delete_pod(
            SMOKE_NAMESPACE, smoke_pod_name(ctx.node, ctx.run_id), grace_period_s=0, missing_ok=True
        )


def smoke_resource(ctx: StepContext) -> str:
    """The resource the smoke pod asks one device of: expect_gpus' rule, or where the plan's
    capacity forecast promises other resources (a MIG layout), one of those, a MIG device's
    first."""
    expected = expect_gpus(ctx.spec, ctx.facts)
    forecast = forecast_expectations(ctx.node_plan, ctx.facts, expected)
    if forecast is None:
        return expected.resource
    names = [e.resource for e in forecast]
    return next((n for n in names if n.startswith(MIG_RESOURCE_PREFIX)), names[0])


def wants_mig_device(resource: str, facts: NodeFacts, node_plan: NodePlan) -> bool:
    """Whether the smoke pod's device must show as a MIG- UUID: a nvidia.com/mig-* resource
    (the mixed strategy), or nvidia.com/gpu on a node in MIG mode under the single strategy
    (GFD's labels in `facts`) whose devices the plan leaves as they are. A plan that moves
    them (a MIG layout put back to whole GPUs) makes the node's labels before it no guide."""
    if resource.startswith(MIG_RESOURCE_PREFIX):
        return True
    return kept_mig_mode(facts, node_plan.capacity.resources) is MigMode.SINGLE


def run_pod_once(
    ctx: StepContext, step: str, manifest: dict[str, Any], deadline: Deadline
) -> tuple[Pod, str | None]:
    """Run a pod of `manifest` in SMOKE_NAMESPACE until it finished or the deadline passed:
    the pod as it ended and its container's log (None where it never started). A pod of the
    same name left by a killed attempt goes first; the pod is deleted after, in any case."""
    name = str(manifest["metadata"]["name"])
    container = str(manifest["spec"]["containers"][0]["name"])
    # A pod left by a killed attempt of this run would make the create a Conflict.
    _remove_pod(ctx, name, deadline)
    try:
        ctx.kube.create_pod(SMOKE_NAMESPACE, manifest)
        pod = _wait_until_finished(ctx, name, deadline)
        try:
            log: str | None = ctx.kube.read_pod_log(SMOKE_NAMESPACE, name, container)
        except KubeError:
            log = None
        return pod, log
    finally:
        try:
            ctx.kube.delete_pod(SMOKE_NAMESPACE, name, grace_period_s=0, missing_ok=True)
        except KubeError as exc:
            ctx.progress(
                f"{ctx.node}: {step}: could not delete pod {SMOKE_NAMESPACE}/{name}: {exc}"
            )


def _wait_until_finished(ctx: StepContext, name: str, deadline: Deadline) -> Pod:
    while True:
        pod = ctx.kube.get_pod(SMOKE_NAMESPACE, name)
        if pod.phase in ("Succeeded", "Failed") or deadline.expired:
            return pod
        deadline.sleep(POLL_INTERVAL_S)


def _remove_pod(ctx: StepContext, name: str, deadline: Deadline) -> None:
    if not ctx.kube.delete_pod(SMOKE_NAMESPACE, name, grace_period_s=0, missing_ok=True):
        return
    while not deadline.expired:
        try:
            ctx.kube.get_pod(SMOKE_NAMESPACE, name)
        except NotFound:
            return
        deadline.sleep(POLL_INTERVAL_S)


def read_pod_warnings(ctx: StepContext, pod: Pod) -> tuple[Event, ...] | str:
    """The pod's Warning events, latest first, at most WARNINGS_SHOWN; why not, where they
    cannot be read."""
    selector = f"involvedObject.kind=Pod,involvedObject.name={pod.name}"
    if pod.uid:  # not those of an earlier pod of the same name (a killed attempt's)
        selector += f",involvedObject.uid={pod.uid}"
    try:
        events = ctx.kube.list_events(pod.namespace, field_selector=selector)
    except KubeError as exc:
        return f"its events could not be read: {shorten(str(exc), WARNING_CHARS)}"
    warnings = [e for e in reversed(events) if e.event_type == "Warning"]
    return tuple(warnings[:WARNINGS_SHOWN])


def describe_smoke_failure(
    pod: Pod, log: str | None, warnings: tuple[Event, ...] | str, deadline: Deadline
) -> str:
    """Why the smoke pod did not succeed: its state, its Warning events (what the kubelet and
    the scheduler said), a hint only where they point to one, and its log if it ran."""
    if pod.phase in ("Pending", "Running", "Unknown"):
        head = f"not finished after {round(deadline.elapsed_s)}s (policy.verify.smoke_timeout_s)"
    else:
        head = "failed"
    lines = [f"smoke {describe_pod(pod)}: {head}"]
    lines += [f"  {shorten(message, WARNING_CHARS)}" for message in pod.container_messages]
    if isinstance(warnings, str):
        lines.append(f"  {warnings}")
    elif warnings:
        lines.append("  warning events, latest first:")
        lines += [f"    {shorten(e.describe(), WARNING_CHARS)}" for e in warnings]
    hint = _smoke_hint(pod, warnings)
    if hint:
        lines.append(f"  {hint}")
    if log is not None:
        lines.append(f"  log:\n{_indent(tail_lines(log))}")
    elif pod.phase != "Pending":
        lines.append("  log: none could be read")
    return "\n".join(lines)


def _smoke_hint(pod: Pod, warnings: tuple[Event, ...] | str) -> str:
    """What to check next, where the evidence points to it; empty where the events say it."""
    events = () if isinstance(warnings, str) else warnings
    for event in events:
        missing = _NO_HANDLER.search(event.message)
        if missing:
            handler = missing.group("handler")
            return (
                f"containerd on the node has no `{handler}` runtime handler (the pod's "
                f"RuntimeClass names it): check what containerd loads (rollout diagnose)"
            )
    if pod.phase == "Pending" and not pod.node_name:
        said = "" if events else " (kubectl describe pod shows the scheduler's reason)"
        return f"not scheduled: the node has no free GPU to give, or does not match{said}"
    if "ContainerCreating" in pod.container_reasons and not events:
        return "stuck creating, and no Warning event says why (kubectl describe pod)"
    return ""


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in (text.splitlines() or [""]))


def _target_driver(spec: Spec) -> str | None:
    """The driver version the plan moves the node to, if it does."""
    return spec.driver_version()
