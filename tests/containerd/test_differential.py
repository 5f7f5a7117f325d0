"""The merge model against the real `containerd config dump` of 1.6, 1.7 and 2.1.

Oracle: the dump of the generated multi-file config must equal the dump of one file holding
the model's merged tree (`imports` dropped), and every key the model says is effective must
show in the dump with the model's value. Generated configs stay within what containerd
decodes: real plugin keys with valid types, plus a made-up plugin that 2.x keeps raw (1.x
drops unknown plugins from the dump, so there it is only checked not to disturb the rest).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings

from rollout.commands import CommandFailed
from rollout.containerd import ConfigFiles, ContainerdVersion, merge_files
from rollout.containerd.errors import ImportMissing
from rollout.containerd.merge import iter_leaves
from tests.containerd.realdump import real_dumps, version_of

pytestmark = pytest.mark.containerd

# More examples for a thorough local run: ROLLOUT_DIFF_EXAMPLES=300.
MAX_EXAMPLES = int(os.environ.get("ROLLOUT_DIFF_EXAMPLES", "45"))
MAIN = "/etc/containerd/config.toml"
CONF_D = "/etc/containerd/conf.d"
EXTRA = "/etc/containerd/extra"

Slot = tuple[str, tuple[str, ...], st.SearchStrategy[Any]]

_durations = st.sampled_from(["0s", "1s", "100ms"])
_paths = st.sampled_from(["/etc/containerd/certs.d", "/opt/certs.d", ""])
_ints = st.integers(min_value=0, max_value=40)

COMMON_SLOTS: list[Slot] = [
    ("io.containerd.gc.v1.scheduler", ("deletion_threshold",), _ints),
    ("io.containerd.gc.v1.scheduler", ("mutation_threshold",), _ints),
    ("io.containerd.gc.v1.scheduler", ("pause_threshold",), st.sampled_from([0.0, 0.02, 0.5])),
    ("io.containerd.gc.v1.scheduler", ("schedule_delay",), _durations),
    (
        "io.containerd.metadata.v1.bolt",
        ("content_sharing_policy",),
        st.sampled_from(["shared", "isolated"]),
    ),
    ("io.containerd.internal.v1.opt", ("path",), st.sampled_from(["/opt/containerd", "/opt/x"])),
    ("io.containerd.example.v1.x", ("a",), _ints),
    ("io.containerd.example.v1.x", ("t", "k"), st.sampled_from(["v", "w", ""])),
    ("io.containerd.example.v1.x", ("t", "u", "deep"), st.booleans()),
    ("io.containerd.example.v1.x", ("arr",), st.lists(_ints, max_size=3)),
]
V2_CRI = "io.containerd.grpc.v1.cri"
V2_SLOTS: list[Slot] = [
    (V2_CRI, ("max_container_log_line_size",), st.integers(min_value=1, max_value=99999)),
    (V2_CRI, ("enable_selinux",), st.booleans()),
    (
        V2_CRI,
        ("sandbox_image",),
        st.sampled_from(["registry.k8s.io/pause:3.9", "example.org/pause:1"]),
    ),
    (V2_CRI, ("registry", "config_path"), _paths),
    (V2_CRI, ("max_concurrent_downloads",), st.integers(min_value=1, max_value=9)),
    (V2_CRI, ("stream_server_port",), st.sampled_from(["0", "10010"])),
    (V2_CRI, ("containerd", "default_runtime_name"), st.sampled_from(["runc", "nvidia"])),
    (V2_CRI, ("containerd", "snapshotter"), st.sampled_from(["overlayfs", "native"])),
    (
        V2_CRI,
        ("containerd", "runtimes", "nvidia", "runtime_type"),
        st.just("io.containerd.runc.v2"),
    ),
    (
        V2_CRI,
        ("containerd", "runtimes", "nvidia", "options", "BinaryName"),
        st.sampled_from(
            [
                "/usr/local/nvidia/toolkit/nvidia-container-runtime",
                "/usr/bin/nvidia-container-runtime",
            ]
        ),
    ),
    (V2_CRI, ("containerd", "runtimes", "runc", "options", "SystemdCgroup"), st.booleans()),
    (V2_CRI, ("cni", "conf_dir"), st.sampled_from(["/etc/cni/net.d", "/opt/cni/conf"])),
]
V3_SLOTS: list[Slot] = [
    (
        "io.containerd.cri.v1.runtime",
        ("max_container_log_line_size",),
        st.integers(min_value=1, max_value=99999),
    ),
    ("io.containerd.cri.v1.runtime", ("enable_selinux",), st.booleans()),
    (
        "io.containerd.cri.v1.runtime",
        ("containerd", "default_runtime_name"),
        st.sampled_from(["runc", "nvidia"]),
    ),
    (
        "io.containerd.cri.v1.runtime",
        ("containerd", "runtimes", "nvidia", "runtime_type"),
        st.just("io.containerd.runc.v2"),
    ),
    (
        "io.containerd.cri.v1.runtime",
        ("containerd", "runtimes", "nvidia", "options", "BinaryName"),
        st.sampled_from(["/usr/local/nvidia/toolkit/nvidia-container-runtime", "/x"]),
    ),
    (
        "io.containerd.cri.v1.runtime",
        ("cni", "conf_dir"),
        st.sampled_from(["/etc/cni/net.d", "/opt/cni/conf"]),
    ),
    ("io.containerd.cri.v1.images", ("registry", "config_path"), _paths),
    (
        "io.containerd.cri.v1.images",
        ("pinned_images", "sandbox"),
        st.sampled_from(["registry.k8s.io/pause:3.10", "example.org/pause:2"]),
    ),
    (
        "io.containerd.cri.v1.images",
        ("max_concurrent_downloads",),
        st.integers(min_value=1, max_value=9),
    ),
]


def _set(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for part in path[:-1]:
        tree = tree.setdefault(part, {})
    tree[path[-1]] = value


@st.composite
def file_body(draw: st.DrawFn, config_version: int | None, major: int) -> dict[str, Any]:
    """The keys of one file: plugin slots fitting its version, and some top-level keys."""
    slots = list(COMMON_SLOTS)
    if config_version in (None, 2):
        slots += V2_SLOTS
    if config_version == 3:
        slots += V3_SLOTS + (V2_SLOTS[:4] if draw(st.booleans()) else [])
    body: dict[str, Any] = {}
    if config_version is not None:
        body["version"] = config_version
    chosen = draw(st.lists(st.sampled_from(slots), max_size=6, unique_by=lambda s: (s[0], s[1])))
    for plugin_id, path, values in chosen:
        _set(body, ("plugins", plugin_id, *path), draw(values))
    if draw(st.integers(0, 3)) == 0:
        body["oom_score"] = draw(st.sampled_from([0, -500, 200]))
    if draw(st.integers(0, 3)) == 0:
        body["root"] = draw(st.sampled_from(["", "/var/lib/containerd", "/var/lib/c2"]))
    if draw(st.integers(0, 3)) == 0:
        body["required_plugins"] = draw(
            st.lists(st.sampled_from(["io.containerd.a.v1.b", "io.containerd.c.v1.d"]), max_size=2)
        )
    if draw(st.integers(0, 4)) == 0:
        body["debug"] = {"level": draw(st.sampled_from(["", "info", "debug"]))}
    if draw(st.integers(0, 4)) == 0:
        body["timeouts"] = {"io.containerd.timeout.shim.cleanup": draw(_durations)}
    return body


@st.composite
def node_files(draw: st.DrawFn, version: ContainerdVersion) -> ConfigFiles:
    """A main config with drop-ins in conf.d/ and extra/, imported in every supported way."""
    versions: list[int | None] = [None, 2] + ([3] if version.major >= 2 else [])
    main_version = draw(st.sampled_from([2, 3] if version.major >= 2 else [2]))
    files: dict[str, str] = {}
    conf_d = draw(
        st.lists(
            st.sampled_from(["00-a", "10-b", "50-c", "99-nvidia", "registry"]),
            max_size=4,
            unique=True,
        )
    )
    for name in conf_d:
        body = draw(file_body(draw(st.sampled_from(versions)), version.major))
        if draw(st.integers(0, 5)) == 0:
            body["imports"] = [
                draw(st.sampled_from(["../extra/nested.toml", f"{EXTRA}/nested.toml"]))
            ]
        files[f"{CONF_D}/{name}.toml"] = tomli_w.dumps(body)
    extras = draw(st.lists(st.sampled_from(["a", "b", "nested"]), max_size=3, unique=True))
    for name in extras:
        files[f"{EXTRA}/{name}.toml"] = tomli_w.dumps(
            draw(file_body(draw(st.sampled_from(versions)), version.major))
        )
    import_choices = [
        f"{CONF_D}/*.toml",
        "conf.d/*.toml",  # relative glob: 1.6 resolves it against the working directory
        f"{EXTRA}/a.toml",
        "extra/b.toml",
        "./extra/../extra/a.toml",
        f"{EXTRA}/*.toml",
    ]
    if version.major >= 2:
        import_choices.append(f"{EXTRA}/missing.toml")  # 2.x stops loading there
    main = draw(file_body(main_version, version.major))
    main["imports"] = draw(st.lists(st.sampled_from(import_choices), max_size=4))
    files[MAIN] = tomli_w.dumps(main)
    if version.major < 2:
        # 1.x refuses a missing plain import; keep those tests about merging.
        files.setdefault(f"{EXTRA}/a.toml", tomli_w.dumps({"version": 2}))
        files.setdefault(f"{EXTRA}/b.toml", tomli_w.dumps({"version": 2}))
        files.setdefault(f"{EXTRA}/nested.toml", "")
    return ConfigFiles(MAIN, files)


def _assert_model_matches_dump(binary: Path, files: ConfigFiles) -> None:
    version = version_of(binary)
    try:
        model = merge_files(files, version)
    except ImportMissing:
        with pytest.raises(CommandFailed):
            real_dumps(binary, files)
        return
    single = ConfigFiles(MAIN, {MAIN: tomli_w.dumps(dict(model.tree))})
    real, from_model = real_dumps(binary, files, single)
    assert real == from_model
    plugins = real.get("plugins", {})
    for path, value in iter_leaves(model.tree):
        if path[0] == "plugins" and (len(path) < 2 or path[1] not in plugins):
            continue  # a plugin this version does not know: not in any dump
        node: Any = real
        for part in path:
            assert isinstance(node, dict) and part in node, f"{path} missing from the dump"
            node = node[part]
        if isinstance(value, list) and path[0] in ("required_plugins", "disabled_plugins"):
            continue
        assert node == value or value == {}, f"{path}: model {value!r}, dump {node!r}"


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_merge_model_matches_real_dump(containerd_bin: Path, data: st.DataObject) -> None:
    files = data.draw(node_files(version_of(containerd_bin)))
    _assert_model_matches_dump(containerd_bin, files)
