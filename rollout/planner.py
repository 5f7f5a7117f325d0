"""The planner: spec x facts x playbooks -> Plan.

Pure: it reads facts, it never probes. Every step either carries the action it will take or
the reason it has nothing to do, so a plan of an already-converged fleet says so node by node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rollout import containerd as engine
from rollout.drain import classify_for_policy
from rollout.errors import BadInput
from rollout.facts import ClusterFacts, FleetFacts, NodeFacts
from rollout.plan import (
    ClusterChange,
    EffectiveChange,
    FileChange,
    LabelChange,
    NodePlan,
    Plan,
    StepPlan,
    Wave,
)
from rollout.playbook import Playbook, PlaybookStep, compose_steps
from rollout.spec import (
    ContainerdChange,
    DriverUpgradeChange,
    RegistryChange,
    Spec,
    TimeSlicingChange,
)

DEVICE_PLUGIN_CONFIG_LABEL = "nvidia.com/device-plugin.config"
SHARED_MEMORY_WARNING = (
    "time-slicing shares each GPU, it does not divide it: every replica can use all of the "
    "GPU's memory and a fault in one workload can affect the others"
)


class TargetError(BadInput):
    """The plan targets nothing, or names a node the facts do not know."""


@dataclass(frozen=True)
class NodeWork:
    """The containerd part of one node's plan, before it is spread over steps."""

    files: tuple[FileChange, ...]
    effective_changes: tuple[EffectiveChange, ...]
    effective_diff: str
    shadowing: tuple[str, ...]
    repairs: tuple[str, ...]
    notes: tuple[str, ...]


def build_plan(
    spec: Spec,
    spec_source: str,
    fleet: FleetFacts,
    playbooks: Mapping[str, Playbook],
) -> Plan:
    """Plan every change of the spec over the targeted nodes of the fleet."""
    targets = select_targets(spec, fleet)
    kinds = change_kinds(spec)
    steps = compose_steps(playbooks[kind] for kind in kinds)
    cluster_changes = plan_cluster_changes(spec, fleet.cluster)
    configmap_changed = any(c.kind == "configmap" and c.action is not None for c in cluster_changes)
    cluster_pending = any(c.action is not None for c in cluster_changes)
    node_plans = [
        plan_node(spec, node, steps, configmap_changed, cluster_pending) for node in targets
    ]
    sizes = spec.policy.wave_sizes(len(node_plans)) if node_plans else []
    waves: list[Wave] = []
    start = 0
    for index, size in enumerate(sizes, start=1):
        waves.append(Wave(index=index, nodes=tuple(node_plans[start : start + size])))
        start += size
    warnings: list[str] = []
    if any(isinstance(c, TimeSlicingChange) for c in spec.changes):
        warnings.append(SHARED_MEMORY_WARNING)
    targeted = {n.name for n in targets}
    return Plan(
        name=spec.metadata.name,
        source=spec_source,
        facts_source=fleet.source,
        changes=tuple(kinds),
        waves=tuple(waves),
        cluster_changes=tuple(cluster_changes),
        max_unavailable=spec.policy.max_unavailable_count(len(fleet.nodes)),
        already_unavailable=tuple(n.name for n in fleet.nodes if not n.available),
        not_targeted=tuple(n.name for n in fleet.nodes if n.name not in targeted),
        warnings=tuple(warnings),
    )


def change_kinds(spec: Spec) -> list[str]:
    """The playbook kinds the spec's changes need, in the order the changes are written."""
    kinds: list[str] = []
    for change in spec.changes:
        kind = (
            "containerd"
            if isinstance(change, RegistryChange | ContainerdChange)
            else "time-slicing"
            if isinstance(change, TimeSlicingChange)
            else "driver-upgrade"
        )
        if kind not in kinds:
            kinds.append(kind)
    return kinds


def select_targets(spec: Spec, fleet: FleetFacts) -> list[NodeFacts]:
    """The nodes the spec targets, by name and/or label selector, in name order."""
    known = {n.name for n in fleet.nodes}
    missing = [name for name in spec.targets.nodes if name not in known]
    if missing:
        raise TargetError(
            f"{spec.location_of('targets', 'nodes')}: targets.nodes names "
            f"{', '.join(missing)}, not found in {fleet.source}; "
            f"known nodes: {', '.join(sorted(known))}"
        )
    chosen = [n for n in fleet.nodes if spec.targets.includes(n.name, n.labels)]
    if not chosen:
        selector = spec.targets.selector.to_string() if spec.targets.selector else "none"
        raise TargetError(
            f"{spec.location_of('targets')}: the plan's targets match no node in "
            f"{fleet.source} (selector {selector!r}, nodes {list(spec.targets.nodes) or 'any'})"
        )
    return sorted(chosen, key=lambda n: n.name)


