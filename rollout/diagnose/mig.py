"""MIG: what the GPU Operator's MIG manager does with the layout a node's label asks for.

The manager applies the layout `nvidia.com/mig.config` names, from its ConfigMap, and reports
`nvidia.com/mig.config.state` (rollout.facts.migmode, the manager's contract). Findings: the
label names a layout the ConfigMap does not define; the manager reports `failed` (its pod's log
tail quoted); it is still at work (`pending`, `rebooting`); or no manager pod runs on the node
to act on the label. Nothing here knows the MIG change kind: a person's `kubectl label` is
judged alike.
"""

from __future__ import annotations

from rollout.diagnose.finding import Branch, Finding, Severity
from rollout.diagnose.readings import amount, gpu_resources, q
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.gpu_operator import is_operand
from rollout.facts.migmode import (
    CAPABLE_LABEL,
    CONFIG_KEY,
    CONFIG_LABEL,
    MANAGER_APP,
    MANAGER_SELECTOR,
    STATE_LABEL,
    MigConfigError,
    MigSettings,
    MigState,
    NodeMig,
    read_layout_entries,
    read_mig_mode,
)
from rollout.operatornames import DEPLOY_LABEL_PREFIX
from rollout.transports.kube import Pod

# the manager writes a line per step; its reason for a failure is rarely the very last line
LOG_LINES_SHOWN = 10
MANAGER_DEPLOY_LABEL = f"{DEPLOY_LABEL_PREFIX}mig-manager"
IN_PROGRESS = (MigState.PENDING, MigState.REBOOTING)


def check_mig(node: NodeFacts, cluster: ClusterFacts) -> list[Finding]:
    """Every MIG finding of one node; none where no layout is asked for."""
    mig = NodeMig.from_labels(node.labels)
    if mig.config is None:
        return []
    manager = find_manager_pod(node)
    findings = _layout_undefined(node, cluster, mig.config)
    if mig.state == MigState.FAILED:
        findings.append(_failed(node, mig.config, manager))
    elif mig.state in IN_PROGRESS:
        findings.append(_in_progress(node, mig, manager))
    if manager is None and mig.state != MigState.SUCCESS:
        findings += _manager_missing(node, cluster, mig)
    return findings


def find_manager_pod(node: NodeFacts) -> Pod | None:
    """The MIG manager's pod bound to the node (app=nvidia-mig-manager), if any."""
    return next(
        (p for p in node.pods if p.labels.get("app") == MANAGER_APP and not p.deleting), None
    )


def describe_gpus_now(node: NodeFacts) -> str:
    """`the GPUs now: MIG mixed, allocatable nvidia.com/mig-1g.5gb: 14`."""
    mode = read_mig_mode(node.labels, node.allocatable)
    counts = [f"{r}: {amount(node.allocatable, r)}" for r in gpu_resources(node)]
    return f"the GPUs now: MIG {mode.value}" + (
        f", allocatable {', '.join(counts)}" if counts else ""
    )


def _labels(mig: NodeMig) -> str:
    return f"{CONFIG_LABEL}={mig.config}, {STATE_LABEL}={mig.state or '(absent)'}"


def _label_command(node: NodeFacts) -> str:
    return f"kubectl get node {q(node.name)} -L {CONFIG_LABEL} -L {STATE_LABEL}"


def _log_command(pod: Pod) -> str:
    return f"kubectl logs -n {q(pod.namespace)} {q(pod.name)} --tail 50"


