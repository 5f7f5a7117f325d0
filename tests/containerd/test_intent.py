"""Placing version-neutral CRI settings for each containerd version."""

from __future__ import annotations

import pytest

from rollout.containerd import (
    ContainerdVersion,
    CriSetting,
    Intent,
    UnknownCriSetting,
    UnsupportedVersion,
    place_intent,
)
from rollout.containerd.intent import parse_dotted, place_setting

V16, V17, V21 = (ContainerdVersion.from_series(s) for s in ("1.6.20", "1.7.24", "2.1.9"))
V2, RT, IM = (
    "io.containerd.grpc.v1.cri",
    "io.containerd.cri.v1.runtime",
    "io.containerd.cri.v1.images",
)

CASES = [
    (
        "registry.config_path",
        "/etc/containerd/certs.d",
        ("plugins", IM, "registry", "config_path"),
        None,
    ),
    (
        "sandbox_image",
        "registry.k8s.io/pause:3.10",
        ("plugins", IM, "pinned_images", "sandbox"),
        None,
    ),
    ("enable_cdi", True, ("plugins", RT, "enable_cdi"), None),
    (
        "containerd.default_runtime_name",
        "nvidia",
        ("plugins", RT, "containerd", "default_runtime_name"),
        None,
    ),
    (
        "containerd.runtimes.runc.options.SystemdCgroup",
        True,
        ("plugins", RT, "containerd", "runtimes", "runc", "options", "SystemdCgroup"),
        None,
    ),
    ("containerd.snapshotter", "native", ("plugins", IM, "snapshotter"), None),
    ("stream_server_port", "10010", ("plugins", V2, "stream_server_port"), None),
    ("max_concurrent_downloads", 5, ("plugins", IM, "max_concurrent_downloads"), None),
    ("cni.bin_dir", "/opt/cni/bin", ("plugins", RT, "cni", "bin_dirs"), ["/opt/cni/bin"]),
    (
        "containerd.runtimes.kata.sandbox_mode",
        "shim",
        ("plugins", RT, "containerd", "runtimes", "kata", "sandboxer"),
        None,
    ),
]


@pytest.mark.parametrize(("key", "value", "path_2x", "value_2x"), CASES)
def test_placement(key: str, value: object, path_2x: tuple[str, ...], value_2x: object) -> None:
    setting = CriSetting(key, value)
    on_1x = place_setting(setting, V17, 2)
    assert on_1x.path == ("plugins", V2, *parse_dotted(key)) == on_1x.v2_path
    assert on_1x.value == value
    on_2x = place_setting(setting, V21, 3)
    assert on_2x.path == path_2x
    assert on_2x.value == (value if value_2x is None else value_2x)
    assert on_2x.v2_path == on_1x.path


def test_quoted_segments() -> None:
    assert parse_dotted('registry.mirrors."docker.io".endpoint') == (
        "registry",
        "mirrors",
        "docker.io",
        "endpoint",
    )
    with pytest.raises(UnknownCriSetting):
        parse_dotted("registry..config_path")


@pytest.mark.parametrize(
    ("key", "version", "match"),
    [
        ("registy.config_path", V17, "not a CRI setting"),
        ("enable_cdi", V16, "containerd 1.6.20"),
        ("systemd_cgroup", V21, "removed in containerd 2.x"),
        ("containerd.no_pivot", V21, "not a key of the CRI containerd table"),
        ("containerd.runtimes.nvidia", V17, "name a key of one runtime"),
        ("enable_selinux.x", V17, "is a value"),
    ],
)
def test_unknown_settings_are_clear_errors(
    key: str, version: ContainerdVersion, match: str
) -> None:
    with pytest.raises(UnknownCriSetting, match=match):
        place_setting(CriSetting(key, True), version, 3 if version.major >= 2 else 2)


def test_intent_rules() -> None:
    intent = Intent.from_mapping({"registry.config_path": "/x", "enable_cdi": True})
    assert [p.plugin_id for p in place_intent(intent, V21, 3)] == [IM, RT]
    with pytest.raises(UnknownCriSetting, match="one contains the other"):
        Intent.from_mapping({"registry": {"config_path": "/x"}, "registry.config_path": "/y"})
    with pytest.raises(UnsupportedVersion):
        place_intent(intent, V17, 1)