def plan_node(
    spec: Spec,
    node: NodeFacts,
    steps: Sequence[PlaybookStep],
    configmap_changed: bool,
    cluster_pending: bool = False,
) -> NodePlan:
    """One node's steps, file writes and effective-config diff."""
    work = plan_containerd(spec, node)
    label_changes, label_action, restart_action, slicing_noop = plan_time_slicing(
        spec, node, configmap_changed
    )
    writes = bool(work.files)
    disruptive = writes  # cordon and drain only when containerd restarts
    planned: list[StepPlan] = []
    node_warnings: list[str] = list(work.notes)
    for step in steps:
        action: str | None = None
        noop: str | None = None
        if step.kind == "preflight":
            if writes or label_action or restart_action or cluster_pending:
                action = "check the node is Ready and containerd runs as planned"
            else:
                noop = "nothing changes on this node"
        elif step.kind == "cordon":
            if not disruptive:
                noop = "nothing restarts on this node"
            elif node.unschedulable:
                noop = "already cordoned (by someone else: it stays cordoned afterwards)"
            else:
                action = "mark the node unschedulable"
        elif step.kind == "drain":
            if disruptive:
                action, refusal = describe_drain(spec, node)
                node_warnings.extend(refusal)
            else:
                noop = "nothing restarts on this node"
        elif step.kind == "containerd.write":
            if writes:
                action = "write " + ", ".join(f.path for f in work.files)
            else:
                noop = "the effective containerd config already holds the intent"
        elif step.kind == "systemd.restart":
            action = "systemctl restart containerd" if writes else None
            noop = None if writes else "no containerd file changes"
        elif step.kind == "containerd.verify":
            action = "containerd config dump == predicted" if writes else None
            noop = None if writes else "no containerd file changes"
        elif step.kind == "node.label":
            action, noop = label_action, slicing_noop
        elif step.kind == "deviceplugin.restart":
            action = restart_action
            noop = (
                None
                if restart_action
                else "the device plugin takes the profile from the label change"
            )
        elif step.kind == "configmap.update":
            if cluster_pending:
                # cluster-wide: the first node's step makes the change, later ones find it made
                action = "publish the profile in the ConfigMap and point the ClusterPolicy at it"
            else:
                noop = "the ConfigMap and the ClusterPolicy already hold the profile"
        elif step.kind in {"gpu.wait", "gpu.smoke"}:
            if writes or label_action or restart_action:
                expected = expected_gpus(spec, node)
                action = (
                    f"wait for allocatable nvidia.com/gpu = {expected}"
                    if step.kind == "gpu.wait"
                    else "run nvidia-smi -L in a one-GPU pod pinned to the node"
                )
            else:
                noop = "nothing changed on this node"
        elif step.kind == "uncordon":
            if disruptive and not node.unschedulable:
                action = "mark the node schedulable again"
            else:
                noop = "rollout does not cordon this node"
        elif step.kind == "driver.install":
            action, noop = plan_driver(spec, node)
        planned.append(StepPlan(kind=step.kind, why=step.why, action=action, noop_reason=noop))
    return NodePlan(
        name=node.name,
        containerd_version=str(node.containerd),
        steps=tuple(planned),
        files=work.files,
        effective_changes=work.effective_changes,
        effective_diff=work.effective_diff,
        shadowing=work.shadowing,
        repairs=work.repairs,
        labels=tuple(label_changes),
        warnings=tuple(node_warnings),
        status=describe_status(node),
        unavailable=not node.available,
    )


def build_intent(spec: Spec) -> engine.Intent | None:
    """The CRI settings the spec's registry and containerd changes ask for (None: none)."""
    settings: list[engine.CriSetting] = []
    for change in spec.changes:
        if isinstance(change, RegistryChange):
            settings.append(engine.CriSetting("registry.config_path", change.config_path))
        elif isinstance(change, ContainerdChange):
            settings.extend(engine.CriSetting(k, v) for k, v in change.all_settings().items())
    return engine.Intent(tuple(settings)) if settings else None


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


def describe_status(node: NodeFacts) -> str:
    """The node as probed: containerd's service state, GPUs, taints (live facts only)."""
    parts: list[str] = []
    if node.service:
        restarts = node.service.get("NRestarts", "?")
        parts.append(
            f"containerd {node.service.get('ActiveState', '?')} "
            f"(MainPID {node.service.get('MainPID', '?')}, {restarts} restart(s))"
        )
    if node.capacity:
        parts.append(
            f"nvidia.com/gpu {node.allocatable.get('nvidia.com/gpu', '0')}/"
            f"{node.capacity.get('nvidia.com/gpu', '0')} allocatable"
        )
    if node.taints:
        parts.append("taints " + ", ".join(node.taints))
    return "; ".join(parts)


