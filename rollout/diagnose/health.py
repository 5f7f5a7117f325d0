"""Health the node reports beside advertising its GPUs: what the health gates read.

- operator.validator-not-ready: the GPU Operator's validator pod on the node is not Ready.
  Its init containers (driver, toolkit, CUDA, plugin validation) run in order and rerun at
  every restart; the first that has not finished names the layer of the stack that fails.
  The operator's driver upgrade waits on it (600 s, then upgrade-failed) and so does
  rollout's validator gate, so the node cannot be upgraded or returned to service.
- advertising.row-remap-pending / advertising.row-remap-failed: a GPU whose row remaps wait
  for a GPU reset (Xid 63/64's follow-up), or whose remapping once failed (out of spare rows).
  The device plugin still advertises such a GPU: only nvidia-smi (and DCGM) tell.
"""

from __future__ import annotations

from rollout.diagnose.finding import Branch, Finding, Severity
from rollout.diagnose.readings import describe_container, is_gpu_node, q
from rollout.facts import NodeFacts
from rollout.facts.gpu_operator import VALIDATIONS, is_validator
from rollout.facts.rowremap import REMAP_FIELDS, REMAP_HEADER

REMAP_QUERY = f"nvidia-smi --query-remapped-rows={','.join(REMAP_FIELDS)} --format=csv"


def check_health(node: NodeFacts) -> list[Finding]:
    """The validator and row-remap findings of one GPU node."""
    if not is_gpu_node(node):
        return []
    return _validator(node) + _row_remaps(node)


def _validator(node: NodeFacts) -> list[Finding]:
    findings = []
    for pod in node.pods:
        if not is_validator(pod.labels) or pod.ready or pod.deleting:
            continue
        key = f"{pod.namespace}/{pod.name}"
        stuck = pod.stuck_init_container
        if stuck is not None:
            where = f"its {stuck.name} has not finished"
            evidence = [f"init container {describe_container(stuck)}"]
            passed = [s.name for s in pod.init_statuses if s.completed]
            evidence.append(f"passed: {', '.join(passed) or 'none'}")
            command = f"kubectl logs -n {q(pod.namespace)} {q(pod.name)} -c {q(stuck.name)}"
        else:
            # no init container status reported (yet): the pod's own state is all there is
            where = "no init container status says which validation waits"
            evidence = []
            command = f"kubectl describe pod -n {q(pod.namespace)} {q(pod.name)}"
        reasons = ", ".join(pod.container_reasons) or "no reason given"
        findings.append(
            Finding(
                node.name,
                key,
                Branch.OPERATOR,
                "operator.validator-not-ready",
                f"the GPU Operator's validator {key} on {node.name} is not Ready: {where}; "
                "a driver upgrade or a rollout gate waiting on it does not pass",
                (f"{key}: {pod.phase}, not ready ({reasons})", *evidence)
                + ((f"message: {pod.message}",) if pod.message else ())
                + (f"validations in order: {', '.join(VALIDATIONS)}",),
                command,
                Severity.WARNING,
            )
        )
    return findings


def _row_remaps(node: NodeFacts) -> list[Finding]:
    command = f"ssh {q(node.name)} {REMAP_QUERY}"
    failed = [r for r in node.remapped_rows if r.failure]
    pending = [r for r in node.remapped_rows if r.pending and not r.failure]
    findings = []
    if failed:
        findings.append(
            Finding(
                node.name,
                None,
                Branch.ADVERTISING,
                "advertising.row-remap-failed",
                f"a row remap failed on {len(failed)} GPU(s) of {node.name} "
                f"({', '.join(r.bus_id for r in failed)}): the GPU has no spare memory rows "
                "left; drain the node and have the GPU replaced",
                (REMAP_HEADER, *(r.line for r in failed)),
                command,
                Severity.ERROR,
            )
        )
    if pending:
        buses = ", ".join(r.bus_id for r in pending)
        findings.append(
            Finding(
                node.name,
                None,
                Branch.ADVERTISING,
                "advertising.row-remap-pending",
                f"{len(pending)} GPU(s) of {node.name} ({buses}) have row remaps pending, which "
                "take effect only at a GPU reset: drain the node, then reset the GPU "
                f"(nvidia-smi -r -i {pending[0].bus_id}) or reboot the node",
                (REMAP_HEADER, *(r.line for r in pending)),
                command,
                Severity.WARNING,
            )
        )
    return findings
