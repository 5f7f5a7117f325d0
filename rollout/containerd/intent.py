"""The intended CRI change, version-neutral, and where each setting lands per containerd.

Users name CRI settings the way most documentation does: relative to the version-2 CRI table
`plugins."io.containerd.grpc.v1.cri"` (e.g. `registry.config_path`, `enable_cdi`,
`containerd.runtimes.nvidia.options.SystemdCgroup`). On containerd 1.x (config version 2) that
is the effective path. On containerd 2.x the effective config is version 3, and each key lands
where containerd's own migration puts it (see migration.py): image keys in
`io.containerd.cri.v1.images`, streaming-server keys stay in `io.containerd.grpc.v1.cri`,
the rest in `io.containerd.cri.v1.runtime`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.containerd.errors import UnknownCriSetting, UnsupportedVersion
from rollout.containerd.migration import (
    IMAGE_CONTAINERD_KEYS,
    IMAGE_KEYS,
    SANDBOX_IMAGE,
    SERVER_KEYS,
)
from rollout.containerd.schema import check_setting_type
from rollout.containerd.version import (
    CRI_IMAGES,
    CRI_RUNTIME,
    CRI_V2,
    ContainerdVersion,
)

Path = tuple[str, ...]

# Top-level keys of the v2 CRI table (from `config dump` of 1.6.20 and 1.7.24).
_V2_KEYS_16 = frozenset(
    [
        "cni",
        "containerd",
        "device_ownership_from_security_context",
        "disable_apparmor",
        "disable_cgroup",
        "disable_hugetlb_controller",
        "disable_proc_mount",
        "disable_tcp_service",
        "enable_selinux",
        "enable_tls_streaming",
        "enable_unprivileged_icmp",
        "enable_unprivileged_ports",
        "ignore_image_defined_volumes",
        "image_decryption",
        "max_concurrent_downloads",
        "max_container_log_line_size",
        "netns_mounts_under_state_dir",
        "registry",
        "restrict_oom_score_adj",
        "sandbox_image",
        "selinux_category_range",
        "stats_collect_period",
        "stream_idle_timeout",
        "stream_server_address",
        "stream_server_port",
        "systemd_cgroup",
        "tolerate_missing_hugetlb_controller",
        "unset_seccomp_profile",
        "x509_key_pair_streaming",
    ]
)
_V2_KEYS_17 = _V2_KEYS_16 | frozenset(
    [
        "cdi_spec_dirs",
        "drain_exec_sync_io_timeout",
        "enable_cdi",
        "ignore_deprecation_warnings",
        "image_pull_progress_timeout",
        "image_pull_with_sync_fs",
    ]
)
# Keys containerd 2.x dropped: a v2 file may still carry them, but they do nothing.
_REMOVED_IN_2 = frozenset({"systemd_cgroup", "disable_cgroup"})
_CONTAINERD_KEYS_1 = frozenset(
    [
        "default_runtime",
        "default_runtime_name",
        "disable_snapshot_annotations",
        "discard_unpacked_layers",
        "ignore_rdt_not_enabled_errors",
        "ignore_blockio_not_enabled_errors",
        "no_pivot",
        "runtimes",
        "snapshotter",
        "untrusted_workload_runtime",
    ]
)
_CONTAINERD_REMOVED_IN_2 = frozenset({"default_runtime", "no_pivot", "untrusted_workload_runtime"})
# Tables whose inner keys are free-form or too many to list.
_OPEN_TABLES = frozenset({"cni", "registry", "image_decryption", "x509_key_pair_streaming"})


def parse_dotted(key: str) -> Path:
    """Split a dotted key; segments with dots go in double quotes: registry.mirrors."a.b"."""
    parts: list[str] = []
    current = ""
    quoted = False
    just_closed = False
    for char in key:
        if char == '"':
            quoted = not quoted
            just_closed = not quoted
            continue
        if char == "." and not quoted:
            if not current and not just_closed:
                raise UnknownCriSetting(f"empty segment in CRI key {key!r}")
            parts.append(current)
            current, just_closed = "", False
            continue
        current += char
    if quoted or (not current and not just_closed):
        raise UnknownCriSetting(f"malformed CRI key {key!r}")
    parts.append(current)
    return tuple(parts)


@dataclass(frozen=True)
class CriSetting:
    """One CRI setting: a key relative to the version-2 CRI table, and its value."""

    key: str
    value: Any
    # the key split once, at construction: a malformed key fails where the setting is made
    key_path: Path = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_path", parse_dotted(self.key))


@dataclass(frozen=True)
class Intent:
    """A set of CRI settings to make effective, whatever the containerd version."""

    settings: tuple[CriSetting, ...]

    def __post_init__(self) -> None:
        paths = [s.key_path for s in self.settings]
        for i, a in enumerate(paths):
            for b in paths[i + 1 :]:
                if a[: len(b)] == b or b[: len(a)] == a:
                    raise UnknownCriSetting(
                        f"intent sets both {'.'.join(a)} and {'.'.join(b)}: one contains the other"
                    )
            if self.settings[i].value is None:
                raise UnknownCriSetting(f"{'.'.join(a)}: a CRI setting needs a value")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> Intent:
        """An intent from {"registry.config_path": "/etc/containerd/certs.d", ...}."""
        return cls(tuple(CriSetting(k, v) for k, v in settings.items()))

    def describe(self) -> str:
        return ", ".join(f"{s.key} = {s.value!r}" for s in self.settings)


@dataclass(frozen=True)
class PlacedSetting:
    """A CRI setting placed for one containerd: its effective path and value, and its v2 path."""

    setting: CriSetting
    path: Path
    value: Any
    v2_path: Path

    @property
    def plugin_id(self) -> str:
        return self.path[1]


def place_setting(
    setting: CriSetting, version: ContainerdVersion, config_version: int = 2
) -> PlacedSetting:
    """Where a setting is effective on `version`; UnknownCriSetting, or SettingTypeError for
    a value containerd cannot load there (see schema.py)."""
    placed = _place(setting, version, config_version)
    check_setting_type(setting.key, placed.path, placed.value, version)
    return placed


def _place(setting: CriSetting, version: ContainerdVersion, config_version: int) -> PlacedSetting:
    key = setting.key_path
    _check_known(key, version, setting.key)
    v2_path = ("plugins", CRI_V2, *key)
    if version.major < 2:
        if config_version != 2:
            raise UnsupportedVersion(
                f"config version {config_version} on containerd {version}: rollout places CRI "
                "settings in version-2 configs only (migrate with `containerd config migrate`)"
            )
        return PlacedSetting(setting, v2_path, setting.value, v2_path)
    head = key[0]
    if head == SANDBOX_IMAGE:
        return PlacedSetting(
            setting, ("plugins", CRI_IMAGES, "pinned_images", "sandbox"), setting.value, v2_path
        )
    if head in IMAGE_KEYS:
        return PlacedSetting(setting, ("plugins", CRI_IMAGES, *key), setting.value, v2_path)
    if head in SERVER_KEYS:
        return PlacedSetting(setting, v2_path, setting.value, v2_path)
    if head == "containerd" and len(key) >= 2 and key[1] in IMAGE_CONTAINERD_KEYS:
        return PlacedSetting(setting, ("plugins", CRI_IMAGES, *key[1:]), setting.value, v2_path)
    if key == ("cni", "bin_dir"):
        return PlacedSetting(
            setting, ("plugins", CRI_RUNTIME, "cni", "bin_dirs"), [setting.value], v2_path
        )
    if head == "containerd" and len(key) >= 4 and key[1] == "runtimes" and key[3] == "sandbox_mode":
        path = ("plugins", CRI_RUNTIME, *key[:3], "sandboxer", *key[4:])
        return PlacedSetting(setting, path, setting.value, v2_path)
    return PlacedSetting(setting, ("plugins", CRI_RUNTIME, *key), setting.value, v2_path)


def place_intent(
    intent: Intent, version: ContainerdVersion, config_version: int = 2
) -> tuple[PlacedSetting, ...]:
    """Every setting of the intent, placed for `version`."""
    return tuple(place_setting(s, version, config_version) for s in intent.settings)


def _check_known(key: Path, version: ContainerdVersion, raw: str) -> None:
    known = _V2_KEYS_16 if (version.major, version.minor) < (1, 7) else _V2_KEYS_17
    if version.major >= 2:
        known = known - _REMOVED_IN_2
    head = key[0]
    if head not in known:
        hint = " (removed in containerd 2.x)" if head in _REMOVED_IN_2 else ""
        raise UnknownCriSetting(
            f"{raw!r}: {head!r} is not a CRI setting of containerd {version}{hint}; keys are "
            'relative to plugins."io.containerd.grpc.v1.cri", e.g. registry.config_path'
        )
    if head == "containerd":
        if len(key) < 2:
            raise UnknownCriSetting(f"{raw!r}: name a key inside the containerd table")
        inner = _CONTAINERD_KEYS_1 - (_CONTAINERD_REMOVED_IN_2 if version.major >= 2 else set())
        if key[1] not in inner:
            raise UnknownCriSetting(
                f"{raw!r}: {key[1]!r} is not a key of the CRI containerd table on containerd "
                f"{version}"
            )
        if key[1] == "runtimes" and len(key) < 4:
            raise UnknownCriSetting(
                f"{raw!r}: name a key of one runtime, e.g. containerd.runtimes.nvidia.runtime_type"
            )
    elif len(key) > 1 and head not in _OPEN_TABLES:
        raise UnknownCriSetting(f"{raw!r}: {head!r} is a value, not a table")