def _failed(node: NodeFacts, layout: str, manager: Pod | None) -> Finding:
    if manager is not None:
        key = f"{manager.namespace}/{manager.name}"
        tail = node.pod_logs.get(key, "").splitlines()[-LOG_LINES_SHOWN:]
        said: tuple[str, ...] = (f"MIG manager pod {key}: {manager.phase}",) + (
            tuple(f"log: {line}" for line in tail) or ("log: not read",)
        )
        command = f"{_log_command(manager)}; {_label_command(node)}"
    else:
        said = (f"no MIG manager pod ({MANAGER_SELECTOR}) on the node",)
        command = _label_command(node)
    return Finding(
        node.name,
        None,
        Branch.OPERATOR,
        "operator.mig-config-failed",
        f"the GPU Operator's MIG manager failed to apply layout {layout!r} on {node.name}; "
        "its GPUs stay as they were. Read its log, then label the node with a layout that "
        f"applies (kubectl label node {q(node.name)} {CONFIG_LABEL}=LAYOUT --overwrite; a "
        "rollout run's undo puts its previous layout back)",
        (
            f"{CONFIG_LABEL}={layout}, {STATE_LABEL}={MigState.FAILED}",
            describe_gpus_now(node),
            *said,
        ),
        command,
        Severity.ERROR,
    )


def _in_progress(node: NodeFacts, mig: NodeMig, manager: Pod | None) -> Finding:
    key = f"{manager.namespace}/{manager.name}" if manager else None
    return Finding(
        node.name,
        None,
        Branch.OPERATOR,
        "operator.mig-config-in-progress",
        "the GPU Operator's MIG manager"
        + (f" ({key})" if key else "")
        + f" is applying layout {mig.config!r} on {node.name} (state {mig.state})",
        (
            _labels(mig),
            "since: not recorded on the node (the API keeps no time for a label)",
            f"MIG manager pod {key}: {manager.phase}"
            if manager
            else f"no MIG manager pod ({MANAGER_SELECTOR}) on the node",
        ),
        (f"{_log_command(manager)}; " if manager else "") + _label_command(node),
        Severity.INFO,
    )


def _manager_missing(node: NodeFacts, cluster: ClusterFacts, mig: NodeMig) -> list[Finding]:
    # judged only where the facts list the operator's pods on the node (recorded facts may not)
    if not any(is_operand(p) for p in node.pods):
        return []
    settings = MigSettings.from_cluster_policy(cluster.cluster_policy)
    why = [
        _labels(mig),
        f"no pod {MANAGER_SELECTOR} is bound to the node",
        f"{MANAGER_DEPLOY_LABEL}={node.labels.get(MANAGER_DEPLOY_LABEL, '(absent)')}",
        f"{CAPABLE_LABEL}={node.labels.get(CAPABLE_LABEL, '(absent)')}",
    ]
    if cluster.cluster_policy and not settings.manager_enabled:
        why.append("the ClusterPolicy's migManager.enabled is false")
    return [
        Finding(
            node.name,
            None,
            Branch.OPERATOR,
            "operator.mig-manager-missing",
            f"{node.name} is labelled {CONFIG_LABEL}={mig.config} but no MIG manager pod runs "
            "on it: nothing acts on the label",
            tuple(why),
            f"kubectl get pods -A -l {MANAGER_SELECTOR} -o wide; "
            f"kubectl get node {q(node.name)} -L {MANAGER_DEPLOY_LABEL} -L {CAPABLE_LABEL}",
            Severity.WARNING,
        )
    ]


def _layout_undefined(node: NodeFacts, cluster: ClusterFacts, layout: str) -> list[Finding]:
    """Silent where the facts hold no readable ConfigMap of the manager."""
    settings = MigSettings.from_cluster_policy(cluster.cluster_policy)
    text = cluster.configmaps.get(settings.configmap_key, {}).get(CONFIG_KEY)
    if text is None:
        return []
    try:
        layouts = sorted(read_layout_entries(text))
    except MigConfigError:
        return []
    if layout in layouts:
        return []
    return [
        Finding(
            node.name,
            None,
            Branch.OPERATOR,
            "operator.mig-config-missing-layout",
            f"{node.name}'s MIG layout {layout!r} ({CONFIG_LABEL}) is not defined by the MIG "
            f"manager's ConfigMap {settings.configmap_key}: the manager cannot apply it",
            (
                f"{CONFIG_LABEL}={layout}",
                f"ConfigMap {settings.configmap_key} ({CONFIG_KEY}) layouts: "
                + (", ".join(layouts) or "none"),
            ),
            f"kubectl get configmap -n {q(settings.namespace)} {q(settings.configmap)} -o yaml",
            Severity.ERROR,
        )
    ]
