"""What a plan writes under /etc/containerd on one node, decided once from the node's facts.

The containerd steps (`containerd.write`, `systemd.restart`, `containerd.verify`) and the
node-wide decisions (cordon and drain only where containerd restarts) all read this one
result: the files to write, the effective-config diff, shadowing found and repaired.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout import containerd as engine
from rollout.containerd.hosts import merge_hosts_toml
from rollout.facts import NodeFacts
from rollout.plan import EffectiveChange, FileChange
from rollout.spec import ContainerdChange, RegistryChange, Spec


@dataclass(frozen=True)
class ContainerdChanges:
    """The containerd part of one node's plan: files, effective diff, shadowing, notes."""

    files: tuple[FileChange, ...]
    effective_changes: tuple[EffectiveChange, ...]
    effective_diff: str
    shadowing: tuple[str, ...]
    repairs: tuple[str, ...]
    notes: tuple[str, ...]
    # where the effective config's defaults came from (a real binary, recorded defaults)
    defaults_source: str = ""


def build_intent(spec: Spec) -> engine.Intent | None:
    """The CRI settings the spec's registry and containerd changes ask for (None: none)."""
    settings: list[engine.CriSetting] = []
    for change in spec.changes:
        if isinstance(change, RegistryChange):
            settings.append(engine.CriSetting("registry.config_path", change.config_path))
        elif isinstance(change, ContainerdChange):
            settings.extend(engine.CriSetting(k, v) for k, v in change.all_settings().items())
    return engine.Intent(tuple(settings)) if settings else None


def plan_containerd(spec: Spec, node: NodeFacts) -> ContainerdChanges:
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
        return ContainerdChanges(tuple(extra_files), (), "", shadowing, (), ())
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
    return ContainerdChanges(
        files=writes + tuple(extra_files),
        effective_changes=changes,
        effective_diff=engine.render_diff_text(synthesis.before, synthesis.after),
        shadowing=shadowing,
        repairs=repairs,
        notes=tuple(n for n in notes if not n.startswith("repairs: "))
        + tuple(synthesis.after.warnings),
        defaults_source=synthesis.defaults_source,
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
    before = node.config_files.files.get(path)
    # the node's own keys (a mirror's Authorization header, client certs) stay
    content = merge_hosts_toml(before, change.upstream, hosts)
    if before == content:
        return []
    return [
        FileChange(path=path, before=before, after=content, reason=f"mirrors for {change.host}")
    ]
