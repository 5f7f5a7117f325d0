"""Pods: a GPU pod's own spec, and a pending GPU pod read together with the node numbers."""

from __future__ import annotations

from collections.abc import Sequence

from rollout.diagnose.finding import Branch, Finding, Severity
from rollout.diagnose.readings import allocated, amount, is_gpu_node, q
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.gpu_operator import OPERATOR_RUNTIME_CLASS
from rollout.facts.pods import (
    GPU_RESOURCE,
    PodFacts,
    gpu_refusal_check,
    is_gpu_resource,
    quantity_value,
)

REFUSAL_CAUSES = {
    "pods.requests-without-limits": "the API refuses a GPU request without a limit "
    "(extended resources are set as limits; requests default to them)",
    "pods.fractional-request": "the API refuses a fractional GPU quantity (GPUs are whole "
    "devices; time-slicing shares them as whole replicas)",
    "pods.request-differs-from-limit": "the API refuses a GPU request that differs from its "
    "limit (extended resources cannot be overcommitted)",
}


def check_pods(
    pods: Sequence[PodFacts], nodes: Sequence[NodeFacts], cluster: ClusterFacts
) -> list[Finding]:
    """Findings of each pod given, judged against every node of the facts."""
    findings: list[Finding] = []
    for pod in pods:
        findings += _spec(pod, cluster)
        if pod.wants_gpu and pod.phase == "Pending" and not pod.node_name:
            findings += _pending(pod, nodes, cluster)
    return findings


def check_runtime_classes(cluster: ClusterFacts) -> list[Finding]:
    """The GPU Operator's RuntimeClass, when the facts hold the RuntimeClasses."""
    if cluster.runtime_classes is None or OPERATOR_RUNTIME_CLASS in cluster.runtime_classes:
        return []
    return [
        Finding(
            None,
            None,
            Branch.PODS,
            "pods.runtimeclass-missing",
            f"RuntimeClass {OPERATOR_RUNTIME_CLASS} does not exist: the API refuses every pod "
            "naming it, the GPU Operator's operands included",
            (f"RuntimeClasses: {', '.join(sorted(cluster.runtime_classes)) or 'none'}",),
            "kubectl get runtimeclass",
            Severity.ERROR,
        )
    ]


def check_failed_creates(cluster: ClusterFacts) -> list[Finding]:
    """GPU pods the API refused: no pod object exists, only its controller's FailedCreate."""
    findings = []
    for owner, lines in sorted(cluster.failed_creates.items()):
        check = next((c for c in map(gpu_refusal_check, lines) if c), None)
        if check is None:
            continue
        kind, _, key = owner.partition(" ")
        namespace, _, name = key.partition("/")
        why = REFUSAL_CAUSES.get(check, "the API refused its GPU quantities")
        findings.append(
            Finding(
                None,
                None,
                Branch.PODS,
                check,
                f"{kind} {key} cannot create its pods: {why}",
                tuple(f"event: {line}" for line in lines[-3:]),
                f"kubectl describe {kind.lower()} -n {q(namespace)} {q(name)}",
                Severity.ERROR,
            )
        )
    return findings


