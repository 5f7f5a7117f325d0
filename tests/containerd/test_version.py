"""containerd --version parsing, config versions and CRI plugin ids."""

from __future__ import annotations

import pytest

from rollout.containerd import (
    ContainerdVersion,
    MergeMode,
    UnsupportedVersion,
    VersionUnknown,
    cri_plugin_ids,
    errors,
    parse_version,
    read_config_version,
)
from rollout.errors import BadInput, ExitCode, RolloutError

# `containerd --version` as Debian, containerd.io and upstream builds print it, and the
# release each names.
OUTPUTS = [
    ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+deb12u3\n", "1.6.20"),
    ("containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1", "1.7.24"),
    ("containerd github.com/containerd/containerd/v2 2.1.9+unknown ", "2.1.9"),
    ("containerd containerd.io 1.7.27 05044ec0a9a75232cad458027ca83437aae3f4da", "1.7.27"),
    ("containerd github.com/containerd/containerd v1.6.8 9cd3357b7fd", "1.6.8"),
    ("containerd github.com/containerd/containerd/v2 v2.0.0 207ad711", "2.0.0"),
]


@pytest.mark.parametrize(("text", "release"), OUTPUTS)
def test_parse_version(text: str, release: str) -> None:
    version = parse_version(text)
    major, minor, patch = (int(n) for n in release.split("."))
    assert (version.major, version.minor, version.patch) == (major, minor, patch)
    assert version.series == f"{major}.{minor}"
    assert version.raw == text.strip().splitlines()[0]


@pytest.mark.parametrize(
    ("series", "mode"),
    [
        ("1.6", MergeMode.REPLACE_PLUGIN_TABLES),
        ("1.7", MergeMode.REPLACE_PLUGIN_TABLES),
        ("2.0", MergeMode.DEEP_MERGE),
        ("2.1", MergeMode.DEEP_MERGE),
    ],
)
def test_merge_mode_of_a_series(series: str, mode: MergeMode) -> None:
    assert ContainerdVersion.from_series(series).merge_mode is mode


@pytest.mark.parametrize(
    "text",
    [
        "",
        "docker version 24.0.7",
        "containerd github.com/containerd/containerd",
        "containerd x 1.7",
    ],
)
def test_unreadable_version_is_a_clear_error(text: str) -> None:
    with pytest.raises(VersionUnknown) as info:
        parse_version(text)
    assert isinstance(info.value, RolloutError)


def test_unsupported_release() -> None:
    with pytest.raises(UnsupportedVersion, match=r"1\.4\.13"):
        parse_version("containerd github.com/containerd/containerd v1.4.13 9cc61520")
    with pytest.raises(UnsupportedVersion):
        ContainerdVersion.from_series("3.0")


def test_config_version_key() -> None:
    assert read_config_version({}) == 1
    assert read_config_version({"version": 2}) == 2
    assert read_config_version({"version": 3}) == 3
    with pytest.raises(VersionUnknown):
        read_config_version({"version": "2"})
    with pytest.raises(VersionUnknown):
        read_config_version({"version": 4})


def test_cri_plugin_ids() -> None:
    assert cri_plugin_ids(2) == ("io.containerd.grpc.v1.cri",)
    assert cri_plugin_ids(3) == (
        "io.containerd.cri.v1.runtime",
        "io.containerd.cri.v1.images",
        "io.containerd.grpc.v1.cri",
    )
    with pytest.raises(UnsupportedVersion):
        cri_plugin_ids(1)


def test_the_engines_input_errors_exit_as_bad_input_and_the_others_as_failures() -> None:
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.ContainerdConfigError)
    ]
    bad_input = {c.__name__ for c in classes if issubclass(c, BadInput)}
    assert bad_input >= {"VersionUnknown", "ConfigParseError", "ConfigRejected"}
    for error in classes:
        expected = ExitCode.BAD_INPUT if error.__name__ in bad_input else ExitCode.FAILED
        assert error.exit_code == expected, error.__name__
