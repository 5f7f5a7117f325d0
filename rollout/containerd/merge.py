"""The merge model: what containerd makes of a main config and the files it imports.

Load order (containerd LoadConfig/resolveImports): the main file, then its `imports` in listed
order, breadth first; a file already loaded is skipped; a glob (an entry containing `*`)
expands in lexicographic order. Measured on the real binaries:

- relative plain paths resolve against the importing file's directory (1.6, 1.7, 2.1);
- relative globs resolve against the importing file's directory on 1.7 and 2.1, but against
  the *process working directory* on 1.6 (filepath.Glob on the raw entry); under systemd that
  is `/`, which is what the model assumes;
- a missing (non-glob) import: 1.6 and 1.7 refuse to load; 2.1 silently stops loading at that
  file, so every file still pending after it is ignored (reported as a warning).

Merging (mergo.Merge WithOverride): top-level scalars and the fields of [grpc], [debug], ...
take the later value only when it is non-zero (`oom_score = 0` in a drop-in changes nothing);
`imports`, `required_plugins`, `disabled_plugins` append (1.x keeps duplicates, 2.x skips
values already present); [timeouts], [proxy_plugins], [stream_processors] replace per key;
unknown top-level keys are ignored. Plugin tables: 1.x replaces the whole `plugins."X"` table
of an earlier file with the later one; 2.x merges deeply (a later scalar wins even when zero,
a later array replaces the earlier one, even an empty one). containerd 2.x then migrates
version-2 CRI settings (see migration.py).

`merge_files` is that model alone: what the files set. `load_effective` adds what containerd
loads without any file setting it, its built-in defaults, from one DefaultsSource (see
defaults.py): an effective diff compares loaded values, so a key that holds its default
before and after a change does not change.
"""

from __future__ import annotations

import copy
import fnmatch
import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from rollout.containerd.defaults import FILES_ONLY, DefaultsSource
from rollout.containerd.errors import ConfigParseError, ImportMissing, UnsupportedVersion
from rollout.containerd.files import ConfigFiles, parse_toml
from rollout.containerd.localdump import standard_defaults
from rollout.containerd.migration import SERVER_KEYS, migrate_cri_tables, prune_v2_cri_table
from rollout.containerd.version import CRI_V2, ContainerdVersion, MergeMode, read_config_version
from rollout.memo import BoundedCache

SCALAR_KEYS = ("version", "root", "state", "temp", "plugin_dir", "oom_score")
LIST_KEYS = ("imports", "required_plugins", "disabled_plugins")
STRUCT_KEYS = ("grpc", "ttrpc", "debug", "metrics", "cgroup")
KEYED_KEYS = ("timeouts", "proxy_plugins", "stream_processors")
PLUGINS = "plugins"

Path = tuple[str, ...]


@dataclass(frozen=True)
class Leaf:
    """A value in a tree under merge, with the file that set it."""

    value: Any
    source: str


