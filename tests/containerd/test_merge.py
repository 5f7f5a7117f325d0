"""Import resolution and merging, from data (the rules the differential tests measure)."""

from __future__ import annotations

import pytest

from rollout.containerd import (
    ConfigFiles,
    ConfigParseError,
    ContainerdVersion,
    ImportMissing,
    diff_effective,
    merge_files,
    render_diff_text,
    resolve_load_order,
)
from rollout.containerd.diff import ChangeKind

V16, V17, V21 = (ContainerdVersion.from_series(s) for s in ("1.6.20", "1.7.24", "2.1.9"))
MAIN = "/etc/containerd/config.toml"


def node(main: str, **others: str) -> ConfigFiles:
    files = {MAIN: main}
    files.update(
        {
            f"/etc/containerd/{k.replace('__', '/').replace('_', '-')}.toml": v
            for k, v in others.items()
        }
    )
    return ConfigFiles(MAIN, files)


def test_load_order_breadth_first_glob_sorted_and_each_file_once() -> None:
    files = ConfigFiles(
        MAIN,
        {
            MAIN: 'imports = ["conf.d/*.toml", "/etc/containerd/extra.toml"]',
            "/etc/containerd/conf.d/b.toml": 'imports = ["../nested.toml"]',
            "/etc/containerd/conf.d/a.toml": 'imports = ["/etc/containerd/extra.toml"]',
            "/etc/containerd/conf.d/sub/c.toml": "",  # `*` does not cross directories
            "/etc/containerd/extra.toml": "",
            "/etc/containerd/nested.toml": "",
        },
    )
    for version in (V17, V21):
        order, warnings = resolve_load_order(files, version)
        assert order == (
            MAIN,
            "/etc/containerd/conf.d/a.toml",
            "/etc/containerd/conf.d/b.toml",
            "/etc/containerd/extra.toml",
            "/etc/containerd/nested.toml",
        )
        assert warnings == ()


def test_relative_glob_on_16_resolves_against_the_working_directory() -> None:
    files = ConfigFiles(
        MAIN,
        {MAIN: 'imports = ["conf.d/*.toml", "conf.d/x.toml"]', "/etc/containerd/conf.d/x.toml": ""},
    )
    # 1.6: the glob looks in /conf.d (systemd's working directory is /); the plain path works.
    assert resolve_load_order(files, V16)[0] == (MAIN, "/etc/containerd/conf.d/x.toml")
    assert resolve_load_order(files, V17)[0] == (MAIN, "/etc/containerd/conf.d/x.toml")
    glob_only = files.with_file(MAIN, 'imports = ["conf.d/*.toml"]')
    assert resolve_load_order(glob_only, V16)[0] == (MAIN,)
    assert resolve_load_order(glob_only, V21)[0] == (MAIN, "/etc/containerd/conf.d/x.toml")


def test_missing_import_refused_by_1x_truncates_2x() -> None:
    main = """version = 2
imports = ["/etc/containerd/missing.toml", "/etc/containerd/late.toml"]
"""
    late = """[plugins."io.containerd.gc.v1.scheduler"]
deletion_threshold = 7
"""
    files = ConfigFiles(MAIN, {MAIN: main, "/etc/containerd/late.toml": late})
    with pytest.raises(ImportMissing, match=r"missing\.toml"):
        merge_files(files, V17)
    effective = merge_files(files, V21)
    assert effective.load_order == (MAIN,)
    assert "stops loading" in effective.warnings[0] and "late.toml" in effective.warnings[0]


def test_plugin_tables_replace_on_1x_and_merge_on_2x() -> None:
    main = """version = 2
imports = ["/etc/containerd/b.toml"]
[plugins."io.containerd.gc.v1.scheduler"]
deletion_threshold = 5
mutation_threshold = 9
"""
    later = """[plugins."io.containerd.gc.v1.scheduler"]
deletion_threshold = 0
"""
    files = ConfigFiles(MAIN, {MAIN: main, "/etc/containerd/b.toml": later})
    gc = ("plugins", "io.containerd.gc.v1.scheduler")
    one = merge_files(files, V17)
    assert one.get(gc) == {"deletion_threshold": 0}
    assert one.provenance[(*gc, "deletion_threshold")] == "/etc/containerd/b.toml"
    two = merge_files(files, V21)
    # A zero in a plugin table wins a 2.x deep merge (a map value, not a struct field).
    assert two.get(gc) == {"deletion_threshold": 0, "mutation_threshold": 9}
    assert two.sources_of("io.containerd.gc.v1.scheduler") == (MAIN, "/etc/containerd/b.toml")


