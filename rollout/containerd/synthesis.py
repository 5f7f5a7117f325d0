"""Drop-in synthesis: the file writes that make the effective config equal before + intent.

Strategy, and why. The NVIDIA toolkit owns conf.d/99-nvidia.toml: whenever it starts it
rewrites the file from `containerd config dump` (on 1.x the *entire* CRI table, because 1.x
replaces plugin tables; on 2.x only its runtime handlers), and it deletes the file when it
exits. A new drop-in of ours cannot win on 1.x without copying the whole CRI table itself
(and going stale), and editing only 99-nvidia.toml loses the intent when the toolkit exits.
So rollout edits, in place and with tomlkit (comments and layout survive):

- the main config, always, so that the intent survives the toolkit deleting its drop-in;
- on 1.x, every loaded file that defines the same top-level CRI plugin table (each of them
  may become the effective one: today the last, after the toolkit exits the one before);
- on 2.x, every loaded file that sets the same key, in either its version-3 or its version-2
  (migrated) spelling, because a later key wins a deep merge.

A toolkit restart then copies the dump, which already holds the intent; a toolkit exit leaves
the main config carrying it. Every candidate is checked against the merge model: the effective
config after the writes must equal the effective config before plus the intent, exactly.

`repair_shadowing` (1.x) additionally gives back what a shadowing drop-in threw away: it adds
to the file whose plugin table is effective every key that the shadowed files set and the
effective table lacks (a deep merge of all the files' tables, later files winning), then
applies the intent as above. It changes nothing else.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import tomlkit
from tomlkit.container import Container
from tomlkit.items import Table

from rollout.containerd.defaults import DefaultsSource
from rollout.containerd.diff import Change, diff_effective, has_path
from rollout.containerd.errors import SynthesisError
from rollout.containerd.files import ConfigFiles, parse_toml
from rollout.containerd.intent import Intent, PlacedSetting, place_intent
from rollout.containerd.localdump import standard_defaults
from rollout.containerd.merge import (
    PLUGINS,
    EffectiveConfig,
    find_value,
    iter_leaves,
    merge_files,
    merge_plugin_tables_deeply,
    with_defaults,
)
from rollout.containerd.shadowing import ShadowKind, find_shadowing
from rollout.containerd.version import ContainerdVersion, MergeMode, read_config_version

Path = tuple[str, ...]
TOOLKIT_RUNTIMES = ("nvidia", "nvidia-cdi", "nvidia-legacy")
_MISSING = object()


@dataclass(frozen=True)
class FileWrite:
    """One file to write: its text before (None: a new file) and after."""

    path: str
    before: str | None
    after: str


@dataclass(frozen=True)
class Synthesis:
    """The writes for an intent, the effective configs around them, or why nothing is needed.

    `before` and `after` are what containerd loads, its defaults from one DefaultsSource
    (`defaults_source` says which); `in_effect` holds the placed settings that already held
    their value before (a file set it, or it is the version's default): nothing is written
    for them.
    """

    writes: tuple[FileWrite, ...]
    before: EffectiveConfig
    after: EffectiveConfig
    placed: tuple[PlacedSetting, ...]
    noop_reason: str | None = None
    notes: tuple[str, ...] = ()
    in_effect: tuple[PlacedSetting, ...] = ()

    @property
    def is_noop(self) -> bool:
        return not self.writes

    @property
    def defaults_source(self) -> str:
        """Where the loaded configs' built-in defaults came from."""
        return self.after.defaults_source

    def changes(self) -> list[Change]:
        """The effective changes the writes make: leaves whose loaded value changes."""
        return diff_effective(self.before, self.after)

    def files_after(self, files: ConfigFiles) -> ConfigFiles:
        """The file set with the writes applied."""
        return apply_writes(files, self.writes)


def apply_writes(files: ConfigFiles, writes: Iterable[FileWrite]) -> ConfigFiles:
    """A file set with writes applied."""
    out = files
    for write in writes:
        out = out.with_file(write.path, write.after)
    return out


def synthesize(
    files: ConfigFiles,
    version: ContainerdVersion,
    intent: Intent,
    defaults: DefaultsSource | None = None,
) -> Synthesis:
    """The minimal writes that make `intent` effective, robust to the toolkit's rewrites.

    A setting whose loaded value already is the intended one (set by a file, or the version's
    default) is in effect: nothing is written for it. Candidates are checked on the merge
    model (what the files set); `before` and `after` come from `defaults` (standard: the real
    binary when cached, else the recorded defaults).
    """
    source = defaults if defaults is not None else standard_defaults()
    model = merge_files(files, version)
    before = with_defaults(model, files, source)
    placed = place_intent(intent, version, before.config_version)
    pending, in_effect = split_in_effect(placed, before)
    notes = _notes(files, version, placed) + _in_effect_notes(in_effect, pending, before)
    if not pending:
        return Synthesis(
            (),
            before,
            before,
            placed,
            f"already effective: {intent.describe()}",
            notes,
            in_effect,
        )
    expected = with_settings(model.configured, pending)
    tried: list[str] = []
    for edits in _candidates(files, version, model, pending):
        writes = _render_edits(files, edits)
        candidate = apply_writes(files, writes)
        merged = merge_files(candidate, version)
        if merged.configured == expected:
            after = with_defaults(merged, candidate, source)
            return Synthesis(writes, before, after, placed, None, notes, in_effect)
        unexpected = diff_effective(expected, merged.configured)
        tried.append("; ".join(str(c) for c in unexpected[:5]))
    raise SynthesisError(
        f"no edit of {files.main_path} and the files that shadow it makes exactly "
        f"{intent.describe()} effective on containerd {version}; differences left: "
        + " | ".join(tried)
    )


def split_in_effect(
    placed: Iterable[PlacedSetting], before: EffectiveConfig
) -> tuple[tuple[PlacedSetting, ...], tuple[PlacedSetting, ...]]:
    """(settings still to make, settings whose loaded value already is the intended one)."""
    pending: list[PlacedSetting] = []
    in_effect: list[PlacedSetting] = []
    for setting in placed:
        now = find_value(before.tree, setting.path, _MISSING)
        (in_effect if now == setting.value else pending).append(setting)
    return tuple(pending), tuple(in_effect)


def repair_shadowing(
    files: ConfigFiles,
    version: ContainerdVersion,
    intent: Intent,
    defaults: DefaultsSource | None = None,
) -> Synthesis:
    """Writes giving back what shadowing drop-ins threw away (1.x), plus the intent."""
    shadowed = [s for s in find_shadowing(files, version) if s.kind is ShadowKind.TABLE_REPLACED]
    source = defaults if defaults is not None else standard_defaults()
    if not shadowed:
        return synthesize(files, version, intent, source)
    before = with_defaults(merge_files(files, version), files, source)
    deep = merge_plugin_tables_deeply(files, version)
    edits: dict[str, list[tuple[Path, Any]]] = {}
    for plugin_id in sorted({s.plugin_id for s in shadowed}):
        owner = next(s.shadowing_file for s in shadowed if s.plugin_id == plugin_id)
        own_table = parse_toml(owner, files.files[owner])[PLUGINS][plugin_id]
        for leaf, value in iter_leaves(deep.plugin(plugin_id)):
            if not has_path(own_table, leaf):
                edits.setdefault(owner, []).append(((PLUGINS, plugin_id, *leaf), value))
    repaired = apply_writes(files, _render_edits(files, edits))
    if merge_files(repaired, version).configured != deep.configured:
        raise SynthesisError("restoring the shadowed keys did not give the deep-merged config")
    rest = synthesize(repaired, version, intent, source)
    writes = _combine(files, _render_edits(files, edits), rest.writes)
    final = apply_writes(files, writes)
    merged = merge_files(final, version)
    pending = tuple(s for s in rest.placed if s not in rest.in_effect)
    if merged.configured != with_settings(deep.configured, pending):
        raise SynthesisError("the repaired files do not give the deep-merged config plus intent")
    after = with_defaults(merged, final, source)
    notes = (
        *(f"repairs: {s.describe()}" for s in shadowed),
        *rest.notes,
    )
    return Synthesis(writes, before, after, rest.placed, None, tuple(notes), rest.in_effect)


def with_settings(tree: Mapping[str, Any], placed: Iterable[PlacedSetting]) -> dict[str, Any]:
    """A copy of a tree with each placed setting set at its effective path."""
    out = copy.deepcopy(dict(tree))
    for setting in placed:
        node = out
        for part in setting.path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[setting.path[-1]] = copy.deepcopy(setting.value)
    return out


def set_in_toml(path: str, text: str, edits: list[tuple[Path, Any]]) -> str:
    """Set values in a TOML text with tomlkit, keeping comments and layout elsewhere."""
    doc = tomlkit.parse(text)
    expected = tomllib.loads(text)
    for key_path, value in edits:
        _set_item(doc, key_path, value)
        node = expected
        for part in key_path[:-1]:
            node = node.setdefault(part, {})
        node[key_path[-1]] = value
    result = tomlkit.dumps(doc)
    if tomllib.loads(result) != expected:
        raise SynthesisError(
            f"{path}: editing with tomlkit did not give the intended data; edit it by hand"
        )
    return result


def _set_item(doc: tomlkit.TOMLDocument, key_path: Path, value: Any) -> None:
    node: Container | Table | Any = doc
    for depth, part in enumerate(key_path[:-1]):
        if part not in node:
            # Intermediate tables with nothing of their own print no [header] of their own.
            super_table = depth < len(key_path) - 2
            node[part] = tomlkit.table(is_super_table=super_table)
        node = node[part]
    node[key_path[-1]] = value


def _candidates(
    files: ConfigFiles,
    version: ContainerdVersion,
    before: EffectiveConfig,
    placed: tuple[PlacedSetting, ...],
) -> list[dict[str, list[tuple[Path, Any]]]]:
    docs = {p: parse_toml(p, files.files[p]) for p in before.load_order}
    main = files.main_path
    if version.merge_mode is MergeMode.REPLACE_PLUGIN_TABLES:
        edits: dict[str, list[tuple[Path, Any]]] = {}
        for setting in placed:
            table = setting.path[:2]
            for path in before.load_order:
                if path == main or has_path(docs[path], table):
                    edits.setdefault(path, []).append((setting.path, setting.value))
        return [edits]
    main_version = read_config_version(docs[main], main)
    native: dict[str, list[tuple[Path, Any]]] = {}
    v3_main: dict[str, list[tuple[Path, Any]]] = {}
    for setting in placed:
        for path in before.load_order:
            for spelling, value in ((setting.path, setting.value), (setting.v2_path, None)):
                if has_path(docs[path], spelling):
                    v = setting.value if value is not None else setting.setting.value
                    for target in (native, v3_main):
                        target.setdefault(path, []).append((spelling, v))
        main_has = has_path(docs[main], setting.path) or has_path(docs[main], setting.v2_path)
        if not main_has:
            own = setting.path if main_version == 3 else setting.v2_path
            own_value = setting.value if main_version == 3 else setting.setting.value
            native.setdefault(main, []).append((own, own_value))
            v3_main.setdefault(main, []).append((setting.path, setting.value))
    return [native, v3_main] if native != v3_main else [native]


def _render_edits(
    files: ConfigFiles, edits: Mapping[str, list[tuple[Path, Any]]]
) -> tuple[FileWrite, ...]:
    writes = []
    for path in sorted(edits):
        unique = list(dict.fromkeys((p, repr(v)) for p, v in edits[path]))
        values = {p: v for p, v in edits[path]}
        after = set_in_toml(path, files.files[path], [(p, values[p]) for p, _ in unique])
        if after != files.files[path]:
            writes.append(FileWrite(path, files.files[path], after))
    return tuple(writes)


def _combine(
    files: ConfigFiles, first: tuple[FileWrite, ...], second: tuple[FileWrite, ...]
) -> tuple[FileWrite, ...]:
    final = {w.path: w.after for w in first}
    final.update({w.path: w.after for w in second})
    return tuple(
        FileWrite(p, files.files.get(p), text)
        for p, text in sorted(final.items())
        if files.files.get(p) != text
    )


def _notes(
    files: ConfigFiles, version: ContainerdVersion, placed: tuple[PlacedSetting, ...]
) -> tuple[str, ...]:
    notes = []
    for setting in placed:
        key = setting.setting.key_path
        if key[:2] == ("containerd", "runtimes") and len(key) > 2 and key[2] in TOOLKIT_RUNTIMES:
            notes.append(
                f"{setting.setting.key}: the NVIDIA toolkit rewrites its own runtime handlers "
                "(copied from runc) whenever it starts; set this through the toolkit instead"
            )
    for shadowing in find_shadowing(files, version):
        if shadowing.kind is ShadowKind.TABLE_REPLACED:
            notes.append(f"{shadowing.describe()}; `repair_shadowing` restores them")
    return tuple(notes)


def _in_effect_notes(
    in_effect: tuple[PlacedSetting, ...],
    pending: tuple[PlacedSetting, ...],
    before: EffectiveConfig,
) -> tuple[str, ...]:
    if not pending:
        return ()  # the no-op reason says it for all of them
    notes = []
    for setting in in_effect:
        why = (
            f"set by {before.provenance[setting.path]}"
            if setting.path in before.provenance
            else f"the default ({before.defaults_source})"
        )
        notes.append(
            f"{setting.setting.key} = {setting.value!r} is already in effect ({why}); "
            "nothing is written for it"
        )
    return tuple(notes)
