"""The type check of CRI settings (schema.py) against the real binaries: what `rollout plan`
accepts, containerd loads; what it refuses for its type, containerd refuses to load (or, for
an integer beyond int64 on 1.7, silently loads as another value).

Runtime `options` are left out of the second half: containerd keeps them as an untyped
table until a container starts (the shim decodes them then), so `config dump` loads any
type there; rollout refuses a wrong one anyway, before it breaks the node's pods.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomli_w

from rollout.commands import CommandFailed
from rollout.containerd import (
    ConfigFiles,
    ContainerdVersion,
    CriSetting,
    SettingTypeError,
    StagingFailed,
    find_value,
    place_setting,
)
from tests.containerd.realdump import real_dumps, version_of

MAIN = "/etc/containerd/config.toml"
ACCEPTED: list[tuple[str, Any]] = [
    ("max_concurrent_downloads", 7),
    ("disable_apparmor", True),
    ("sandbox_image", "registry.k8s.io/pause:3.9"),
    ("stream_server_port", "10011"),
    ("cni", {"bin_dir": "/opt/cni/bin", "max_conf_num": 2}),
    ("containerd.runtimes.nvidia.runtime_type", "io.containerd.runc.v2"),
    ("containerd.runtimes.nvidia.privileged_without_host_devices", True),
    ("containerd.runtimes.nvidia.options.SystemdCgroup", True),
    ("containerd.runtimes.nvidia.options.BinaryName", "/usr/bin/nvidia-container-runtime"),
    ("registry.config_path", "/etc/containerd/certs.d"),
]
# (key, a value of the right type to find where it lands, the wrong value)
REFUSED: list[tuple[str, Any, Any]] = [
    ("max_concurrent_downloads", 3, "3"),
    ("max_concurrent_downloads", 3, 2**63),
    ("disable_apparmor", True, "true"),
    ("stream_server_port", "10010", 10010),
    ("sandbox_image", "pause", ["pause"]),
    ("cni", {"bin_dir": "/opt/cni/bin"}, "x"),
    ("cni", {"max_conf_num": 1}, {"max_conf_num": "one"}),
    ("containerd.runtimes.nvidia.runtime_type", "io.containerd.runc.v2", 5),
    ("containerd.runtimes.nvidia.privileged_without_host_devices", False, "no"),
]


def config_with(version: ContainerdVersion, path: tuple[str, ...], value: Any) -> ConfigFiles:
    """A main config that sets one value at an effective path (nothing else)."""
    doc: dict[str, Any] = {"version": 2 if version.major < 2 else 3}
    table = doc
    for part in path[:-1]:
        table = table.setdefault(part, {})
    table[path[-1]] = value
    return ConfigFiles(MAIN, {MAIN: tomli_w.dumps(doc)})


@pytest.mark.parametrize(("key", "value"), ACCEPTED)
def test_an_accepted_setting_loads(containerd_bin: Path, key: str, value: Any) -> None:
    version = version_of(containerd_bin)
    placed = place_setting(CriSetting(key, value), version, 2)
    real_dumps(containerd_bin, config_with(version, placed.path, placed.value))


@pytest.mark.parametrize(("key", "good", "bad"), REFUSED)
def test_a_refused_setting_does_not_load(
    containerd_bin: Path, key: str, good: Any, bad: Any
) -> None:
    version = version_of(containerd_bin)
    with pytest.raises(SettingTypeError):
        place_setting(CriSetting(key, bad), version, 2)
    placed = place_setting(CriSetting(key, good), version, 2)
    wrong = [bad] if placed.value == [good] else bad  # 2.x keeps cni.bin_dir as a list
    try:
        (dump,) = real_dumps(containerd_bin, config_with(version, placed.path, wrong))
    except (CommandFailed, StagingFailed):
        return  # refused to load, as rollout said
    # 1.7.24 loads 2**63 as -2**63 and 2**64 not at all: loaded, but not as written
    assert find_value(dump, placed.path) != wrong
