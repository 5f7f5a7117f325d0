"""What a plan writes under /etc/containerd on one node, decided once from the node's facts.

The containerd steps (`containerd.write`, `systemd.restart`, `containerd.verify`) and the
node-wide decisions (cordon and drain only where containerd restarts) all read this one
result: the files to write, the effective-config diff, shadowing found and repaired.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout import containerd as engine
from rollout.changes.base import NodeWork
from rollout.changes.containerd.model import DEFAULT_RUNTIME_KEY, ContainerdChange
from rollout.changes.containerd.registrymodel import RegistryChange
from rollout.containerd.hosts import merge_hosts_toml
from rollout.errors import BadInput, InputError, InputErrors, RolloutError
from rollout.facts import NodeFacts
from rollout.plan import EffectiveChange, FileChange, NodePlan
from rollout.spec import Spec

PlanPath = tuple[str | int, ...]


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
    # why a file the plan covers needs no write (a hosts.toml that already says it)
    unchanged: tuple[str, ...] = ()


NO_CONTAINERD_CHANGES = ContainerdChanges((), (), "", (), (), ())


@dataclass(frozen=True)
class ContainerdWork(NodeWork):
    """The registry and containerd changes' work on one node: the containerd part of its plan."""

    containerd: ContainerdChanges = NO_CONTAINERD_CHANGES

    @classmethod
    def from_changes(cls, changes: ContainerdChanges) -> ContainerdWork:
        writes = bool(changes.files)
        return cls(
            touches_node=writes,
            disruptive=writes,
            restarts_containerd=writes,
            notes=changes.notes,
            containerd=changes,
        )

    def add_to(self, plan: NodePlan) -> NodePlan:
        found = self.containerd
        return dataclasses.replace(
            plan,
            files=found.files,
            effective_changes=found.effective_changes,
            effective_diff=found.effective_diff,
            defaults_source=found.defaults_source,
            shadowing=found.shadowing,
            repairs=found.repairs,
        )


@dataclass(frozen=True)
class PlannedSetting:
    """One CRI setting of the spec and where the plan file states it."""

    setting: engine.CriSetting
    where: PlanPath


def planned_settings(spec: Spec) -> list[PlannedSetting]:
    """The CRI settings the spec's registry and containerd changes ask for, each located."""
    found: list[PlannedSetting] = []
    for index, change in enumerate(spec.changes):
        if isinstance(change, RegistryChange):
            found.append(
                PlannedSetting(
                    engine.CriSetting("registry.config_path", change.config_path),
                    ("changes", index, "registry", "config_path"),
                )
            )
        elif isinstance(change, ContainerdChange):
            for key, value in change.all_settings().items():
                where: PlanPath = ("changes", index, "containerd", "settings", key)
                if key == DEFAULT_RUNTIME_KEY and change.default_runtime is not None:
                    where = ("changes", index, "containerd", "default_runtime")
                found.append(PlannedSetting(engine.CriSetting(key, value), where))
    return found


def build_intent(spec: Spec) -> engine.Intent | None:
    """The CRI settings the spec's registry and containerd changes ask for (None: none)."""
    settings = tuple(p.setting for p in planned_settings(spec))
    return engine.Intent(settings) if settings else None


def plan_node_containerd(spec: Spec, node: NodeFacts) -> ContainerdChanges:
    """The containerd file writes for the registry and containerd changes of the spec.

    Whatever would make `apply` fail on the node fails here, located: a problem with the
    node's own files names the node and the file; a setting containerd cannot load, or a
    default runtime no file defines, names the plan's line and the node. A plan computes
    it once per distinct node configuration (ContainerdPlans).
    """
    files, version = node.config_files, node.containerd
    try:
        current = engine.merge_files(files, version)
    except engine.ContainerdConfigError as exc:
        raise node.config_error(exc) from exc
    hosts_plans = [
        plan_hosts_toml(change, node, spec, index)
        for index, change in enumerate(spec.changes)
        if isinstance(change, RegistryChange)
    ]
    extra_files = [p for p in hosts_plans if isinstance(p, FileChange)]
    unchanged = tuple(p for p in hosts_plans if isinstance(p, str))
    found = engine.find_shadowing(files, version)
    # what containerd does not load today (shadowed, ignored for its version, imported by
    # nothing): the same answer diagnose reports
    shadowing = tuple(u.describe() for u in engine.find_unloaded(files, version))
    settings = planned_settings(spec)
    if not settings:
        return ContainerdChanges(tuple(extra_files), (), "", shadowing, (), (), unchanged=unchanged)
    check_settings(spec, node, settings, current)
    intent = engine.Intent(tuple(p.setting for p in settings))
    # repair_shadowing is synthesize when nothing is shadowed; on a broken node it also gives
    # back what a shadowing drop-in threw away, and says so.
    try:
        synthesis = engine.repair_shadowing(files, version, intent)
    except engine.StagingFailed:
        raise  # the real binary on this machine failed: not the plan's fault
    except engine.ContainerdConfigError as exc:
        raise plan_error(spec, node, settings[0].where, exc) from exc
    check_default_runtime(spec, node, settings, synthesis)
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
        + tuple(synthesis.after.warnings)
        + engine.unmeasured_release_notes(version),
        defaults_source=synthesis.defaults_source,
        unchanged=unchanged,
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


