"""gates.baseline and gates: the health gates a node passes before it returns to service.

`gates.baseline` (prepare, before anything changes) records where the node's kernel clock
stood; `gates` (verify, last before uncordon) reads the node once more and fails it unless
every gate of `policy.verify.gates` passes (docs/gates.md says what each reads and why):
- resources: every GPU resource the node must advertise is there with allocatable equal to
  capacity (a device the plugin marked unhealthy shows as capacity > allocatable);
- xid: no Xid in the kernel log since `gates.baseline` (rollout/gates/kernel.py);
- validator: the GPU Operator's validator pod on the node is Ready, where one is scheduled;
- dcgm (only when the plan asks): `dcgmi diag -r LEVEL -j` in a pod holding all the node's
  GPUs passes every test (rollout/gates/dcgm.py); read by the gates step only, never in the
  soak between waves (the node is back in service then, its GPUs may be in use).

A failed gate is a `GateFailed`: the executor leaves the node cordoned (never rolled back:
the evidence is about the node's GPUs, which a rollback does not heal), with the evidence in
the `rollout.dev/left-cordoned` annotation and a Warning Event. A node no step cordoned (a
time-slicing change) is cordoned here first, journalled as rollout's cordon.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from rollout.changes.base import PlanningContext
from rollout.commands import check
from rollout.facts import NodeFacts
from rollout.facts.migmode import MigMode, read_mig_mode
from rollout.facts.pods import GPU_RESOURCE, SHARED_GPU_RESOURCE
from rollout.gates.dcgm import (
    DcgmReadingError,
    dcgm_command,
    describe_mig_skip,
    parse_dcgm_output,
)
from rollout.gates.kernel import (
    BASELINE_SCRIPT,
    XID_SCRIPT,
    KernelClock,
    KernelReadingError,
    parse_clock,
    parse_xid_reading,
)
from rollout.plan import StepPlan
from rollout.rbac import grants_of
from rollout.run import CordonedByRollout
from rollout.spec import Policy, Spec
from rollout.spec.gates import DcgmGate
from rollout.steps.base import StepContext, StepFailed, StepResult, translate_step_errors
from rollout.steps.gpu_smoke import (
    POD_RUN_GRANTS,
    read_pod_warnings,
    run_pod_once,
    smoke_pod_manifest,
    smoke_pod_name,
    tail_lines,
)
from rollout.steps.gpu_wait import (
    VALIDATOR_DEPLOY_LABEL,
    GpuExpectation,
    advertised_count,
    describe_validator_shortfall,
    expect_gpus,
    find_validator_pods,
    forecast_expectations,
    kept_mig_mode,
    planned_expectations,
    planned_forecast,
    validator_ready,
    wants_validator,
)
from rollout.steps.nodechanges import Reach, ReachingStep
from rollout.steps.nodemarks import MarkingStep
from rollout.steps.pods import describe_pod
from rollout.steps.traits import StepTraits, bounded_by_requests
from rollout.transports.kube import Node

GPU_RESOURCE_PREFIX = "nvidia.com/"
BASELINE_STEP = "gates.baseline"
DCGM_POD_PREFIX = "rollout-dcgm"
DCGM_CONTAINER = "dcgm"
DCGM_LOG_LINES = 30


class GateFailed(StepFailed):
    """A health gate did not pass: the node stays cordoned with this evidence."""

    leaves_node_cordoned: ClassVar[bool] = True


def gates_worst_s(policy: Policy) -> float:
    """The gates' worst duration: the requests' bound, and the DCGM level's timeout when on."""
    dcgm = policy.verify.gates.dcgm
    return bounded_by_requests(policy) + (dcgm.timeout_s if dcgm is not None else 0.0)


# How often a rolled-back node's gates are read again while it settles.
ROLLBACK_GATE_POLL_S = 5.0


