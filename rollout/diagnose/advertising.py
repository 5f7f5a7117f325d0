"""Advertising: what the node's kubelet says of its GPUs, with the cause told apart.

The scheduler writes `Insufficient nvidia.com/gpu` whatever the cause (FACTS.md, kubelet
device manager), so capacity, allocatable and the sum allocated are read together: a
resource missing is a plugin not registered; allocatable 0 under a capacity is a plugin that
disconnected (the kubelet keeps capacity for its 5-minute grace); capacity > allocatable > 0
is unhealthy devices; allocated = allocatable is slots really used.
"""

from __future__ import annotations

from rollout.diagnose.finding import Branch, Finding, Severity
from rollout.diagnose.readings import (
    allocated,
    amount,
    gpu_resources,
    is_gpu_node,
    node_profile,
    q,
)
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.gpu_operator import physical_gpus
from rollout.facts.kernel import XIDS_IGNORED_BY_PLUGIN, parse_plugin_xids
from rollout.facts.pods import GPU_RESOURCE, SHARED_GPU_RESOURCE

GRACE_S = 300  # kubelet's endpointStopGracePeriod


def check_advertising(node: NodeFacts, cluster: ClusterFacts) -> list[Finding]:
    """Every advertising finding of one node (none for a node that is not a GPU node)."""
    if not is_gpu_node(node):
        return []
    findings = [_not_ready(node)] if not node.ready else []
    if not node.capacity:
        return findings  # recorded without the node's status: nothing to compare
    describe = f"kubectl describe node {q(node.name)}"
    physical = physical_gpus(node)
    profile = node_profile(node, cluster)
    expected = SHARED_GPU_RESOURCE if profile.renamed else GPU_RESOURCE
    resources = gpu_resources(node)
    numbers = [_numbers(node, cluster, r) for r in resources]
    findings.append(
        Finding(
            node.name,
            None,
            Branch.ADVERTISING,
            "advertising.resources",
            f"{node.name} advertises " + (", ".join(n[0] for n in numbers) or "no GPU resource"),
            (*(n[0] for n in numbers), f"physical GPUs (nvidia-smi): {physical}"),
            describe,
            Severity.INFO,
        )
    )
    if expected not in resources or amount(node.capacity, expected) == 0:
        findings.append(
            _finding(
                node,
                "advertising.not-registered",
                f"the device plugin has not registered {expected} with the kubelet on "
                f"{node.name}: the resource is missing from the node's status",
                (f"capacity {expected}: absent", f"physical GPUs: {physical}"),
                describe,
            )
        )
        return findings
    capacity = amount(node.capacity, expected)
    allocatable = amount(node.allocatable, expected)
    plugin_xids = [x for text in node.pod_logs.values() for x in parse_plugin_xids(text)]
    xids = [x for x in (*node.xids, *plugin_xids) if x.xid not in XIDS_IGNORED_BY_PLUGIN]
    xid_lines = tuple(f"{x.line}  -> Xid {x.xid}: {x.meaning}" for x in xids)
    numbers_line = f"{expected}: capacity {capacity}, allocatable {allocatable}"
    if allocatable < capacity and (allocatable > 0 or xids):
        findings.append(
            _finding(
                node,
                "advertising.unhealthy-devices",
                f"{capacity - allocatable} of {capacity} {expected} on {node.name} are unhealthy"
                + (
                    f" (Xid {', '.join(sorted({str(x.xid) for x in xids}))} in the kernel log);"
                    " a person must act on the hardware"
                    if xids
                    else "; the kernel log holds no Xid: read the device plugin's log"
                ),
                (numbers_line, *xid_lines),
                f"ssh {q(node.name)} journalctl -k | grep Xid",
            )
        )
    elif allocatable == 0:
        findings.append(
            _finding(
                node,
                "advertising.not-registered",
                f"the device plugin on {node.name} is not serving: allocatable {expected} is 0 "
                f"while capacity is {capacity} (the kubelet keeps capacity for {GRACE_S // 60} "
                "minutes after the plugin disconnects, then drops the resource)",
                (numbers_line, "kernel log: no Xid"),
                describe,
            )
        )
    if physical and not profile.missing:
        want = physical * profile.replicas
        if capacity != want:
            findings.append(
                _finding(
                    node,
                    "advertising.replicas-mismatch",
                    f"{node.name} advertises {capacity} {expected}, not {physical} GPUs x "
                    f"{profile.replicas} replicas = {want}: the device plugin runs another "
                    "profile than the ConfigMap holds (it reloads on a label change or a "
                    "restart only)",
                    (
                        numbers_line,
                        f"physical GPUs: {physical}",
                        f"profile: {profile.key or 'none'} in {profile.configmap or 'no ConfigMap'}"
                        f" (replicas {profile.replicas})",
                    ),
                    describe,
                )
            )
    held, holders = allocated(node, cluster, expected)
    if allocatable > 0 and held >= allocatable:
        findings.append(
            Finding(
                node.name,
                None,
                Branch.ADVERTISING,
                "advertising.slots-used",
                f"every {expected} slot on {node.name} is in use ({held} of {allocatable}); "
                "a new GPU pod waits for one of these pods to finish",
                (numbers_line, *(f"held by {h}" for h in holders)),
                f"kubectl get pods -A --field-selector spec.nodeName={q(node.name)}",
                Severity.WARNING,
            )
        )
    return findings


def _numbers(node: NodeFacts, cluster: ClusterFacts, resource: str) -> tuple[str]:
    held, _ = allocated(node, cluster, resource)
    return (
        f"{resource}: capacity {amount(node.capacity, resource)}, allocatable "
        f"{amount(node.allocatable, resource)}, allocated {held}",
    )


def _not_ready(node: NodeFacts) -> Finding:
    return _finding(
        node,
        "node.not-ready",
        f"{node.name} is NotReady: the kubelet does not report, so no pod starts there",
        ("Ready condition: not True",),
        f"kubectl describe node {q(node.name)}",
    )


def _finding(
    node: NodeFacts, check: str, cause: str, evidence: tuple[str, ...], command: str
) -> Finding:
    return Finding(
        node.name, None, Branch.ADVERTISING, check, cause, evidence, command, Severity.ERROR
    )
