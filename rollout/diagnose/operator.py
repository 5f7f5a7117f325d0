"""Operator: the GPU Operator's labels on the node, its device-plugin profile, the driver."""

from __future__ import annotations

from datetime import datetime

from rollout.deviceprofiles import DEVICE_PLUGIN_CONFIG_LABEL
from rollout.diagnose.finding import Branch, Finding, Severity
from rollout.diagnose.mig import check_mig
from rollout.diagnose.readings import describe_container, is_gpu_node, node_profile, pods_on, q
from rollout.driver.operator import OPERAND_PAUSED
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.gpu_operator import is_operand, is_validator
from rollout.inputs.wholenumber import whole_number
from rollout.operatornames import (
    DEPLOY_LABEL_PREFIX,
    OPERATOR_NAMESPACE,
    UPGRADE_DONE,
    UPGRADE_FAILED,
    UPGRADE_STATE_LABEL,
)

# when k8s-operator-libs started validating the node's new driver (seconds since the epoch)
VALIDATION_START_ANNOTATION = "nvidia.com/gpu-driver-upgrade-validation-start-time"
PAUSED_VALUES = ("false", OPERAND_PAUSED)
# without these operands the node cannot run GPU pods at all
ESSENTIAL_OPERANDS = ("operands", "driver", "container-toolkit", "device-plugin")
LOG_LINES_SHOWN = 5
ESSENTIAL_POD_WORDS = ("driver", "toolkit", "device-plugin")
FAILING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "Error",
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "StartError",
        "OOMKilled",
    }
)


def check_operator(node: NodeFacts, cluster: ClusterFacts, now: datetime) -> list[Finding]:
    """Every operator finding of one node."""
    if not is_gpu_node(node):
        return []
    findings = _upgrade_state(node, cluster, now)
    findings += _deploy_labels(node)
    findings += _profile(node, cluster)
    findings += _driver(node)
    findings += _driver_kernel(node)
    findings += _operands(node)
    findings += _daemonsets(node, cluster)
    findings += check_mig(node, cluster)
    return findings


def _daemonsets(node: NodeFacts, cluster: ClusterFacts) -> list[Finding]:
    """Operand DaemonSets whose pod should be on the node, or is kept off it by a taint.

    A nodeSelector that does not match is the operator's own choice (deploy labels, which
    `_deploy_labels` reports); a taint the DaemonSet does not tolerate is not, and neither is
    a DaemonSet that should run here and has no pod on the node.
    """
    findings = []
    present = {
        (p.namespace, p.controller.name)
        for p in node.pods
        if p.controller is not None and p.controller.kind == "DaemonSet"
    }
    for ds in cluster.daemonsets or ():
        if ds.namespace != OPERATOR_NAMESPACE or (ds.namespace, ds.name) in present:
            continue
        why = ds.excluded_by(node.labels, node.taints)
        if why.startswith("nodeSelector"):
            continue
        essential = any(word in ds.name for word in ESSENTIAL_POD_WORDS)
        consequence = "; without it the node advertises no GPU" if essential else ""
        counts = f"DaemonSet {ds.key}: desired {ds.desired}, ready {ds.ready} over the cluster"
        selector = ", ".join(f"{k}={v}" for k, v in sorted(ds.node_selector.items()))
        matched = f"its nodeSelector ({selector or 'none'}) matches {node.name}"
        if why:
            check = "operator.operand-excluded"
            cause = (
                f"{node.name}'s {why.removesuffix(' not tolerated')} keeps the GPU Operator's "
                f"DaemonSet {ds.key} off the node{consequence}"
            )
            evidence: tuple[str, ...] = (matched, why, counts)
            command = (
                f"kubectl get node {q(node.name)} -o jsonpath='{{.spec.taints}}'; "
                f"kubectl get daemonset -n {q(ds.namespace)} {q(ds.name)} "
                "-o jsonpath='{.spec.template.spec.tolerations}'"
            )
        else:
            check = "operator.operand-missing"
            cause = (
                f"the GPU Operator's DaemonSet {ds.key} should run a pod on {node.name} and has "
                f"none there{consequence}"
            )
            evidence = (matched, "no pod of it is bound to the node", counts)
            command = (
                f"kubectl get pods -n {q(ds.namespace)} -o wide "
                f"--field-selector spec.nodeName={q(node.name)}; "
                f"kubectl describe daemonset -n {q(ds.namespace)} {q(ds.name)}"
            )
        findings.append(
            Finding(
                node.name,
                None,
                Branch.OPERATOR,
                check,
                cause,
                evidence,
                command,
                Severity.ERROR if essential else Severity.WARNING,
            )
        )
    return findings