def gate_names(
    spec: Spec,
    facts: NodeFacts,
    promised: tuple[GpuExpectation, ...] | None = None,
    mig: MigMode = MigMode.OFF,
) -> list[str]:
    """What `rollout plan` lists: each gate the node will pass, in the order they are read
    (the resources the forecast promises, where it says more than expect_gpus; DCGM's
    diagnostics skipped by name on a node the plan leaves in MIG mode, `mig`)."""
    gates = spec.policy.verify.gates
    expected = expect_gpus(spec, facts)
    names = []
    if gates.resources and promised is not None:
        counts = ", ".join(e.describe() for e in promised)
        names.append(f"resources whole ({counts}, allocatable = capacity)")
    elif gates.resources and expected.count:
        names.append(f"resources whole ({expected.describe()}, allocatable = capacity)")
    if gates.xid:
        names.append("no new Xid in the kernel log since the change began")
    if gates.validator and expected.count and wants_validator_label(facts):
        names.append("GPU Operator validator Ready")
    if gates.dcgm is not None and expected.count and mig is not MigMode.OFF:
        names.append(describe_mig_skip(mig.value))
    elif gates.dcgm is not None and expected.count:
        names.append(
            f"DCGM diagnostics level {gates.dcgm.level} pass on all {expected.resource} "
            f"(dcgmi diag -r {gates.dcgm.level}, {gates.dcgm.image}; "
            f"timeout {gates.dcgm.timeout_s}s for level {gates.dcgm.level})"
        )
    return names


def wants_validator_label(facts: NodeFacts) -> bool:
    return facts.labels.get(VALIDATOR_DEPLOY_LABEL) == "true"


@dataclass(frozen=True)
class GatesBaselineStep(ReachingStep):
    """Record the node's kernel clock before its change: the Xid gate's "since"."""

    kind: ClassVar[str] = BASELINE_STEP
    # a read of the kernel clock over SSH
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(),
        expected_s=1.0,
        worst_s=bounded_by_requests,
    )
    reach: ClassVar[Reach] = Reach.NODE

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        if not spec.policy.verify.gates.xid:
            return StepPlan.skipping(self.kind, "the xid gate is off")
        return StepPlan.acting(self.kind, "record the node's kernel clock (boot id, uptime)")

    def apply(self, ctx: StepContext) -> StepResult:
        if KernelClock.from_data(ctx.load_data(self.kind)) is not None:
            return StepResult.noop("recorded when the change began")  # a resumed run
        with translate_step_errors(ctx.node, self.kind):
            text = check(ctx.runner.run(["sh", "-c", BASELINE_SCRIPT])).stdout
        try:
            clock = parse_clock(text.splitlines())
        except KernelReadingError as exc:
            raise StepFailed(ctx.node, self.kind, str(exc)) from exc
        ctx.save_data(self.kind, clock.to_data())
        return StepResult.done(f"boot {clock.boot_id}, {clock.uptime_s:.0f}s since boot")

    def undo(self, ctx: StepContext) -> None:
        """A reading changes nothing."""


@dataclass(frozen=True)
class GatesStep(ReachingStep, MarkingStep):
    """Read every health gate once; fail the node, left cordoned, unless all pass."""

    kind: ClassVar[str] = "gates"
    # the kernel log over SSH; the node's resources, its validator pods, and a cordon when a
    # gate fails; the DCGM gate's pod, where the plan asks for it (as gpu.smoke's)
    traits: ClassVar[StepTraits] = StepTraits(
        cluster_wide=False,
        takes_down=False,
        uses_ssh=True,
        grants=(
            *grants_of("", "nodes", "get patch"),
            *grants_of("", "pods", "list"),
            *POD_RUN_GRANTS,
        ),
        expected_s=2.0,
        worst_s=gates_worst_s,
    )
    reach: ClassVar[Reach] = Reach.NODE

    def plan(self, ctx: PlanningContext, facts: NodeFacts) -> StepPlan:
        planned = super().plan(ctx, facts)
        forecast = planned_forecast(ctx, facts)
        promised = planned_expectations(ctx, facts, forecast) if planned.changes else None
        if promised is None:
            return planned
        mig = kept_mig_mode(facts, forecast)
        names = gate_names(ctx.spec, facts, promised, mig)
        return StepPlan.acting(self.kind, "health gates: " + "; ".join(names))

    def plan_change(self, facts: NodeFacts, spec: Spec) -> StepPlan:
        names = gate_names(spec, facts)
        if not names:
            return StepPlan.skipping(self.kind, "every health gate is off or has nothing to read")
        return StepPlan.acting(self.kind, "health gates: " + "; ".join(names))

    def _apply(self, ctx: StepContext) -> StepResult:
        problems, passed = read_gates(ctx, diagnostics=True)
        if problems:
            raise GateFailed(ctx.node, self.kind, problems)
        return StepResult.done("passed: " + ", ".join(passed) if passed else "no gate to read")

    def undo(self, ctx: StepContext) -> None:
        """A check changes nothing."""


