"""What a plan writes under /etc/containerd on one node, decided once from the node's facts.

The containerd steps (`containerd.write`, `systemd.restart`, `containerd.verify`) and the
node-wide decisions (cordon and drain only where containerd restarts) all read this one
result: the files to write, the effective-config diff, shadowing found and repaired.
"""

from __future__ import annotations

import contextlib
import posixpath
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rollout import containerd as engine
from rollout.containerd.hosts import merge_hosts_toml
from rollout.errors import BadInput, InputError, InputErrors, RolloutError
from rollout.facts import NodeFacts
from rollout.memo import BoundedCache
from rollout.plan import EffectiveChange, FileChange
from rollout.spec import ContainerdChange, RegistryChange, Spec
from rollout.spec.changes.containerd import DEFAULT_RUNTIME_KEY

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


class ContainerdPlans:
    """plan_containerd's results by content: one engine run per distinct node configuration.

    A real fleet is a few node configurations repeated many times (the toolkit writes
    byte-identical drop-ins across a node pool), and the result depends only on the
    containerd version, the node's files and what the plan asks: the key is exactly
    those. Errors are never kept, so each failing node reports itself by name.
    """

    def __init__(self, entries: int = 256) -> None:
        self._results: BoundedCache[InputKey, ContainerdChanges] = BoundedCache(entries)
        self._lock = threading.Lock()
        self.enabled = True
        self.runs = 0  # engine runs (the misses), for tests and the benchmark
        # the spec's part of the key, kept for the spec being planned (its repr is costly)
        self._spec: tuple[Spec, str] | None = None

    def plan(self, spec: Spec, node: NodeFacts) -> ContainerdChanges:
        """The node's containerd changes, computed once per distinct input."""
        if not self.enabled:
            return plan_node_containerd(spec, node)
        with self._lock:
            if self._spec is None or self._spec[0] is not spec:
                self._spec = (spec, repr(spec.changes))
            asked = self._spec[1]
        return self._results.get_or_compute(
            input_key(spec, node, asked), lambda: self._run(spec, node)
        )

    def plan_distinct(self, spec: Spec, nodes: Sequence[NodeFacts], max_parallel: int) -> None:
        """Compute the distinct configurations of `nodes` ahead, up to max_parallel at once.

        An engine run mostly waits for the real `containerd config dump` (a process of its
        own), so the runs of a fleet's few configurations overlap. Nothing is raised here:
        errors are not kept, and each node's own plan raises its error again, by name.
        """
        if not self.enabled:
            return
        asked = repr(spec.changes)
        firsts: dict[InputKey, NodeFacts] = {}
        for node in nodes:
            firsts.setdefault(input_key(spec, node, asked), node)
        if len(firsts) < 2:
            return  # nothing to overlap: the plan computes it in turn

        def plan_one(node: NodeFacts) -> None:
            with contextlib.suppress(Exception):  # raised again, named, by the node's plan
                self.plan(spec, node)

        with ThreadPoolExecutor(max_workers=min(max_parallel, len(firsts))) as pool:
            list(pool.map(plan_one, firsts.values()))

    def _run(self, spec: Spec, node: NodeFacts) -> ContainerdChanges:
        result = plan_node_containerd(spec, node)
        with self._lock:
            self.runs += 1
        return result

    @contextlib.contextmanager
    def disabled(self) -> Iterator[None]:
        """Compute every node afresh inside the block (the reference the memo is tested against)."""
        before, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = before


# everything plan_node_containerd reads: the version, the main file, the files, the changes
InputKey = tuple[str, str, tuple[tuple[str, str], ...], str]


def input_key(spec: Spec, node: NodeFacts, asked: str | None = None) -> InputKey:
    """Everything plan_node_containerd reads: the version, the files, the changes.

    The version's raw `--version` text is in the key, so a note quoting it stays exact; the
    spec's changes are keyed by their repr (every field, in the plan's order), which is
    what they ask whichever line of which plan file states them (`asked`, when known). The
    files are compared whole, in their order: a string keeps its hash, and recorded nodes
    share one string per distinct text, so a repeated configuration costs identity checks.
    """
    return (
        repr(node.containerd),
        node.config_files.main_path,
        tuple(node.config_files.files.items()),
        repr(spec.changes) if asked is None else asked,
    )


CONTAINERD_PLANS = ContainerdPlans()


def plan_containerd(spec: Spec, node: NodeFacts) -> ContainerdChanges:
    """The containerd file writes for the registry and containerd changes of the spec.

    Whatever would make `apply` fail on the node fails here, located: a problem with the
    node's own files names the node and the file; a setting containerd cannot load, or a
    default runtime no file defines, names the plan's line and the node. Nodes with the same
    version, files and plan share one result (CONTAINERD_PLANS).
    """
    return CONTAINERD_PLANS.plan(spec, node)


def plan_node_containerd(spec: Spec, node: NodeFacts) -> ContainerdChanges:
    """plan_containerd computed for this one node, without the memo."""
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