def _driver_kernel(node: NodeFacts) -> list[Finding]:
    found = node.driver_kernel
    if found is None or not found.mismatch:
        return []
    return [
        Finding(
            node.name,
            None,
            Branch.OPERATOR,
            "operator.driver-kernel-mismatch",
            f"the nvidia module loaded on {node.name} is {found.loaded}, but the one installed for "
            f"kernel {found.kernel} is {found.installed}: the driver was upgraded without "
            "reloading the module; reload it or reboot the node",
            (
                f"kernel: {found.kernel}",
                f"/proc/driver/nvidia/version: {found.loaded}",
                f"modinfo -F version nvidia: {found.installed}",
            ),
            f"ssh {q(node.name)} cat /proc/driver/nvidia/version; "
            f"ssh {q(node.name)} modinfo -F version nvidia",
            Severity.ERROR,
        )
    ]


def _operands(node: NodeFacts) -> list[Finding]:
    """Operand pods on the node that do not run: the device plugin's first."""
    findings = []
    for pod in node.pods:
        failing = [
            r for r in pod.container_reasons if r in FAILING_REASONS or r.startswith("Init:")
        ]
        if not is_operand(pod) or pod.ready or pod.deleting or not failing:
            continue
        if is_validator(pod.labels):
            continue  # rollout.diagnose.health names the validation it fails
        essential = any(word in pod.name for word in ESSENTIAL_POD_WORDS)
        key = f"{pod.namespace}/{pod.name}"
        log_tail = node.pod_logs.get(key, "").splitlines()[-LOG_LINES_SHOWN:]
        stuck = pod.stuck_init_container
        init = (f"init container {describe_container(stuck)}",) if stuck else ()
        findings.append(
            Finding(
                node.name,
                f"{pod.namespace}/{pod.name}",
                Branch.OPERATOR,
                "operator.operand-failing",
                f"the GPU Operator's pod {pod.namespace}/{pod.name} on {node.name} does not run "
                f"({', '.join(failing)})"
                + ("; without it the node advertises no GPU" if essential else ""),
                (f"{pod.namespace}/{pod.name}: {pod.phase}, not ready, {', '.join(failing)}",)
                + init
                + ((f"message: {pod.message}",) if pod.message else ())
                + tuple(f"log: {line}" for line in log_tail),
                f"kubectl logs -n {q(pod.namespace)} {q(pod.name)}"
                + (f" -c {q(stuck.name)}" if stuck else " --all-containers")
                + " --tail 20",
                Severity.ERROR if essential else Severity.WARNING,
            )
        )
    return findings


