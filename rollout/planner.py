"""The planner: spec x facts x playbooks -> Plan.

Pure: it reads facts, it never probes. Every step either carries the action it will take or
the reason it has nothing to do, so a plan of an already-converged fleet says so node by node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from rollout import containerd as engine
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
    parse_label_selector,
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
    configmap_changed = any(
        c.kind == "configmap" and c.action is not None for c in cluster_changes
    )
    node_plans = [plan_node(spec, node, steps, configmap_changed) for node in targets]
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
    named = list(spec.targets.nodes or ())
    missing = [name for name in named if name not in known]
    if missing:
        raise TargetError(
            f"targets.nodes names {', '.join(missing)}, not found in {fleet.source}; "
            f"known nodes: {', '.join(sorted(known))}"
        )
    selector = parse_label_selector(spec.targets.selector) if spec.targets.selector else None
    excluded = set(spec.targets.exclude or ())
    chosen = [
        node
        for node in fleet.nodes
        if node.name not in excluded
        and (not named or node.name in named)
        and (selector is None or selector.matches(node.labels))
    ]
    if not chosen:
        raise TargetError(
            f"the plan's targets match no node in {fleet.source} "
            f"(selector {spec.targets.selector!r}, nodes {named or 'any'})"
        )
    return sorted(chosen, key=lambda n: n.name)


def plan_node(
    spec: Spec, node: NodeFacts, steps: Sequence[PlaybookStep], configmap_changed: bool
) -> NodePlan:
    """One node's steps, file writes and effective-config diff."""
    work = plan_containerd(spec, node)
    label_changes, label_action, restart_action, slicing_noop = plan_time_slicing(
        spec, node, configmap_changed
    )
    writes = bool(work.files)
    disruptive = writes  # cordon and drain only when containerd restarts
    planned: list[StepPlan] = []
    for step in steps:
        action: str | None = None
        noop: str | None = None
        if step.kind == "cordon":
            if not disruptive:
                noop = "nothing restarts on this node"
            elif node.unschedulable:
                noop = "already cordoned (by someone else: it stays cordoned afterwards)"
            else:
                action = "mark the node unschedulable"
        elif step.kind == "drain":
            action = "evict pods through the Eviction API" if disruptive else None
            noop = None if disruptive else "nothing restarts on this node"
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
            noop = None if restart_action else "the device plugin takes the profile from the label change"
        elif step.kind == "configmap.update":
            noop = "cluster-wide: done once before wave 1"
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
        unavailable=not node.available,
    )


def plan_containerd(spec: Spec, node: NodeFacts) -> NodeWork:
    """The containerd file writes for the registry and containerd changes of the spec."""
    settings: list[engine.CriSetting] = []
    extra_files: list[FileChange] = []
    for change in spec.changes:
        if isinstance(change, RegistryChange):
            settings.append(engine.CriSetting("registry.config_path", change.config_path))
            extra_files.extend(plan_hosts_toml(change, node))
        elif isinstance(change, ContainerdChange):
            for key, value in change.all_settings().items():
                settings.append(engine.CriSetting(key, value))
    shadowing = tuple(s.describe() for s in engine.find_shadowing(node.config_files, node.containerd))
    if not settings:
        return NodeWork((), (), "", shadowing, ())
    intent = engine.Intent(tuple(settings))
    synthesis = engine.synthesize(node.config_files, node.containerd, intent, repair=True)
    intended = {tuple(p) for p in synthesis.intended_paths}
    files = tuple(
        FileChange(path=w.path, before=w.before, after=w.after, reason=w.reason)
        for w in synthesis.writes
    ) + tuple(extra_files)
    changes = tuple(
        EffectiveChange(
            path=engine.format_path(c.path),
            before=c.before,
            after=c.after,
            intended=tuple(c.path) in intended,
        )
        for c in synthesis.changes
    )
    return NodeWork(
        files=files,
        effective_changes=changes,
        effective_diff=synthesis.diff_text,
        shadowing=shadowing,
        repairs=tuple(synthesis.repairs),
    )


def plan_hosts_toml(change: RegistryChange, node: NodeFacts) -> list[FileChange]:
    """The certs.d/<host>/hosts.toml write for one registry, unless it already matches."""
    path = f"{change.config_path.rstrip('/')}/{engine.hosts_dir_name(change.host)}/hosts.toml"
    content = engine.render_hosts_toml(change.to_registry_hosts())
    before = node.config_files.files.get(path)
    if before == content:
        return []
    return [FileChange(path=path, before=before, after=content, reason=f"mirror for {change.host}")]


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
                ClusterChange("configmap", ref, None, noop_reason=f"key {change.profile!r} already holds this profile")
            )
        else:
            diff = FileChange(f"/{ref}/{change.profile}", before_text, wanted_text, "").unified_diff()
            others = sorted(k for k in current if k != change.profile)
            keep = f"; other profiles kept: {', '.join(others)}" if others else ""
            verb = "update" if before_text is not None else "add"
            result.append(ClusterChange("configmap", ref, f"{verb} key {change.profile!r}{keep}", diff))
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
        # The config-manager watches labels, not ConfigMaps: same label, new content needs a restart.
        return [], None, "delete the node's device-plugin pod so it reloads the profile", (
            f"already labelled {change.profile}"
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
        f"upgrade the driver {current or '(unknown)'} -> {change.version} ({change.mode.value} mode)",
        None,
    )