def test_top_level_keys_follow_mergo() -> None:
    main = """version = 2
oom_score = 5
root = "/r"
required_plugins = ["a.b"]
imports = ["/etc/containerd/b.toml"]
[timeouts]
"io.containerd.timeout.shim.load" = "5s"
"io.containerd.timeout.shim.cleanup" = "1s"
"""
    later = """oom_score = 0
root = ""
required_plugins = ["a.b", "c.d"]
bogus = 1
[timeouts]
"io.containerd.timeout.shim.load" = "9s"
"""
    files = ConfigFiles(MAIN, {MAIN: main, "/etc/containerd/b.toml": later})
    one = merge_files(files, V17)
    assert one.tree["oom_score"] == 5 and one.tree["root"] == "/r"  # zero never overrides
    assert one.tree["required_plugins"] == ["a.b", "a.b", "c.d"]  # 1.x appends duplicates
    assert one.tree["timeouts"] == {
        "io.containerd.timeout.shim.load": "9s",
        "io.containerd.timeout.shim.cleanup": "1s",
    }
    assert "imports" not in one.tree and "bogus" not in one.tree
    assert any("bogus" in w for w in one.warnings)
    assert merge_files(files, V21).tree["required_plugins"] == ["a.b", "c.d"]  # 2.x dedupes


def test_2x_migrates_v2_cri_keys_only_when_the_merged_version_is_below_3() -> None:
    v2_dropin = (
        'version = 2\nsandbox_image = "example.org/pause:1"\n'
        'enable_selinux = true\nstream_server_port = "10010"\n'
        '[registry]\nconfig_path = "/etc/containerd/certs.d"\n'
    ).replace("\n[registry]", '\n[plugins."io.containerd.grpc.v1.cri".registry]')
    v2_dropin = v2_dropin.replace(
        "version = 2\n", 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n', 1
    )
    files = ConfigFiles(
        MAIN,
        {
            MAIN: 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n',
            "/etc/containerd/conf.d/10-old.toml": v2_dropin,
        },
    )
    tree = merge_files(files, V21).tree
    assert tree["version"] == 3
    assert tree["plugins"]["io.containerd.cri.v1.images"] == {
        "pinned_images": {"sandbox": "example.org/pause:1"},
        "registry": {"config_path": "/etc/containerd/certs.d"},
    }
    assert tree["plugins"]["io.containerd.cri.v1.runtime"] == {"enable_selinux": True}
    assert tree["plugins"]["io.containerd.grpc.v1.cri"] == {"stream_server_port": "10010"}
    # A version-3 file loaded last makes the merged version 3: no migration at all.
    late = files.with_file("/etc/containerd/conf.d/20-new.toml", "version = 3\n")
    effective = merge_files(late, V21)
    assert "io.containerd.cri.v1.images" not in effective.tree["plugins"]
    assert any("ignores the version-2 CRI keys" in w for w in effective.warnings)


def test_syntax_error_names_the_file() -> None:
    files = ConfigFiles(
        MAIN, {MAIN: 'imports = ["/etc/containerd/bad.toml"]', "/etc/containerd/bad.toml": "[x\n"}
    )
    with pytest.raises(ConfigParseError, match=r"bad\.toml"):
        merge_files(files, V17)


def test_diff_and_text_rendering() -> None:
    before = {"plugins": {"p": {"a": 1, "t": {"x": "y"}, "gone": True}}}
    after = {"plugins": {"p": {"a": 2, "t": {"x": "y"}, "new": [1]}}}
    changes = diff_effective(before, after)
    assert [(c.path[-1], c.kind) for c in changes] == [
        ("a", ChangeKind.CHANGED),
        ("gone", ChangeKind.REMOVED),
        ("new", ChangeKind.ADDED),
    ]
    text = render_diff_text(before, after)
    assert "-a = 1" in text and "+a = 2" in text and "+new = [" in text
    assert render_diff_text(before, before) == ""
    # An empty table that gains keys is reported by the keys alone.
    assert [c.path for c in diff_effective({"t": {}}, {"t": {"k": 1}})] == [("t", "k")]