def _upgrade_state(node: NodeFacts, cluster: ClusterFacts, now: datetime) -> list[Finding]:
    state = node.labels.get(UPGRADE_STATE_LABEL)
    if not state or state == UPGRADE_DONE:
        return []
    command = f"kubectl get node {q(node.name)} -L {UPGRADE_STATE_LABEL}"
    evidence = [f"{UPGRADE_STATE_LABEL}={state}"]
    started = whole_number(node.annotations.get(VALIDATION_START_ANNOTATION, ""))
    if started is not None:
        minutes = int(now.timestamp() - started) // 60
        evidence.append(
            f"validation started {minutes} minute(s) ago ({VALIDATION_START_ANNOTATION})"
        )
    else:
        evidence.append("since: not recorded on the node (the API keeps no time for a label)")
    driver_pods = [p for p in pods_on(node, cluster) if "driver" in p.name]
    evidence += [
        f"driver pod {p.key}: {p.phase}"
        + (f" ({', '.join(p.container_reasons)})" if p.container_reasons else "")
        for p in driver_pods
    ]
    if state != UPGRADE_FAILED:
        return [
            Finding(
                node.name,
                None,
                Branch.OPERATOR,
                "operator.upgrade-in-progress",
                f"the GPU Operator is upgrading the driver on {node.name} (state {state})",
                tuple(evidence),
                command,
                Severity.INFO,
            )
        ]
    return [
        Finding(
            node.name,
            None,
            Branch.OPERATOR,
            "operator.upgrade-failed",
            f"the GPU Operator's driver upgrade failed on {node.name} and the node is stuck in "
            f"{UPGRADE_FAILED}; rollout apply halts on it until the driver pod runs in sync "
            "(the documented fix: relabel it upgrade-required once the cause is fixed)",
            tuple(evidence),
            command,
            Severity.ERROR,
        )
    ]


def _deploy_labels(node: NodeFacts) -> list[Finding]:
    findings = []
    for label, value in sorted(node.labels.items()):
        if not label.startswith(DEPLOY_LABEL_PREFIX) or value not in PAUSED_VALUES:
            continue
        operand = label.removeprefix(DEPLOY_LABEL_PREFIX)
        essential = operand in ESSENTIAL_OPERANDS
        findings.append(
            Finding(
                node.name,
                None,
                Branch.OPERATOR,
                "operator.deploy-label-paused",
                f"the GPU Operator does not run {operand} on {node.name}: {label}={value}"
                + (" (GPU pods cannot run there without it)" if essential else ""),
                (f"{label}={value}", "the operator fills only absent or empty deploy labels"),
                f"kubectl get node {q(node.name)} --show-labels",
                Severity.ERROR if essential else Severity.WARNING,
            )
        )
    return findings


def _profile(node: NodeFacts, cluster: ClusterFacts) -> list[Finding]:
    profile = node_profile(node, cluster)
    if not profile.missing:
        return []
    keys = sorted(cluster.configmaps.get(profile.configmap, {}))
    how = (
        f"{DEVICE_PLUGIN_CONFIG_LABEL}={profile.key}"
        if profile.labelled
        else f"ClusterPolicy devicePlugin.config.default={profile.key}"
    )
    namespace, _, name = profile.configmap.partition("/")
    return [
        Finding(
            node.name,
            None,
            Branch.OPERATOR,
            "operator.profile-label-missing-key",
            f"{node.name}'s device-plugin profile {profile.key!r} is not a key of ConfigMap "
            f"{profile.configmap}: its config-manager exits and the device plugin stays down",
            (how, f"ConfigMap {profile.configmap} keys: {', '.join(keys) or 'none'}"),
            f"kubectl get configmap -n {q(namespace)} {q(name)} -o yaml",
            Severity.ERROR,
        )
    ]


def _driver(node: NodeFacts) -> list[Finding]:
    status = node.driver_status
    if status is None or status.ok or status.missing:
        return []
    mismatch = status.library_mismatch
    return [
        Finding(
            node.name,
            None,
            Branch.OPERATOR,
            "operator.driver-library-mismatch" if mismatch else "operator.nvidia-smi-failed",
            (
                f"the driver packages on {node.name} were upgraded while the old kernel module "
                "stays loaded: reload the module or reboot the node"
                if mismatch
                else f"nvidia-smi fails on {node.name} (exit {status.exit_code})"
            ),
            (
                *(f"nvidia-smi: {line}" for line in status.output[-5:]),
                f"exit {status.exit_code}",
                f"driver version recorded: {node.gpus.driver_version or 'unknown'}",
            ),
            f"ssh {q(node.name)} nvidia-smi",
            Severity.ERROR,
        )
    ]