@dataclass(frozen=True)
class EffectiveConfig:
    """The config containerd would run with: what the files set, over the version's defaults.

    `tree` is what containerd loads, its built-in defaults taken from `defaults_source` (see
    defaults.py); `configured` is what the files alone set, merged (the merge model: the same
    as `tree` when `defaults_source` is FILES_ONLY). Both are plain dicts and values, `imports`
    left out (it is bookkeeping, not config). `provenance` maps each leaf path the files set to
    the file that set it; `warnings` says what containerd would ignore or skip, and
    `ignored_for_version` which leaves of which file it reads but ignores for the merged
    config version (2.x: version-2 CRI keys once a version-3 file was loaded last).
    """

    version: ContainerdVersion
    config_version: int
    tree: Mapping[str, Any]
    load_order: tuple[str, ...]
    provenance: Mapping[Path, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    configured: Mapping[str, Any] = field(default_factory=dict)
    defaults_source: str = FILES_ONLY
    ignored_for_version: Mapping[str, tuple[Path, ...]] = field(default_factory=dict)

    def plugin(self, plugin_id: str) -> Mapping[str, Any]:
        """The table of one plugin as the files set it, empty when no file sets it."""
        plugins = self.configured.get(PLUGINS, {})
        table = plugins.get(plugin_id, {}) if isinstance(plugins, Mapping) else {}
        return table if isinstance(table, Mapping) else {}

    def get(self, path: Path, default: Any = None) -> Any:
        """The value at a path of the tree, or `default`."""
        return find_value(self.tree, path, default)

    def sources_of(self, plugin_id: str) -> tuple[str, ...]:
        """The files, in load order, whose keys make up a plugin's effective table."""
        found = {src for path, src in self.provenance.items() if path[:2] == (PLUGINS, plugin_id)}
        return tuple(p for p in self.load_order if p in found)


def resolve_load_order(
    files: ConfigFiles, version: ContainerdVersion
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The files containerd loads, in order, and warnings about what it skips."""
    order: list[str] = []
    warnings: list[str] = []
    loaded: set[str] = set()
    pending: list[tuple[str, str | None]] = [(files.main_path, None)]
    directories = files.directories()
    while pending:
        path, importer = pending.pop(0)
        if path in loaded:
            continue
        if path in directories:
            raise ConfigParseError(
                f"{importer}: import {path} is a directory, not a config file", path=importer
            )
        if path not in files.files:
            if version.major < 2:
                raise ImportMissing(
                    f"{importer}: imports {path}, which does not exist; containerd {version} "
                    "refuses to start (create the file or remove the import)",
                    path=importer,
                )
            warnings.append(
                f"{importer}: imports {path}, which does not exist; containerd {version} stops "
                "loading there and ignores every file still pending"
                + (f": {', '.join(p for p, _ in pending)}" if pending else "")
            )
            break
        doc = parse_toml(path, files.files[path])
        loaded.add(path)
        order.append(path)
        for entry in _imports_of(path, doc):
            for target in resolve_import(path, entry, version, files):
                pending.append((target, path))
    return tuple(order), tuple(warnings)


def resolve_import(
    importer: str, entry: str, version: ContainerdVersion, files: ConfigFiles
) -> list[str]:
    """The paths one `imports` entry stands for, as this containerd version resolves it."""
    is_glob = "*" in entry
    if is_glob and not posixpath.isabs(entry) and (version.major, version.minor) < (1, 7):
        # 1.6 globs the raw entry, relative to the process working directory: `/` under systemd.
        pattern = posixpath.normpath(posixpath.join("/", entry))
    else:
        pattern = posixpath.normpath(posixpath.join(posixpath.dirname(importer), entry))
    if not is_glob:
        return [pattern]
    candidates = set(files.files) | files.directories()
    return sorted((p for p in candidates if _glob_match(pattern, p)), key=lambda p: p.split("/"))


def load_effective(
    files: ConfigFiles, version: ContainerdVersion, defaults: DefaultsSource | None = None
) -> EffectiveConfig:
    """The config `version` loads from the files, defaults from `defaults` (see defaults.py).

    Without a source, the standard one: the real binary of the series when this machine has
    it cached, else the recorded defaults of the series.
    """
    return with_defaults(merge_files(files, version), files, defaults)


def with_defaults(
    merged: EffectiveConfig, files: ConfigFiles, defaults: DefaultsSource | None = None
) -> EffectiveConfig:
    """A merge-model result (merge_files) completed with containerd's defaults."""
    source = defaults if defaults is not None else standard_defaults()
    loaded = source.load(files, merged.version, merged.configured)
    return replace(merged, tree=loaded.tree, defaults_source=loaded.source)


# Distinct (version, files) whose merge is kept: recorded facts are checked by merging them,
# then planned, and a fleet repeats a few node configurations many times.
MERGED_CONFIGS = 256
_MergeKey = tuple[ContainerdVersion, str, tuple[tuple[str, str], ...]]
_merged: BoundedCache[_MergeKey, EffectiveConfig] = BoundedCache(MERGED_CONFIGS)


def merge_files(files: ConfigFiles, version: ContainerdVersion) -> EffectiveConfig:
    """Merge the files as `version` of containerd does: what they set, without defaults.

    Computed once per distinct version and file contents; the result is a shared value that
    callers only read (errors are not kept: they are raised again, naming the file).
    """
    key: _MergeKey = (version, files.main_path, tuple(files.files.items()))
    return _merged.get_or_compute(key, lambda: _merge_files(files, version))


def _merge_files(files: ConfigFiles, version: ContainerdVersion) -> EffectiveConfig:
    order, warnings = resolve_load_order(files, version)
    merged: dict[str, Any] = {}
    warn = list(warnings)
    config_version = 0
    ignored: dict[str, tuple[Path, ...]] = {}
    for path in order:
        doc = parse_toml(path, files.files[path])
        file_version = doc.get("version", 0)
        read_config_version(doc, path)
        if isinstance(file_version, int) and file_version:
            config_version = file_version
        _merge_file(merged, _annotate(doc, path), version, path, warn)
    merged.pop("imports", None)
    config_version = config_version or 1
    if version.major >= 2:
        if config_version == 1:
            raise UnsupportedVersion(
                f"{files.main_path}: config version 1 is not supported by containerd {version}",
                path=files.main_path,
            )
        plugins = merged.get(PLUGINS)
        if isinstance(plugins, dict):
            if config_version < 3:
                migrate_cri_tables(plugins, lambda leaf: Leaf([leaf.value], leaf.source))
            else:
                ignored = _leaves_by_source(plugins.get(CRI_V2), (PLUGINS, CRI_V2), SERVER_KEYS)
                names = prune_v2_cri_table(plugins)
                if names:
                    warn.append(
                        "the merged config is version 3, so containerd ignores the version-2 "
                        f"CRI keys {', '.join(names)} (a version-3 file was loaded last)"
                    )
        merged["version"] = Leaf(3, merged["version"].source if "version" in merged else "")
        config_version = 3
    elif config_version > version.max_config_version:
        raise UnsupportedVersion(
            f"config version {config_version} needs containerd 2.x; this node runs {version}"
        )
    tree, provenance = _strip(merged)
    return EffectiveConfig(
        version=version,
        config_version=config_version,
        tree=tree,
        load_order=order,
        provenance=MappingProxyType(provenance),
        warnings=tuple(warn),
        configured=tree,
        ignored_for_version=MappingProxyType(ignored),
    )


def _leaves_by_source(
    table: Any, prefix: Path, kept: tuple[str, ...]
) -> dict[str, tuple[Path, ...]]:
    """The leaves of an annotated table outside its `kept` top keys, grouped by their file."""
    found: dict[str, list[Path]] = {}
    if isinstance(table, dict):
        for key, value in table.items():
            if key not in kept:
                for leaf, source in _sourced_leaves(value, (*prefix, key)):
                    found.setdefault(source, []).append(leaf)
    return {source: tuple(leaves) for source, leaves in found.items()}


def _sourced_leaves(value: Any, path: Path) -> Iterator[tuple[Path, str]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from _sourced_leaves(inner, (*path, key))
    elif isinstance(value, Leaf):
        yield path, value.source


def merge_plugin_tables_deeply(files: ConfigFiles, version: ContainerdVersion) -> EffectiveConfig:
    """What the files set if plugin tables merged deeply (what 1.x users usually expect)."""
    deep = ContainerdVersion(2, 0, 0, raw="deep-merge model")
    order, _ = resolve_load_order(files, version)
    merged: dict[str, Any] = {}
    for path in order:
        _merge_file(merged, _annotate(parse_toml(path, files.files[path]), path), deep, path, [])
    merged.pop("imports", None)
    tree, provenance = _strip(merged)
    base = merge_files(files, version)
    deep_tree = {**base.tree, PLUGINS: tree.get(PLUGINS, {})} if PLUGINS in tree else base.tree
    return EffectiveConfig(
        version=version,
        config_version=base.config_version,
        tree=deep_tree,
        load_order=order,
        provenance=MappingProxyType(
            {
                **{p: s for p, s in base.provenance.items() if p[0] != PLUGINS},
                **{p: s for p, s in provenance.items() if p[0] == PLUGINS},
            }
        ),
        warnings=base.warnings,
        configured=deep_tree,
    )


def find_value(tree: Mapping[str, Any], path: Path, default: Any = None) -> Any:
    """The value at a key path of a tree, or `default` where the path does not exist."""
    node: Any = tree
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def iter_leaves(tree: Mapping[str, Any], prefix: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every leaf of a plain tree; an empty table counts as a leaf (its presence is config)."""
    for key, value in tree.items():
        path = (*prefix, key)
        if isinstance(value, Mapping) and value:
            yield from iter_leaves(value, path)
        else:
            yield path, value


def _imports_of(path: str, doc: Mapping[str, Any]) -> list[str]:
    imports = doc.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        raise ConfigParseError(f"{path}: `imports` must be an array of strings", path=path)
    return list(imports)


def _glob_match(pattern: str, path: str) -> bool:
    # Go's filepath.Glob: `*` never crosses `/`, `[^x]` negates; fnmatch per segment does that.
    pat_parts, path_parts = pattern.split("/"), path.split("/")
    if len(pat_parts) != len(path_parts):
        return False
    return all(
        fnmatch.fnmatchcase(name, part.replace("[^", "[!"))
        for part, name in zip(pat_parts, path_parts, strict=True)
    )


def _annotate(doc: Mapping[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out[key] = _annotate(value, source) if isinstance(value, dict) else Leaf(value, source)
    return out


def _strip(tree: Mapping[str, Any], prefix: Path = ()) -> tuple[dict[str, Any], dict[Path, str]]:
    plain: dict[str, Any] = {}
    provenance: dict[Path, str] = {}
    for key, value in tree.items():
        path = (*prefix, key)
        if isinstance(value, dict):
            plain[key], sub = _strip(value, path)
            provenance.update(sub)
        else:
            plain[key] = copy.deepcopy(value.value)
            provenance[path] = value.source
    return plain, provenance


def _is_zero(value: Any) -> bool:
    return value in (0, "", False) or value == [] or value == {}


def _merge_file(
    into: dict[str, Any],
    doc: dict[str, Any],
    version: ContainerdVersion,
    path: str,
    warnings: list[str],
) -> None:
    for key, value in doc.items():
        if key in SCALAR_KEYS:
            if isinstance(value, Leaf) and not _is_zero(value.value):
                into[key] = value
        elif key in LIST_KEYS:
            if isinstance(value, Leaf) and isinstance(value.value, list):
                into[key] = _append(into.get(key), value, dedupe=version.major >= 2)
        elif key in STRUCT_KEYS:
            if isinstance(value, dict):
                table = into.setdefault(key, {})
                for field_name, field_value in value.items():
                    if isinstance(field_value, Leaf) and not _is_zero(field_value.value):
                        table[field_name] = field_value
        elif key in KEYED_KEYS:
            if isinstance(value, dict):
                into.setdefault(key, {}).update(value)
        elif key == PLUGINS:
            if isinstance(value, dict):
                plugins = into.setdefault(PLUGINS, {})
                for plugin_id, table in value.items():
                    if version.merge_mode is MergeMode.REPLACE_PLUGIN_TABLES:
                        plugins[plugin_id] = table
                    elif isinstance(table, dict) and isinstance(plugins.get(plugin_id), dict):
                        _deep_merge(plugins[plugin_id], table)
                    else:
                        plugins[plugin_id] = table
        else:
            warnings.append(f"{path}: containerd ignores the unknown top-level key {key!r}")


def _append(existing: Leaf | None, new: Leaf, *, dedupe: bool) -> Leaf:
    values = list(existing.value) if existing is not None else []
    for item in new.value:
        if not dedupe or item not in values:
            values.append(item)
    return Leaf(values, new.source if new.value else (existing.source if existing else new.source))


def _deep_merge(into: dict[str, Any], table: dict[str, Any]) -> None:
    for key, value in table.items():
        current = into.get(key)
        if isinstance(value, dict) and isinstance(current, dict):
            _deep_merge(current, value)
        elif isinstance(value, dict):
            into[key] = value
        else:
            into[key] = value
