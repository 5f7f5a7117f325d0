"""The keys of a runc-shim runtime handler's `options`: what containerd decodes, per version.

containerd hands a handler's `options` table to the shim as the shim's own options message
and drops every key the message has no field for, silently:
`containerd.runtimes.nvidia.options.SystemdCgroups = true` loads, `config dump` prints it,
and the real key `SystemdCgroup` stays false. So a key the message lacks is refused, with the
nearest real key.

The keys are measured where the binary shows them: the recorded `config dump` of each series
(defaults.py) holds runc's default `options`. On 1.x that dump is the whole message (the
struct marshalled). On 2.x it is a template that leaves out three fields of runc's Options
(api/types/runc/options/oci.proto): those come from the source, named below. Handlers of
another shim (kata, gVisor) have their own options and are not checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from rollout.containerd.defaults import nearest_recorded_series, recorded_defaults
from rollout.containerd.errors import UnknownCriSetting
from rollout.containerd.intent import CriSetting
from rollout.containerd.runtimehandlers import find_runtime_handler
from rollout.containerd.version import ContainerdVersion, runtime_plugin_of

RUNC_SHIMS = frozenset({"io.containerd.runc.v2", "io.containerd.runc.v1"})
# In runc's Options message on 2.x but not in the `config dump` template (source:
# api/types/runc/options/oci.proto, fields 1, 12 and 13).
_SOURCE_ONLY_2 = frozenset({"NoPivotRoot", "TaskApiAddress", "TaskApiVersion"})


class UnknownRuntimeOption(UnknownCriSetting):
    """A runtime handler's option key that the runtime's options message does not have."""


def runc_option_keys(version: ContainerdVersion) -> frozenset[str]:
    """The keys of runc's options table on `version`, from its series' recorded dump."""
    defaults = recorded_defaults(nearest_recorded_series(version))
    cri = runtime_plugin_of(version.major)
    options = defaults.tree["plugins"][cri]["containerd"]["runtimes"]["runc"]["options"]
    return frozenset(options) | (_SOURCE_ONLY_2 if version.major >= 2 else frozenset())


def check_runtime_options(
    setting: CriSetting, version: ContainerdVersion, runtime_type: str | None
) -> None:
    """UnknownRuntimeOption for an options key of a runc handler that runc does not know.

    `runtime_type` is the handler's, as the plan or the node's config sets it; None (set
    nowhere) is taken for runc, the shim of the toolkit's handlers and containerd's default.
    """
    if runtime_type is not None and runtime_type not in RUNC_SHIMS:
        return
    handler = handler_of(setting)
    if handler is None:
        return
    name, table = handler
    options = table.get("options")
    if not isinstance(options, Mapping):
        return
    known = runc_option_keys(version)
    for key in options:
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        close = close or [k for k in sorted(known) if k.lower() == str(key).lower()]
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UnknownRuntimeOption(
            f"{setting.key!r}: runtime {name!r} runs runc, whose options on containerd "
            f"{version} have no key {key!r}; {hint}containerd would drop it silently "
            f"(runc's option keys: {', '.join(sorted(known))})"
        )


def handler_of(setting: CriSetting) -> tuple[str, Mapping[str, Any]] | None:
    """The runtime handler a setting writes into, and what it writes there as a table."""
    path = setting.key_path
    if len(path) < 3 or path[:2] != ("containerd", "runtimes"):
        return None
    value: Any = setting.value
    for part in reversed(path[3:]):
        value = {part: value}
    return (path[2], value) if isinstance(value, Mapping) else None


def runtime_type_in(
    name: str, settings: tuple[CriSetting, ...], tree: Mapping[str, Any]
) -> str | None:
    """A handler's runtime_type: as the plan's settings set it, else as the node's merged
    config (`tree`, either CRI layout) has it, else None."""
    for setting in settings:
        handler = handler_of(setting)
        if handler is not None and handler[0] == name:
            stated = handler[1].get("runtime_type")
            if isinstance(stated, str):
                return stated
    entry = find_runtime_handler(tree, name)
    if entry is not None and isinstance(entry.get("runtime_type"), str):
        return str(entry["runtime_type"])
    return None
