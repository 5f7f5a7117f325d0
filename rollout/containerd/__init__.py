"""The containerd config engine: merge model, drop-in synthesis, staged prediction, hosts.toml.

Public API (details in each module's docstring):

- version: `ContainerdVersion.from_output(text)` / `parse_version(text)` (`.series`,
  `.merge_mode`), `MergeMode`, `read_config_version(doc)`, `cri_plugin_ids(config_version)`;
  the CRI plugin ids (`CRI_V2`, `CRI_RUNTIME`, `CRI_IMAGES`, `RUNTIME_PLUGIN`), defined only here;
  `runtime_plugin_of(major)`: the plugin that holds a release's runtime handlers.
- files: `ConfigFiles(main_path, files)`, the node's config files as recorded.
- merge: `load_effective(files, version, defaults=None) -> EffectiveConfig` (tree: what
  containerd loads; configured: what the files set; defaults_source; load_order, provenance,
  warnings), `merge_files(files, version)` (the merge model alone), `resolve_load_order`.
- defaults: the `DefaultsSource` seam (`load(files, version, configured) -> LoadedConfig`):
  `LocalContainerd` (the cached real binary's dump, by content; the standard source,
  `standard_defaults()`), `RecordedDefaults` (package data, per series), `FilesOnly`;
  `unmeasured_release_notes(version)`: what a plan warns of a release the models were not
  measured on (none for 1.6.20, 1.7.24, 2.1.9).
- diff: `diff_effective(before, after) -> list[Change]`, `render_diff_text(before, after)`.
- intent: `CriSetting(key, value)`, `Intent(settings)`, `place_intent(intent, version,
  config_version) -> tuple[PlacedSetting, ...]`, `place_setting` (one; its value's type is
  checked against the version's defaults by schema.py: SettingTypeError).
- synthesis: `synthesize(files, version, intent, defaults=None) -> Synthesis` (writes:
  FileWrite(path, before, after); in_effect; defaults_source), `repair_shadowing(files,
  version, intent, defaults=None)`, `apply_writes(files, writes)`.
- shadowing: `find_shadowing(files, version) -> list[Shadowing]` (`.describe()`).
- unloaded: `find_unloaded(files, version) -> list[Unloaded]`: every file whose settings
  containerd does not load (shadowed, ignored for the version, imported by nothing), why and
  what to do (`.describe()`, `.handlers`); what plan warns about and diagnose reports.
- dump: `dump_command(containerd_bin, config_path)` (the one argv of a real `config dump`,
  run from `/`), `parse_dump(text, host)` (its output as a tree).
- staging/prediction: `dump_config(runner, containerd_bin, files)`, `dump_configs(...)`,
  `predict(runner, containerd_bin, files, writes, intent, version) -> Prediction`.
- hosts: `render_hosts_toml(server, hosts)`, `HostEndpoint`, `hosts_namespace(registry)`,
  `hosts_toml_path(config_path, registry)`.
- runtimeoptions: `check_runtime_options(setting, version, runtime_type)` (a runc handler's
  options key runc does not know: UnknownRuntimeOption, with the nearest real key),
  `runtime_type_in(handler, settings, tree)`.
- runtimehandlers: `list_runtime_handlers(tree)` (the one reading of the handlers a dump, the
  merge model's tree or a file defines, either CRI layout), `find_runtime_handler(tree, name)`.
- errors: `ContainerdConfigError` and its subclasses in rollout.containerd.errors.
"""

from rollout.containerd.defaults import (
    FILES_ONLY,
    DefaultsSource,
    FilesOnly,
    LoadedConfig,
    RecordedDefaults,
    unmeasured_release_notes,
)
from rollout.containerd.diff import (
    Change,
    ChangeKind,
    diff_effective,
    format_path,
    render_diff_text,
)
from rollout.containerd.dump import dump_command, parse_dump
from rollout.containerd.errors import (
    ConfigParseError,
    ContainerdConfigError,
    ImportMissing,
    PredictionRefused,
    SettingTypeError,
    StagingFailed,
    SynthesisError,
    UnknownCriSetting,
    UnsupportedVersion,
    VersionUnknown,
)
from rollout.containerd.files import ConfigFiles
from rollout.containerd.hosts import (
    HostEndpoint,
    hosts_namespace,
    hosts_toml_path,
    render_hosts_toml,
)
from rollout.containerd.intent import (
    CriSetting,
    Intent,
    PlacedSetting,
    place_intent,
    place_setting,
)
from rollout.containerd.localdump import LocalContainerd, standard_defaults
from rollout.containerd.merge import (
    EffectiveConfig,
    find_value,
    load_effective,
    merge_files,
    resolve_load_order,
)
from rollout.containerd.prediction import Prediction, predict
from rollout.containerd.runtimeoptions import (
    UnknownRuntimeOption,
    check_runtime_options,
    runtime_type_in,
)
from rollout.containerd.shadowing import Shadowing, ShadowKind, find_shadowing, repair_scope
from rollout.containerd.staging import dump_config, dump_configs
from rollout.containerd.synthesis import (
    FileWrite,
    Synthesis,
    apply_writes,
    repair_shadowing,
    synthesize,
)
from rollout.containerd.unloaded import Unloaded, UnloadedKind, find_unloaded
from rollout.containerd.version import (
    ContainerdVersion,
    MergeMode,
    cri_plugin_ids,
    parse_version,
    read_config_version,
)

__all__ = [
    "FILES_ONLY",
    "Change",
    "ChangeKind",
    "ConfigFiles",
    "ConfigParseError",
    "ContainerdConfigError",
    "ContainerdVersion",
    "CriSetting",
    "DefaultsSource",
    "EffectiveConfig",
    "FileWrite",
    "FilesOnly",
    "HostEndpoint",
    "ImportMissing",
    "Intent",
    "LoadedConfig",
    "LocalContainerd",
    "MergeMode",
    "PlacedSetting",
    "Prediction",
    "PredictionRefused",
    "RecordedDefaults",
    "SettingTypeError",
    "ShadowKind",
    "Shadowing",
    "StagingFailed",
    "Synthesis",
    "SynthesisError",
    "UnknownCriSetting",
    "UnknownRuntimeOption",
    "Unloaded",
    "UnloadedKind",
    "UnsupportedVersion",
    "VersionUnknown",
    "apply_writes",
    "check_runtime_options",
    "cri_plugin_ids",
    "diff_effective",
    "dump_command",
    "dump_config",
    "dump_configs",
    "find_shadowing",
    "find_unloaded",
    "find_value",
    "format_path",
    "hosts_namespace",
    "hosts_toml_path",
    "load_effective",
    "merge_files",
    "parse_dump",
    "parse_version",
    "place_intent",
    "place_setting",
    "predict",
    "read_config_version",
    "render_diff_text",
    "render_hosts_toml",
    "repair_scope",
    "repair_shadowing",
    "resolve_load_order",
    "runtime_type_in",
    "standard_defaults",
    "synthesize",
    "unmeasured_release_notes",
]
