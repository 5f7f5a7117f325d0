"""`diagnose --fix`: a remediation plan.yaml for the findings rollout can repair.

- shadowing: a containerd change (`default_runtime` as the shadowed file set it): the
  planner's repair rewrites the shadowing file to carry the whole table, so the lost
  handlers come back, and `rollout plan` shows exactly that;
- a device-plugin profile label naming a missing key: a time-slicing change that puts the
  key into the ConfigMap, with the replicas the node last ran (GFD's label; 1 gives a profile
  without sharing) or the only sharing profile the ConfigMap holds.

- a node stuck `upgrade-failed` under an operator-managed driver: an operator-mode driver
  change to the version the ClusterPolicy already asks for, with `retry_failed: true`, which
  relabels the node `upgrade-required` (the documented manual fix) and watches it to
  `upgrade-done`. It comes first: the label halts every other run until it is gone. The
  cause (the driver pod's reason and log, a pod the operator could not delete) is the
  person's to fix before applying; the plan says so.

Everything else needs a person, and says why. A plan carries one target list for all its
changes, so one plan repairs one kind: the other kind is left for the next `--fix`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from rollout.containerd import ContainerdConfigError
from rollout.containerd.files import parse_toml
from rollout.deviceprofiles import MAX_REPLICAS, load_profile, shared_replicas
from rollout.diagnose.finding import Finding, Severity
from rollout.diagnose.readings import node_profile
from rollout.diagnose.tree import Diagnosis
from rollout.driver.operator import OperatorDriver
from rollout.facts import FleetFacts, NodeFacts
from rollout.facts.gpu_operator import GPU_REPLICAS_LABEL, labelled_number
from rollout.facts.pods import GPU_RESOURCE

FIX_PLAN_NAME = "diagnose-fix"
DEFAULT_RUNTIME = "runc"

MANUAL_REASONS: Mapping[str, str] = {
    "advertising.unhealthy-devices": "hardware: act on the Xid (reset the GPU, restart the node "
    "or follow NVIDIA's workflow)",
    "advertising.row-remap-failed": "hardware: drain the node and have the GPU replaced (its "
    "spare memory rows are used up)",
    "operator.upgrade-failed": "relabel the node upgrade-required once the cause is fixed "
    "(--fix plans it where the GPU Operator manages the driver)",
    "operator.mig-config-failed": "read the MIG manager's log, then label the node with a "
    "layout that applies (a rollout run's undo puts its previous layout back)",
    "operator.mig-config-missing-layout": "label the node with a layout the MIG manager's "
    "ConfigMap defines, or add the layout to its mig-configs",
    "operator.driver-library-mismatch": "reload the nvidia kernel module or reboot the node",
    "operator.driver-kernel-mismatch": "reload the nvidia kernel module or reboot the node",
    "runtime.containerd-down": "read containerd's journal and fix its configuration by hand",
    "runtime.config-invalid": "fix the file named in the evidence by hand",
    "runtime.handler-missing": "restart the NVIDIA container toolkit so it writes its drop-in "
    "again",
    "node.not-ready": "read the kubelet's journal on the node",
    "node.unreachable": "reach the node over SSH first",
    "operator.deploy-label-paused": "set the label back to true once the maintenance is over",
    "operator.operand-excluded": "remove the taint from the node, or add its toleration to the "
    "ClusterPolicy (daemonsets.tolerations)",
    "operator.operand-missing": "read the DaemonSet's events: kubectl describe daemonset",
    "pods.requests-without-limits": "change the pod's manifest: set limits",
    "pods.fractional-request": "change the pod's manifest: whole GPUs",
    "pods.request-differs-from-limit": "change the pod's manifest: set the GPU limit alone",
    "pods.runtimeclass-missing": "create the RuntimeClass or fix the pod's runtimeClassName",
}


@dataclass(frozen=True)
class Remedies:
    """The plan document (None: nothing to repair), what it repairs, and what it leaves."""

    plan: Mapping[str, Any] | None
    repaired: tuple[Finding, ...]
    manual: tuple[tuple[Finding, str], ...]

    def to_yaml(self) -> str:
        header = (
            "# Written by `rollout diagnose --fix`: review it with `rollout plan`, then apply.\n"
            + "".join(f"# repairs: {f.node}: {f.check}\n" for f in self.repaired)
            + "".join(
                f"# needs a person: {f.node or f.pod}: {f.check}: {why}\n" for f, why in self.manual
            )
        )
        body = yaml.safe_dump(dict(self.plan or {}), sort_keys=False)
        # the reviewer reads, above the change, which finding it answers and why it repairs it
        before, found, after = body.partition("\nchanges:\n")
        return header + before + found + self.change_comment() + after

    def change_comment(self) -> str:
        """`# repairs CHECK on NODE: cause`, per finding, then how the change repairs them."""
        changes = (self.plan or {}).get("changes") or [{}]
        lines = [f"repairs {f.check} on {f.node}: {f.cause}" for f in self.repaired]
        lines.append(f"how: {_how_it_repairs(changes[0])}")
        return "".join(
            f"{line}\n"
            for text in lines
            for line in textwrap.wrap(
                _comment_text(text), 96, initial_indent="# ", subsequent_indent="#   "
            )
        )


def _comment_text(text: str) -> str:
    """Text from the nodes' files made fit for a YAML comment: one line, printable."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _how_it_repairs(change: Mapping[str, Any]) -> str:
    """Why the one change of a fix plan repairs what its findings say."""
    if "containerd" in change:
        runtime = change["containerd"].get("default_runtime", DEFAULT_RUNTIME)
        return (
            "the last file setting the CRI table must carry the whole table (containerd 1.x"
            " replaces a plugin table whole): the planner rewrites the shadowing file with the"
            " handlers it threw away, so they are loaded again; default_runtime is"
            f" {runtime}, the one the node's files name (runc where none does)."
            " `rollout plan` shows the rewrite and the effective config before and after"
        )
    if "time-slicing" in change:
        slicing = change["time-slicing"]
        where = "{namespace}/{name}".format_map(slicing["configmap"])
        return (
            f"the node's nvidia.com/device-plugin.config label names {slicing['profile']!r},"
            f" a key {where} lacks, so the device plugin's config-manager fails on it; this"
            " change puts that key into the ConfigMap with the replicas the node last ran"
        )
    return (
        "relabelling the node upgrade-required is the GPU Operator's documented way out of"
        " upgrade-failed: its upgrade controller retries the driver the ClusterPolicy names,"
        " and the run watches the node to upgrade-done. Fix the cause in the evidence first"
    )


