"""Shadowing analysis and drop-in synthesis on recorded GPU nodes (no binaries: containerd's
defaults come from the recorded ones)."""

from __future__ import annotations

import tomllib

import pytest

from rollout.containerd import (
    ConfigFiles,
    ContainerdVersion,
    Intent,
    RecordedDefaults,
    ShadowKind,
    find_shadowing,
    load_effective,
    repair_shadowing,
    synthesize,
)
from rollout.containerd.synthesis import set_in_toml, with_settings
from tests.containerd.nodes import (
    EARLY_REGISTRY_DROPIN,
    MAIN,
    NAIVE_REGISTRY,
    NVIDIA_DROPIN,
    REGISTRY_DROPIN,
    recorded_node,
)

V17, V21 = ContainerdVersion.from_series("1.7.24"), ContainerdVersion.from_series("2.1.9")
REGISTRY = Intent.from_mapping({"registry.config_path": "/etc/containerd/certs.d"})
V2_RUNTIMES = ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")
RECORDED = RecordedDefaults()


def test_naive_registry_dropin_shadows_the_toolkit_on_1x() -> None:
    broken = recorded_node("gpu-node-1.x").with_file(REGISTRY_DROPIN, NAIVE_REGISTRY)
    # the incident: the toolkit's handlers are gone, only containerd's default runc is left
    assert set(load_effective(broken, V17, RECORDED).get(V2_RUNTIMES)) == {"runc"}
    [shadowing] = find_shadowing(broken, V17)
    assert shadowing.kind is ShadowKind.TABLE_REPLACED
    assert (shadowing.shadowing_file, shadowing.shadowed_file) == (REGISTRY_DROPIN, NVIDIA_DROPIN)
    assert shadowing.lost[:4] == (
        ("containerd", "runtimes", "nvidia"),
        ("containerd", "runtimes", "nvidia-cdi"),
        ("containerd", "runtimes", "nvidia-legacy"),
        ("containerd", "runtimes", "runc"),
    )
    text = shadowing.describe()
    assert text.startswith(
        f'{REGISTRY_DROPIN} replaces the whole plugins."io.containerd.grpc.v1.cri" table of '
        f"{NVIDIA_DROPIN} (containerd 1.7 replaces plugin tables, it does not merge them); lost: "
        "containerd.runtimes.nvidia, containerd.runtimes.nvidia-cdi, "
        "containerd.runtimes.nvidia-legacy"
    )
    assert "more)" in text  # the rest of the copied CRI table, counted, not listed


def test_no_table_shadowing_on_2x() -> None:
    node = recorded_node("gpu-node-2.x").with_file(REGISTRY_DROPIN, NAIVE_REGISTRY)
    assert find_shadowing(node, V21) == []
    overridden = node.with_file(
        "/etc/containerd/conf.d/zz.toml",
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n'
        'default_runtime_name = "nvidia"\n',
    )
    [override] = find_shadowing(overridden, V21)
    assert override.kind is ShadowKind.KEY_OVERRIDDEN
    assert override.lost == (("containerd", "default_runtime_name"),)
    assert "overrides" in override.describe()


@pytest.mark.parametrize(("name", "version"), [("gpu-node-1.x", V17), ("gpu-node-2.x", V21)])
def test_synthesis_is_exactly_the_intent(name: str, version: ContainerdVersion) -> None:
    node = recorded_node(name)
    result = synthesize(node, version, REGISTRY, RECORDED)
    assert [c.path[-2:] for c in result.changes()] == [("registry", "config_path")]
    assert result.after.tree == with_settings(result.before.tree, result.placed)
    written = {w.path for w in result.writes}
    # The main config always carries the intent; on 1.x also the toolkit's full CRI copy.
    assert written == ({MAIN, NVIDIA_DROPIN} if version.major == 1 else {MAIN})
    main_after = next(w.after for w in result.writes if w.path == MAIN)
    assert "# kubelet uses the systemd cgroup driver" in main_after  # comments survive
    assert main_after.startswith(node.files[MAIN])  # an addition, the rest untouched
    # Deterministic, and a second run is a no-op with a reason.
    assert synthesize(node, version, REGISTRY, RECORDED).writes == result.writes
    again = synthesize(result.files_after(node), version, REGISTRY, RECORDED)
    assert again.is_noop and again.noop_reason and "already effective" in again.noop_reason