def read_gates(
    ctx: StepContext, *, diagnostics: bool = False, rolled_back: bool = False
) -> tuple[str, list[str]]:
    """Read every gate of the plan once: (what failed, "" when all passed; the gates passed).
    DCGM's diagnostics run only with `diagnostics`, and only once every other gate passed.
    A node that fails one is cordoned (where it is not) for its evidence to be read."""
    gates = ctx.spec.policy.verify.gates
    node = ctx.kube.get_node(ctx.node)
    passed: list[str] = []
    failed: list[str] = []
    if gates.resources:
        _record(check_resources(ctx, node, rolled_back), "resources whole", passed, failed)
    if gates.xid:
        _record(check_xids(ctx), "no new Xid", passed, failed)
    if gates.validator and wants_validator(node) and expect_gpus(ctx.spec, ctx.facts).count:
        validators = find_validator_pods(ctx)
        ready = validator_ready(validators)
        problem = None if ready else describe_validator_shortfall(validators, 0)
        _record(problem, "validator Ready", passed, failed)
    if (
        diagnostics
        and gates.dcgm is not None
        and not failed
        and expect_gpus(ctx.spec, ctx.facts).count
    ):
        # the node as it is now: a MIG layout the plan applied counts, one it removed not
        mig = read_mig_mode(node.labels, node.allocatable)
        if mig is not MigMode.OFF:
            passed.append(describe_mig_skip(mig.value))
        else:
            problem, summary = check_dcgm(ctx, node, gates.dcgm)
            _record(problem, summary, passed, failed)
    if not failed:
        return "", passed
    cordon_for_evidence(ctx, node)
    return "health gate failed: " + "; ".join(failed), passed


class GatesFailAfterRollback(StepFailed):
    """A rolled-back node whose health gates still fail: it is not given back to service."""

    leaves_node_cordoned: ClassVar[bool] = True


def gates_after_rollback(ctx: StepContext, kind: str) -> None:
    """Before a rolled-back node is given back to service (DESIGN invariant 10): its gates,
    read until they pass or policy.verify.gpu_wait_timeout_s runs out (the device plugin
    registers again after the rollback's restart, as after the change's). DCGM's diagnostics
    do not run again. GatesFailAfterRollback, with the last evidence, when they never pass."""
    deadline = ctx.deadline(ctx.spec.policy.verify.gpu_wait_timeout_s)
    while True:
        evidence, _ = read_gates(ctx, rolled_back=True)
        if not evidence:
            return
        if deadline.expired:
            raise GatesFailAfterRollback(
                ctx.node, kind, f"rolled back, but left cordoned: {evidence}"
            )
        deadline.sleep(ROLLBACK_GATE_POLL_S)


def check_xids(ctx: StepContext) -> str | None:
    """None when the kernel log holds no Xid since gates.baseline; else the Xid lines."""
    with translate_step_errors(ctx.node, GatesStep.kind):
        text = check(ctx.runner.run(["sh", "-c", XID_SCRIPT])).stdout
    try:
        reading = parse_xid_reading(text)
    except KernelReadingError as exc:
        return f"xid: cannot read the node's kernel clock: {exc}"
    began = KernelClock.from_data(ctx.load_data(BASELINE_STEP))
    new = reading.since(began)
    if not new:
        return None
    shown = "; ".join(f"Xid {e.xid} on {e.pci} ({e.meaning}): {e.line}" for e in new[:3])
    more = f" and {len(new) - 3} more" if len(new) > 3 else ""
    return f"xid: {len(new)} Xid line(s) since the change began: {shown}{more}"


