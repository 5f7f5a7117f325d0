"""containerd's built-in defaults, and the seam that says where an effective config gets them.

containerd loads every setting no file makes from its built-in defaults, and `config dump`
prints them: on 2.1.9 `enable_cdi = true` and `registry.config_path = ''` are loaded values
although no file sets them. An effective diff computed from the files alone shows
"(absent) -> true" for such a key, and a synthesis from the files alone writes a setting that
is already in effect. So every effective config names a DefaultsSource:

- the real `config dump` of the version's binary on this machine (localdump.LocalContainerd),
  exact, used whenever scripts/fetch-containerd has cached that binary;
- the recorded defaults of the series (RecordedDefaults): the dump of a config with no
  settings and the dump of one empty runtime handler, recorded from the real binaries into
  rollout/containerd/data/ (tests/containerd/test_defaults.py checks and re-records them),
  overlaid with what the files set by the rules below;
- the files alone (FilesOnly): the merge model without defaults, for the model's own tests.

Overlay rules (measured against the real dumps of 1.6.20, 1.7.24 and 2.1.9): a setting a file
makes replaces the default, tables merge key by key, arrays are replaced. Runtime handlers: on
1.x a file's `containerd.runtimes` map *replaces* the default map (runc's defaults vanish as
soon as any file sets a runtime) and every handler starts from the zero handler; on 2.x a
handler merges into the default one of the same name (runc keeps its defaults) or starts from
the zero handler. 1.x drops the tables of plugins it does not know from the dump.
"""

from __future__ import annotations

import copy
import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

import tomli_w

from rollout.containerd.errors import UnsupportedVersion
from rollout.containerd.files import DEFAULT_MAIN_PATH, ConfigFiles
from rollout.containerd.version import (
    ContainerdVersion,
    MergeMode,
    dump_config_version,
    runtime_plugin_of,
)

RECORDED_SERIES = ("1.6", "1.7", "2.1")
FILES_ONLY = "the files alone (containerd's built-in defaults left out)"
DATA_PACKAGE = "rollout.containerd"
DATA_DIR = "data"
# The handler recorded as the zero handler: a name no real node uses.
TEMPLATE_RUNTIME = "rollout-zero-handler"
_RECORDED_FROM = re.compile(r"^# Recorded from containerd (\S+) ")


@dataclass(frozen=True)
class LoadedConfig:
    """What containerd loads from a set of files, and where its defaults came from."""

    tree: Mapping[str, Any]
    source: str


class DefaultsSource(Protocol):
    """The one seam for containerd's defaults: the loaded config of files the model merged."""

    def load(
        self, files: ConfigFiles, version: ContainerdVersion, configured: Mapping[str, Any]
    ) -> LoadedConfig:
        """The config `version` loads from `files`; `configured` is the model's merge of them."""
        ...


@dataclass(frozen=True)
class Defaults:
    """The recorded defaults of one series: the dump of no settings, and the zero handler."""

    series: str
    tree: Mapping[str, Any]
    runtime_entry: Mapping[str, Any]


class RecordedDefaults:
    """The recorded defaults of the version's series (the nearest recorded one of its major)."""

    def load(
        self, files: ConfigFiles, version: ContainerdVersion, configured: Mapping[str, Any]
    ) -> LoadedConfig:
        series = nearest_recorded_series(version)
        source = f"recorded defaults of containerd {series}"
        if series != version.series:
            source += f" (none recorded for {version.series})"
        return LoadedConfig(
            overlay_defaults(recorded_defaults(series), configured, version), source
        )


class FilesOnly:
    """No defaults: the effective config is what the files set (the merge model alone)."""

    def load(
        self, files: ConfigFiles, version: ContainerdVersion, configured: Mapping[str, Any]
    ) -> LoadedConfig:
        return LoadedConfig(copy.deepcopy(dict(configured)), FILES_ONLY)


def nearest_recorded_series(version: ContainerdVersion) -> str:
    """The recorded series closest to `version` within its major (2.0 -> 2.1, 2.4 -> 2.1)."""
    same_major = [s for s in RECORDED_SERIES if s.split(".")[0] == str(version.major)]
    if not same_major:
        raise UnsupportedVersion(f"no recorded containerd defaults for {version}")
    return min(same_major, key=lambda s: abs(int(s.split(".")[1]) - version.minor))


@functools.cache
def recorded_defaults(series: str) -> Defaults:
    """The defaults recorded for one series, from the package data."""
    if series not in RECORDED_SERIES:
        raise UnsupportedVersion(
            f"no recorded containerd defaults for {series}; recorded: {', '.join(RECORDED_SERIES)}"
        )
    data = resources.files(DATA_PACKAGE) / DATA_DIR
    tree = tomllib.loads((data / defaults_file_name(series)).read_text())
    entry = tomllib.loads((data / runtime_entry_file_name(series)).read_text())
    return Defaults(series, tree, entry)