def plan_remedies(diagnosis: Diagnosis, fleet: FleetFacts) -> Remedies:
    """The remediation plan for the diagnosis' repairable findings."""
    problems = [f for f in diagnosis.findings if f.severity is not Severity.INFO]
    shadowed = [f for f in problems if f.check == "runtime.shadowing"]
    profiles = [f for f in problems if f.check == "operator.profile-label-missing-key"]
    failed = [f for f in problems if f.check == "operator.upgrade-failed"]
    manual: list[tuple[Finding, str]] = []
    plan: dict[str, Any] | None = None
    repaired: list[Finding] = []
    version = _operator_version(fleet)
    if failed and version:
        plan, repaired = _upgrade_retry(failed, version)
        manual += [
            (f, "run `rollout diagnose --fix` again once the failed upgrade is retried")
            for f in shadowed + profiles
        ]
    elif shadowed:
        plan, repaired, left = _containerd_repair(shadowed, fleet)
        manual += left
        # the handlers a shadowing drop-in threw away come back with the repaired table
        fixed_nodes = {f.node for f in repaired}
        repaired += [
            f for f in problems if f.check == "runtime.handler-missing" and f.node in fixed_nodes
        ]
        manual += [
            (f, "run `rollout diagnose --fix` again once the repair is applied") for f in profiles
        ]
    elif profiles:
        plan, repaired, left = _profile_repair(profiles, fleet)
        manual += left
    done = {id(f) for f in repaired} | {id(f) for f, _ in manual}
    manual += [
        (f, MANUAL_REASONS.get(f.check, "needs a person: read the evidence"))
        for f in problems
        if id(f) not in done and f.severity is Severity.ERROR
    ]
    return Remedies(plan, tuple(repaired), tuple(manual))


def _plan(nodes: list[str], change: Mapping[str, Any], what: str) -> dict[str, Any]:
    return {
        "apiVersion": "rollout/v1",
        "kind": "Plan",
        "metadata": {"name": FIX_PLAN_NAME, "description": what},
        "targets": {"nodes": sorted(nodes)},
        "changes": [dict(change)],
        "policy": {"waves": [1], "max_unavailable": 1},
    }


def _operator_version(fleet: FleetFacts) -> str:
    """The driver version the ClusterPolicy asks for, where the operator manages the driver."""
    driver = OperatorDriver.from_cluster_policy(fleet.cluster.cluster_policy)
    return driver.version if fleet.cluster.cluster_policy and driver.enabled else ""