def _record(problem: str | None, name: str, passed: list[str], failed: list[str]) -> None:
    if problem is None:
        passed.append(name)
    else:
        failed.append(problem)


def check_resources(ctx: StepContext, node: Node, rolled_back: bool = False) -> str | None:
    """None when every GPU resource is whole; else what is short, resource by resource.
    Where the plan's forecast promises more than expect_gpus' one rule (a MIG layout), each
    resource it gives a count is expected at that count (before the plan, once rolled back)
    and those it takes to 0 are not read."""
    facts = ctx.facts
    if ctx.spec.shared_gpus() is None:
        facts = replace(facts, labels=node.labels)
    expected = expect_gpus(ctx.spec, facts)
    forecast = forecast_expectations(ctx.node_plan, facts, expected, rolled_back=rolled_back)
    counts = {e.resource: e.count for e in forecast or (expected,) if e.count}
    # what the node advertised before, but for the GPU resource a profile may rename
    names = {
        name
        for name in ctx.facts.capacity
        if name.startswith(GPU_RESOURCE_PREFIX) and name not in (GPU_RESOURCE, SHARED_GPU_RESOURCE)
    }
    if forecast is not None:
        names = {name for name in names if name in counts}
    names.update(counts)
    problems = []
    for name in sorted(names):
        capacity = advertised_count(node.capacity, name)
        allocatable = advertised_count(node.allocatable, name)
        if name in counts and capacity != counts[name]:
            problems.append(f"{name} capacity {capacity}, expected {counts[name]}")
        elif not capacity or allocatable != capacity:
            unhealthy = " (a device the plugin marked unhealthy)" if capacity else ""
            problems.append(f"{name} capacity {capacity}, allocatable {allocatable}{unhealthy}")
    return "resources: " + "; ".join(problems) if problems else None


def cordon_for_evidence(ctx: StepContext, node: Node) -> None:
    """A node that fails a gate stays out of service: cordon it where no step did."""
    if node.unschedulable:
        return
    ctx.journal.append(CordonedByRollout(node=ctx.node))
    ctx.kube.set_unschedulable(ctx.node, True)


def check_dcgm(ctx: StepContext, node: Node, gate: DcgmGate) -> tuple[str | None, str]:
    """Run `dcgmi diag -r LEVEL -j` in a pod holding every GPU the node advertises: (what
    failed, None when every test passed; the per-test results, for the journal)."""
    level = f"dcgm level {gate.level}"
    resource = expect_gpus(ctx.spec, ctx.facts).resource
    gpus = advertised_count(node.allocatable, resource)
    if not gpus:
        return f"dcgm: the node has no allocatable {resource} to give the diagnostic's pod", ""
    manifest = smoke_pod_manifest(
        smoke_pod_name(ctx.node, ctx.run_id, DCGM_POD_PREFIX),
        ctx.node,
        ctx.run_id,
        gate.image,
        resource,
        command=tuple(dcgm_command(gate.level)),
        gpus=gpus,
        container=DCGM_CONTAINER,
    )
    deadline = ctx.deadline(gate.timeout_s)
    pod, log = run_pod_once(ctx, GatesStep.kind, manifest, deadline)
    if pod.phase not in ("Succeeded", "Failed"):
        warnings = read_pod_warnings(ctx, pod)
        said = "" if isinstance(warnings, str) else "; ".join(e.describe() for e in warnings)
        return (
            f"dcgm: {describe_pod(pod)}: not finished after {round(deadline.elapsed_s)}s "
            f"(level {gate.level}'s timeout {gate.timeout_s}s){'; ' + said if said else ''}",
            "",
        )
    try:
        reading = parse_dcgm_output(log or "")
    except DcgmReadingError as exc:
        tail = tail_lines(log or "(no log)", DCGM_LOG_LINES)
        return f"dcgm: {describe_pod(pod)}: {exc}\n  log:\n{tail}", ""
    if reading.failed:
        tests = "; ".join(r.describe() for r in reading.failed)
        return f"dcgm: {level} failed: {tests}", ""
    return None, f"{level} ({reading.summary()})"