def check_settings(
    spec: Spec,
    node: NodeFacts,
    settings: Sequence[PlannedSetting],
    current: engine.EffectiveConfig,
) -> None:
    """Every setting placed and type-checked for the node's containerd, and a runc handler's
    options keys known to runc (`current`: the node's files merged); InputErrors, located."""
    errors: list[InputError] = []
    stated = tuple(p.setting for p in settings)
    for planned in settings:
        setting = planned.setting
        try:
            engine.place_setting(setting, node.containerd, current.config_version)
            handler = setting.key_path[2] if len(setting.key_path) > 2 else ""
            runtime_type = engine.runtime_type_in(handler, stated, current.tree)
            engine.check_runtime_options(setting, node.containerd, runtime_type)
        except engine.ContainerdConfigError as exc:
            errors.append(located(spec, node, planned.where, exc.message))
    if errors:
        raise InputErrors(errors)


def check_default_runtime(
    spec: Spec, node: NodeFacts, settings: Sequence[PlannedSetting], synthesis: engine.Synthesis
) -> None:
    """A default runtime must be a handler the node's config defines after the writes.

    containerd's CRI plugin refuses to start without it: the node stops running pods.
    """
    for planned in settings:
        if planned.setting.key != DEFAULT_RUNTIME_KEY:
            continue
        placed = next(p for p in synthesis.placed if p.setting == planned.setting)
        runtimes_path = (*placed.path[:-1], "runtimes")
        runtimes = engine.find_value(synthesis.after.tree, runtimes_path)
        defined = sorted(runtimes) if isinstance(runtimes, Mapping) else []
        if planned.setting.value not in defined:
            raise InputErrors(
                [
                    located(
                        spec,
                        node,
                        planned.where,
                        f"default runtime {planned.setting.value!r} is not defined in the "
                        f"node's containerd config (runtimes: {', '.join(defined) or 'none'})",
                        hint="name a defined runtime, or define it in the same change under "
                        f"settings: containerd.runtimes.{planned.setting.value}.runtime_type",
                    )
                ]
            )


def located(
    spec: Spec, node: NodeFacts, where: PlanPath, message: str, hint: str | None = None
) -> InputError:
    """A problem of the plan on one node, at the plan's line, naming the node."""
    return InputError(
        spec.location_of(*where),
        f"on node {node.name} (containerd {node.containerd}): {message}",
        hint=hint,
    )


def plan_error(spec: Spec, node: NodeFacts, where: PlanPath, exc: RolloutError) -> RolloutError:
    """An engine error while planning the spec's change, located at the change."""
    if isinstance(exc, BadInput):
        return InputErrors([located(spec, node, where, str(exc))])
    return type(exc)(f"{spec.location_of(*where)}: on node {node.name}: {exc}")


def plan_hosts_toml(
    change: RegistryChange, node: NodeFacts, spec: Spec, index: int
) -> FileChange | str:
    """The certs.d/<host>/hosts.toml write for one registry, or why none is needed.

    Refused when the path is not one a file can be written at on the node: a recorded
    file stands where a directory of it must be, or a directory where the file goes.
    """
    path = engine.hosts_toml_path(change.config_path, change.host)
    files = node.config_files
    blocking = next(
        (d for d in parent_directories(path) if d in files.files),
        path if path in files.directories() else None,
    )
    if blocking is not None:
        kind = "a directory" if blocking == path else "a file"
        raise InputErrors(
            [
                located(
                    spec,
                    node,
                    ("changes", index, "registry", "config_path"),
                    f"{path} cannot be written: {blocking} is {kind} on the node",
                    hint="choose a config_path that is a directory on the node, "
                    "e.g. /etc/containerd/certs.d",
                )
            ]
        )
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
    # only what the plan states changes: the node's own keys (a mirror's Authorization
    # header, client certs), its `server` unless the plan sets one, and the text of values
    # the plan does not change stay
    content = merge_hosts_toml(before, change.server, hosts, default_server=change.upstream)
    if before == content:
        kept = "" if change.server is not None else "; its server is the node's: the plan sets none"
        return f"{path} already lists the plan's mirrors for {change.host}{kept}"
    return FileChange(path=path, before=before, after=content, reason=f"mirrors for {change.host}")


def parent_directories(path: str) -> list[str]:
    """Every directory above `path`, nearest first, up to (not including) /."""
    parents: list[str] = []
    parent = posixpath.dirname(path)
    while parent not in ("/", ""):
        parents.append(parent)
        parent = posixpath.dirname(parent)
    return parents