def _upgrade_retry(findings: list[Finding], version: str) -> tuple[dict[str, Any], list[Finding]]:
    nodes = sorted({f.node for f in findings if f.node})
    plan = _plan(
        nodes,
        {"driver-upgrade": {"version": version, "mode": "operator", "retry_failed": True}},
        f"retry the failed driver upgrade to {version}: relabel upgrade-failed -> "
        "upgrade-required (fix the cause in the evidence first)",
    )
    # the failed nodes are down already: each retries at once, in one wave
    plan["policy"] = {"waves": [len(nodes)], "max_unavailable": len(nodes)}
    return plan, findings


def _containerd_repair(
    findings: list[Finding], fleet: FleetFacts
) -> tuple[dict[str, Any] | None, list[Finding], list[tuple[Finding, str]]]:
    runtimes = {f.node: _shadowed_default_runtime(fleet.by_name(f.node or "")) for f in findings}
    chosen = max(set(runtimes.values()), key=list(runtimes.values()).count)
    ok = [f for f in findings if runtimes[f.node] == chosen]
    left = [
        (f, f"its default runtime is {runtimes[f.node]}, not {chosen}: run --fix for it alone")
        for f in findings
        if runtimes[f.node] != chosen
    ]
    nodes = sorted({f.node for f in ok if f.node})
    plan = _plan(
        nodes,
        {"containerd": {"default_runtime": chosen}},
        "restore the containerd tables a drop-in shadows (the planner's repair)",
    )
    return plan, ok, left


def _shadowed_default_runtime(node: NodeFacts | None) -> str:
    """The default runtime the node's files name (the toolkit's drop-in first), else runc."""
    if node is None:
        return DEFAULT_RUNTIME
    for path, text in reversed(list(node.config_files.files.items())):
        if not path.endswith(".toml"):
            continue
        try:
            plugins = parse_toml(path, text).get("plugins") or {}
        except ContainerdConfigError:  # a file that does not parse names nothing
            continue
        for table in plugins.values():
            name = ((table or {}).get("containerd") or {}).get("default_runtime_name")
            if isinstance(name, str) and name:
                return name
    return DEFAULT_RUNTIME


def _profile_repair(
    findings: list[Finding], fleet: FleetFacts
) -> tuple[dict[str, Any] | None, list[Finding], list[tuple[Finding, str]]]:
    wanted: dict[tuple[str, str, int], list[Finding]] = {}
    left: list[tuple[Finding, str]] = []
    for finding in findings:
        node = fleet.by_name(finding.node or "")
        if node is None:
            continue
        profile = node_profile(node, fleet.cluster)
        replicas = _replicas_for(node, fleet.cluster.configmaps.get(profile.configmap, {}))
        if replicas is None or profile.key is None or not profile.labelled:
            left.append(
                (finding, "rollout cannot tell which profile was meant: fix the label by hand")
            )
            continue
        wanted.setdefault((profile.configmap, profile.key, replicas), []).append(finding)
    if not wanted:
        return None, [], left
    (configmap, key, replicas), ok = max(wanted.items(), key=lambda kv: len(kv[1]))
    left += [
        (f, "another profile: run `rollout diagnose --fix` again once this one is applied")
        for group, fs in wanted.items()
        if group != (configmap, key, replicas)
        for f in fs
    ]
    namespace, _, name = configmap.partition("/")
    config: dict[str, Any] = {"version": "v1"}
    if replicas > 1:
        resources = [{"name": GPU_RESOURCE, "replicas": replicas}]
        config["sharing"] = {"timeSlicing": {"resources": resources}}
    change = {
        "time-slicing": {
            "configmap": {"namespace": namespace, "name": name},
            "profile": key,
            "config": config,
        }
    }
    nodes = sorted({f.node for f in ok if f.node})
    what = "" if replicas > 1 else " (no sharing, as the node last ran)"
    return _plan(nodes, change, f"put the missing profile {key!r} into {configmap}{what}"), ok, left


def _replicas_for(node: NodeFacts, data: Mapping[str, str]) -> int | None:
    """The replicas the node last ran (GFD's label; 1 is no sharing), else those of the only
    sharing profile; None when neither tells."""
    labelled = labelled_number(node.labels, GPU_REPLICAS_LABEL)
    if labelled is not None and labelled <= MAX_REPLICAS:
        return labelled
    found = set()
    for text in data.values():
        replicas = shared_replicas(load_profile(text), GPU_RESOURCE)
        if replicas is not None and 2 <= replicas <= MAX_REPLICAS:
            found.add(replicas)
    return found.pop() if len(found) == 1 else None