@functools.cache
def recorded_release(series: str) -> str:
    """The release the series' defaults were recorded from (their data file's first line)."""
    data = resources.files(DATA_PACKAGE) / DATA_DIR
    head = (data / defaults_file_name(series)).read_text().split("\n", 1)[0]
    match = _RECORDED_FROM.match(head)
    return match.group(1) if match else series


def unmeasured_release_notes(version: ContainerdVersion) -> tuple[str, ...]:
    """What a plan warns of a node whose release is not one the models were measured on."""
    measured = [recorded_release(s) for s in RECORDED_SERIES]
    if str(version) in measured:
        return ()
    series = nearest_recorded_series(version)
    merge = (
        "whole plugin tables replaced"
        if version.merge_mode is MergeMode.REPLACE_PLUGIN_TABLES
        else "plugin tables deep-merged"
    )
    return (
        f"containerd {version} is not a measured release ({', '.join(measured)}): the offline "
        f"prediction used the containerd {series} model ({merge}, defaults of "
        f"{recorded_release(series)}); apply predicts again with the node's own binary "
        "(`containerd config dump` of the staged files on the node) and refuses the write "
        "unless that diff is exactly the intent",
    )


def defaults_file_name(series: str) -> str:
    return f"defaults-{series}.toml"


def runtime_entry_file_name(series: str) -> str:
    return f"runtime-entry-{series}.toml"


def render_recorded(defaults: Defaults, recorded_from: str) -> dict[str, str]:
    """The package data files of one series' defaults: file name -> TOML text."""
    head = (
        f"# Recorded from containerd {recorded_from} by tests/containerd/test_defaults.py "
        "(ROLLOUT_RECORD_DEFAULTS=1):\n"
    )
    return {
        defaults_file_name(defaults.series): head
        + "# `config dump` of a config with no settings.\n"
        + tomli_w.dumps(dict(defaults.tree)),
        runtime_entry_file_name(defaults.series): head
        + f"# the {TEMPLATE_RUNTIME} handler of a config defining it with no keys.\n"
        + tomli_w.dumps(dict(defaults.runtime_entry)),
    }


def probe_files(series: str) -> tuple[ConfigFiles, ConfigFiles]:
    """The configs whose dumps are the recorded defaults: no settings; one empty handler."""
    major = int(series.split(".")[0])
    config_version, cri = dump_config_version(major), runtime_plugin_of(major)
    empty = f"version = {config_version}\n"
    handler = empty + f'\n[plugins."{cri}".containerd.runtimes.{TEMPLATE_RUNTIME}]\n'
    return ConfigFiles(DEFAULT_MAIN_PATH, {DEFAULT_MAIN_PATH: empty}), ConfigFiles(
        DEFAULT_MAIN_PATH, {DEFAULT_MAIN_PATH: handler}
    )


def runtime_entry_of(dump: Mapping[str, Any], series: str) -> dict[str, Any]:
    """The zero handler in the dump of the second probe config."""
    cri = runtime_plugin_of(int(series.split(".")[0]))
    entry = dump["plugins"][cri]["containerd"]["runtimes"][TEMPLATE_RUNTIME]
    return dict(entry)


def overlay_defaults(
    defaults: Defaults, configured: Mapping[str, Any], version: ContainerdVersion
) -> dict[str, Any]:
    """What `version` loads: the files' merged settings over the recorded defaults."""
    out = copy.deepcopy(dict(defaults.tree))
    replace_maps = version.major < 2
    for key, value in configured.items():
        if key == "plugins" and isinstance(value, Mapping):
            plugins = out.setdefault("plugins", {})
            for plugin_id, table in value.items():
                if replace_maps and plugin_id not in plugins:
                    continue  # 1.x dumps only the plugins it knows
                plugins[plugin_id] = _overlay_plugin(
                    plugins.get(plugin_id), table, defaults.runtime_entry, replace_maps
                )
        else:
            out[key] = _merged(out.get(key), value)
    return out


def _overlay_plugin(
    default: Any, table: Any, zero_handler: Mapping[str, Any], replace_maps: bool
) -> Any:
    if not isinstance(table, Mapping) or not isinstance(default, Mapping):
        return copy.deepcopy(table)
    merged = _merged(default, {k: v for k, v in table.items() if k != "containerd"})
    containerd = table.get("containerd")
    if isinstance(containerd, Mapping):
        base = default.get("containerd")
        base = dict(base) if isinstance(base, Mapping) else {}
        ctd = _merged(base, {k: v for k, v in containerd.items() if k != "runtimes"})
        runtimes = containerd.get("runtimes")
        if isinstance(runtimes, Mapping):
            known = {} if replace_maps else dict(base.get("runtimes") or {})
            for name, handler in runtimes.items():
                start = known.get(name, zero_handler)
                known[name] = _merged(start, handler)
            ctd["runtimes"] = known
        merged["containerd"] = ctd
    return merged


def _merged(base: Any, value: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(value, Mapping):
        out = copy.deepcopy(dict(base))
        for key, item in value.items():
            out[key] = _merged(out.get(key), item)
        return out
    return copy.deepcopy(value)