def test_synthesis_on_the_broken_node_keeps_what_is_left() -> None:
    broken = recorded_node("gpu-node-1.x").with_file(REGISTRY_DROPIN, NAIVE_REGISTRY)
    intent = Intent.from_mapping({"enable_cdi": True})
    result = synthesize(broken, V17, intent, RECORDED)
    assert {w.path for w in result.writes} == {MAIN, NVIDIA_DROPIN, REGISTRY_DROPIN}
    assert [c.path[-1] for c in result.changes()] == ["enable_cdi"]
    assert any("repair_shadowing" in note for note in result.notes)


def test_repair_restores_handlers_and_applies_the_intent() -> None:
    node = recorded_node("gpu-node-1.x")
    broken = node.with_file(REGISTRY_DROPIN, NAIVE_REGISTRY)
    result = repair_shadowing(broken, V17, Intent.from_mapping({"enable_cdi": True}), RECORDED)
    runtimes = result.after.get(V2_RUNTIMES)
    assert set(runtimes) == {"runc", "nvidia", "nvidia-cdi", "nvidia-legacy"}
    assert result.after.get(
        ("plugins", "io.containerd.grpc.v1.cri", "registry", "config_path")
    ) == ("/etc/containerd/certs.d")
    assert result.after.get(("plugins", "io.containerd.grpc.v1.cri", "enable_cdi")) is True
    assert any(n.startswith("repairs:") for n in result.notes)
    assert find_shadowing(result.files_after(broken), V17) == []
    registry_after = next(w.after for w in result.writes if w.path == REGISTRY_DROPIN)
    assert registry_after.startswith("# point CRI at certs.d")


def test_early_registry_dropin_loses_config_path_but_synthesis_fixes_it() -> None:
    node = recorded_node("gpu-node-1.x").with_file(EARLY_REGISTRY_DROPIN, NAIVE_REGISTRY)
    before = load_effective(node, V17, RECORDED)
    assert before.get(V2_RUNTIMES) is not None
    assert before.get(("plugins", "io.containerd.grpc.v1.cri", "registry", "config_path")) == ""
    result = synthesize(node, V17, REGISTRY, RECORDED)
    assert [c.path[-1] for c in result.changes()] == ["config_path"]
    assert NVIDIA_DROPIN in {w.path for w in result.writes}


def test_set_in_toml_keeps_layout_and_handles_dotted_and_inline_tables() -> None:
    text = (
        '# top\nversion = 2\n\n[plugins."io.containerd.grpc.v1.cri"]\n'
        '  registry = { config_path = "" }  # inline\n'
    )
    out = set_in_toml(
        "/x.toml",
        text,
        [(("plugins", "io.containerd.grpc.v1.cri", "registry", "config_path"), "/c")],
    )
    assert out.startswith("# top\nversion = 2\n")
    assert tomllib.loads(out)["plugins"]["io.containerd.grpc.v1.cri"]["registry"] == {
        "config_path": "/c"
    }
    fresh = set_in_toml("/y.toml", "version = 2\n", [(("plugins", "p", "a", "b"), 1)])
    assert tomllib.loads(fresh) == {"version": 2, "plugins": {"p": {"a": {"b": 1}}}}
    assert "[plugins]" not in fresh  # no empty super-table headers


def test_v2_main_on_2x_with_toolkit_v3_dropin() -> None:
    # A 1.x-era main config on a 2.1 node: the toolkit's version-3 drop-in, loaded last,
    # switches the migration of the main config's v2 CRI keys off.
    node = recorded_node("gpu-node-2.x")
    v2_main = (
        node.files[MAIN]
        .replace("version = 3", "version = 2")
        .replace("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri")
    )
    files = ConfigFiles(MAIN, {**node.files, MAIN: v2_main})
    result = synthesize(files, V21, REGISTRY, RECORDED)
    assert [c.path for c in result.changes()] == [
        ("plugins", "io.containerd.cri.v1.images", "registry", "config_path")
    ]