def plan_containerd(spec: Spec, node: NodeFacts) -> NodeWork:
    """The containerd file writes for the registry and containerd changes of the spec."""
    files, version = node.config_files, node.containerd
    extra_files = [
        write
        for change in spec.changes_of(RegistryChange)
        for write in plan_hosts_toml(change, node)
    ]
    found = engine.find_shadowing(files, version)
    shadowing = tuple(s.describe() for s in found)
    intent = build_intent(spec)
    if intent is None:
        return NodeWork(tuple(extra_files), (), "", shadowing, (), ())
    # repair_shadowing is synthesize when nothing is shadowed; on a broken node it also gives
    # back what a shadowing drop-in threw away, and says so.
    synthesis = engine.repair_shadowing(files, version, intent)
    intended = {placed.path for placed in synthesis.placed}
    writes = tuple(
        FileChange(
            path=w.path,
            before=w.before,
            after=w.after,
            reason=explain_write(w.path, files.main_path, version),
        )
        for w in synthesis.writes
    )
    changes = collapse_changes(
        synthesis.changes(), synthesis.before.tree, synthesis.after.tree, intended
    )
    notes = tuple(synthesis.notes)
    repairs = tuple(
        describe_repair(s)
        for s in found
        if s.kind is engine.ShadowKind.TABLE_REPLACED
        and any(n.startswith("repairs: ") for n in notes)
    )
    return NodeWork(
        files=writes + tuple(extra_files),
        effective_changes=changes,
        effective_diff=engine.render_diff_text(synthesis.before, synthesis.after),
        shadowing=shadowing,
        repairs=repairs,
        notes=tuple(n for n in notes if not n.startswith("repairs: "))
        + tuple(synthesis.after.warnings),
    )


def collapse_changes(
    changes: Sequence[engine.Change],
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    intended: set[tuple[str, ...]],
) -> tuple[EffectiveChange, ...]:
    """Leaf changes, with a whole added (or removed) table shown once at its top.

    A repaired node gets back whole tables (a runtime handler is some twenty leaves); the
    reviewer wants to read "runtimes.nvidia comes back", not every leaf of it.
    """
    result: list[EffectiveChange] = []
    seen: set[tuple[str, ...]] = set()
    for change in changes:
        path = tuple(change.path)
        top = path
        if path in intended:
            pass  # the intent is shown leaf by leaf, exactly as the plan states it
        elif change.before is None:
            top = _highest_missing(before, path)
        elif change.after is None:
            top = _highest_missing(after, path)
        if top in seen:
            continue
        seen.add(top)
        if top == path:
            old, new = change.before, change.after
        else:
            old, new = engine.find_value(before, top), engine.find_value(after, top)
        result.append(
            EffectiveChange(
                path=engine.format_path(top), before=old, after=new, intended=path in intended
            )
        )
    # the intent first, then what a repair gives back
    return tuple(sorted(result, key=lambda c: not c.intended))


def _highest_missing(tree: Mapping[str, Any], path: tuple[str, ...]) -> tuple[str, ...]:
    node: Any = tree
    for depth, part in enumerate(path):
        if not isinstance(node, Mapping) or part not in node:
            return path[: depth + 1]
        node = node[part]
    return path


def describe_repair(shadowing: engine.Shadowing) -> str:
    """What rollout's writes give back on a node broken by a shadowing drop-in."""
    handlers = sorted(
        {p[2] for p in shadowing.lost if len(p) >= 3 and p[:2] == ("containerd", "runtimes")}
    )
    restored = f"runtime handlers {', '.join(handlers)} and " if handlers else ""
    return (
        f"{shadowing.shadowing_file} is rewritten to carry the whole "
        f'plugins."{shadowing.plugin_id}" table: {restored}'
        f"{len(shadowing.lost)} lost setting(s) come back"
    )


def explain_write(path: str, main_path: str, version: engine.ContainerdVersion) -> str:
    """Why rollout writes this file: the reviewer's first question."""
    if path == main_path:
        return "the main config carries the intent, so it survives the toolkit removing its drop-in"
    if version.merge_mode is engine.MergeMode.REPLACE_PLUGIN_TABLES:
        return (
            f"on containerd {version.series} this file's CRI table replaces the earlier ones, "
            "so it must carry the intent too"
        )
    return "this later file sets the same key, so it must carry the intent too"