def _spec(pod: PodFacts, cluster: ClusterFacts) -> list[Finding]:
    if not pod.spec_known:
        return []
    findings = []
    describe = f"kubectl get pod -n {q(pod.namespace)} {q(pod.name)} -o yaml"
    for container in pod.containers:
        for resource, quantity in container.requests.items():
            if resource not in container.limits:
                findings.append(
                    _finding(
                        pod,
                        "pods.requests-without-limits",
                        f"container {container.name} of {pod.key} requests {resource} without a "
                        "limit: extended resources are set as limits (requests default to them)",
                        (f"{container.name}: requests {resource}={quantity}, limits: none",),
                        describe,
                    )
                )
        for resource, quantity in {**container.requests, **container.limits}.items():
            value = quantity_value(quantity)
            if is_gpu_resource(resource) and value != int(value):
                findings.append(
                    _finding(
                        pod,
                        "pods.fractional-request",
                        f"container {container.name} of {pod.key} asks for {quantity} {resource}: "
                        "GPUs are whole devices (time-slicing shares them as whole replicas)",
                        (f"{container.name}: {resource}={quantity}",),
                        describe,
                    )
                )
    if (
        pod.runtime_class
        and cluster.runtime_classes is not None
        and pod.runtime_class not in cluster.runtime_classes
    ):
        findings.append(
            _finding(
                pod,
                "pods.runtimeclass-missing",
                f"{pod.key} names runtimeClassName {pod.runtime_class}, which does not exist",
                (
                    f"runtimeClassName: {pod.runtime_class}",
                    f"RuntimeClasses: {', '.join(sorted(cluster.runtime_classes)) or 'none'}",
                ),
                "kubectl get runtimeclass",
            )
        )
    return findings


def _excluded_by(pod: PodFacts, node: NodeFacts) -> str:
    """Why the pod cannot go to the node whatever its GPUs, or ""."""
    for key, value in pod.node_selector.items():
        if node.labels.get(key) != value:
            return f"nodeSelector {key}={value} (node has {node.labels.get(key, 'no such label')})"
    for taint in node.taints:
        head, _, effect = taint.rpartition(":")
        key, _, value = head.partition("=")
        if effect in ("NoSchedule", "NoExecute") and not any(
            t.tolerates(key, value, effect) for t in pod.tolerations
        ):
            return f"taint {taint} not tolerated"
    if node.unschedulable:
        return "cordoned"
    return ""


def _pending(pod: PodFacts, nodes: Sequence[NodeFacts], cluster: ClusterFacts) -> list[Finding]:
    gpu_nodes = [n for n in nodes if is_gpu_node(n)]
    wanted = {k: v for k, v in pod.gpu_resources.items()} or {GPU_RESOURCE: str(pod.gpu_request)}
    resource, quantity = next(iter(wanted.items()))
    need = int(quantity_value(quantity))
    lines = [f"event: {e}" for e in cluster.pod_events.get(pod.key, ())]
    if pod.unschedulable_message:
        lines.insert(0, f"scheduler: {pod.unschedulable_message}")
    excluded = {n.name: why for n in gpu_nodes if (why := _excluded_by(pod, n))}
    for node in gpu_nodes:
        held, _ = allocated(node, cluster, resource)
        numbers = (
            f"capacity {amount(node.capacity, resource)}, allocatable "
            f"{amount(node.allocatable, resource)}, allocated {held}"
        )
        reason = excluded.get(node.name)
        lines.append(
            f"{node.name}: {resource} {numbers}" + (f"; excluded: {reason}" if reason else "")
        )
    command = f"kubectl describe pod -n {q(pod.namespace)} {q(pod.name)}"
    if gpu_nodes and len(excluded) == len(gpu_nodes):
        return [
            _finding(
                pod,
                "pods.no-gpu-node-fits",
                f"{pod.key} is Pending: a taint or selector excludes every GPU node",
                tuple(lines),
                command,
            )
        ]
    free = [
        n.name
        for n in gpu_nodes
        if n.name not in excluded
        and amount(n.allocatable, resource) - allocated(n, cluster, resource)[0] >= need
    ]
    return [
        _finding(
            pod,
            "pods.pending",
            f"{pod.key} is Pending for {need} {resource}: "
            + (
                f"{', '.join(free)} could take it, so the scheduler has not caught up"
                if free
                else "no GPU node it may use has that many free (see each node's findings)"
            ),
            tuple(lines),
            command,
        )
    ]


def _finding(
    pod: PodFacts, check: str, cause: str, evidence: tuple[str, ...], command: str
) -> Finding:
    return Finding(
        pod.node_name, pod.key, Branch.PODS, check, cause, evidence, command, Severity.ERROR
    )