def plan_hosts_toml(change: RegistryChange, node: NodeFacts) -> list[FileChange]:
    """The certs.d/<host>/hosts.toml write for one registry, unless it already matches."""
    path = engine.hosts_toml_path(change.config_path, change.host)
    hosts = [
        engine.HostEndpoint(
            url=endpoint.url,
            capabilities=tuple(c.value for c in endpoint.capabilities),
            skip_verify=endpoint.skip_verify,
            ca=(endpoint.ca_file,) if endpoint.ca_file else (),
        )
        for endpoint in change.endpoints
    ]
    content = engine.render_hosts_toml(change.upstream, hosts)
    before = node.config_files.files.get(path)
    if before == content:
        return []
    return [
        FileChange(path=path, before=before, after=content, reason=f"mirrors for {change.host}")
    ]


def plan_cluster_changes(spec: Spec, cluster: ClusterFacts) -> list[ClusterChange]:
    """ConfigMap and ClusterPolicy changes for time-slicing, made once before wave 1."""
    result: list[ClusterChange] = []
    for change in spec.changes:
        if not isinstance(change, TimeSlicingChange):
            continue
        ref = f"{change.configmap.namespace}/{change.configmap.name}"
        current = cluster.configmaps.get(ref, {})
        wanted_text = yaml.safe_dump(change.config_document(), sort_keys=False)
        before_text = current.get(change.profile)
        if before_text is not None and yaml.safe_load(before_text) == change.config_document():
            result.append(
                ClusterChange(
                    "configmap",
                    ref,
                    None,
                    noop_reason=f"key {change.profile!r} already holds this profile",
                )
            )
        else:
            diff = FileChange(
                f"/{ref}/{change.profile}", before_text, wanted_text, ""
            ).unified_diff()
            others = sorted(k for k in current if k != change.profile)
            keep = f"; other profiles kept: {', '.join(others)}" if others else ""
            verb = "update" if before_text is not None else "add"
            result.append(
                ClusterChange("configmap", ref, f"{verb} key {change.profile!r}{keep}", diff)
            )
        policy_config = (cluster.cluster_policy.get("devicePlugin") or {}).get("config") or {}
        if policy_config.get("name") != change.configmap.name:
            result.append(
                ClusterChange(
                    "clusterpolicy",
                    "cluster-policy",
                    f"set spec.devicePlugin.config.name = {change.configmap.name!r} "
                    f"(now {policy_config.get('name') or 'unset'!r})",
                )
            )
    return result


def plan_time_slicing(
    spec: Spec, node: NodeFacts, configmap_changed: bool
) -> tuple[list[LabelChange], str | None, str | None, str | None]:
    """Label change, label action, device-plugin restart action and no-op reason for a node."""
    change = next((c for c in spec.changes if isinstance(c, TimeSlicingChange)), None)
    if change is None:
        return [], None, None, "no time-slicing change"
    current = node.labels.get(DEVICE_PLUGIN_CONFIG_LABEL)
    if current != change.profile:
        return (
            [LabelChange(DEVICE_PLUGIN_CONFIG_LABEL, current, change.profile)],
            f"label {DEVICE_PLUGIN_CONFIG_LABEL}={change.profile}",
            None,
            None,
        )
    if configmap_changed:
        # The config-manager watches labels, not ConfigMaps: a new profile under the same
        # label needs a device-plugin restart.
        return (
            [],
            None,
            "delete the node's device-plugin pod so it reloads the profile",
            (f"already labelled {change.profile}"),
        )
    return [], None, None, f"already labelled {change.profile} and the profile is unchanged"


def expected_gpus(spec: Spec, node: NodeFacts) -> int:
    change = next((c for c in spec.changes if isinstance(c, TimeSlicingChange)), None)
    replicas = change.replicas_for("nvidia.com/gpu") if change else current_replicas(node)
    return node.gpus.count * replicas


def current_replicas(node: NodeFacts) -> int:
    text = node.labels.get("nvidia.com/gpu.replicas", "1")
    return int(text) if text.isdigit() and int(text) > 0 else 1


def plan_driver(spec: Spec, node: NodeFacts) -> tuple[str | None, str | None]:
    change = next((c for c in spec.changes if isinstance(c, DriverUpgradeChange)), None)
    if change is None:
        return None, "no driver change"
    current = node.gpus.driver_version
    if current == change.version:
        return None, f"driver {current} already installed"
    return (
        f"upgrade the driver {current or '(unknown)'} -> {change.version} "
        f"({change.mode.value} mode)",
        None,
    )
