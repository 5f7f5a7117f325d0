"""The incident, the fix, and the toolkit's rewrite/exit events, on the real binaries.

Everything here is checked with the real `containerd config dump` of 1.6, 1.7 and 2.1.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.containerd import (
    ConfigFiles,
    Intent,
    PredictionRefused,
    dump_configs,
    find_shadowing,
    merge_files,
    predict,
    repair_shadowing,
    synthesize,
)
from rollout.containerd.synthesis import FileWrite
from rollout.transports.local import LocalRunner
from tests.conftest import containerd_binary
from tests.containerd.nodes import (
    CERTS_D,
    EARLY_REGISTRY_DROPIN,
    MAIN,
    NAIVE_REGISTRY,
    NVIDIA_DROPIN,
    REGISTRY_DROPIN,
    main_config,
    toolkit_dropin,
)
from tests.containerd.realdump import config_path_of, real_dumps, runtimes_of, version_of

pytestmark = pytest.mark.containerd
REGISTRY = Intent.from_mapping({"registry.config_path": CERTS_D})
HANDLERS = {"nvidia", "nvidia-cdi", "nvidia-legacy"}


def gpu_node(binary: Path, config_version: int | None = None) -> ConfigFiles:
    """Main config plus the toolkit's drop-in, made from this binary's real dump."""
    version = version_of(binary)
    cv = config_version or (3 if version.major >= 2 else 2)
    main = ConfigFiles(MAIN, {MAIN: main_config(cv)})
    return main.with_file(NVIDIA_DROPIN, toolkit_dropin(real_dumps(binary, main)[0]))


def incident_node(binary: Path) -> ConfigFiles:
    """FACTS.md's reproduction: version = 2 everywhere, nvidia + nvidia-cdi, naive registry."""
    nvidia = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi.options]
    BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi"
"""
    return ConfigFiles(
        MAIN,
        {MAIN: 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n', NVIDIA_DROPIN: nvidia},
    )


def test_incident_reproduced_and_modelled(containerd_bin: Path) -> None:
    version = version_of(containerd_bin)
    node = incident_node(containerd_bin)
    after_naive = node.with_file(REGISTRY_DROPIN, NAIVE_REGISTRY)
    sorted_before = node.with_file(EARLY_REGISTRY_DROPIN, NAIVE_REGISTRY)
    alone, naive, early = real_dumps(containerd_bin, node, after_naive, sorted_before)
    assert {"nvidia", "nvidia-cdi"} <= set(runtimes_of(alone))
    if version.major < 2:
        assert not {"nvidia", "nvidia-cdi"} & set(runtimes_of(naive))  # handlers gone
        assert config_path_of(naive) == CERTS_D
        assert {"nvidia", "nvidia-cdi"} <= set(runtimes_of(early))
        assert config_path_of(early) == ""  # registry lost instead
        assert find_shadowing(after_naive, version)
    else:
        for dump in (naive, early):  # 2.x merges: both survive either way
            assert {"nvidia", "nvidia-cdi"} <= set(runtimes_of(dump))
            assert config_path_of(dump) == CERTS_D
        assert find_shadowing(after_naive, version) == []
    # The model predicts the same handler sets.
    for files, dump in ((after_naive, naive), (sorted_before, early)):
        model = merge_files(files, version)
        plugin = (
            "io.containerd.cri.v1.runtime" if version.major >= 2 else "io.containerd.grpc.v1.cri"
        )
        modelled = model.get(("plugins", plugin, "containerd", "runtimes")) or {}
        assert set(modelled) <= set(runtimes_of(dump))
        assert ("nvidia" in modelled) == ("nvidia" in runtimes_of(dump))


@pytest.mark.parametrize("layout", ["incident", "gpu-node"])
def test_synthesized_writes_keep_handlers_and_set_config_path(
    containerd_bin: Path, layout: str
) -> None:
    version = version_of(containerd_bin)
    node = incident_node(containerd_bin) if layout == "incident" else gpu_node(containerd_bin)
    result = synthesize(node, version, REGISTRY)
    assert result.writes
    before, after = real_dumps(containerd_bin, node, result.files_after(node))
    assert set(runtimes_of(before)) == set(runtimes_of(after))
    assert config_path_of(after) == CERTS_D
    prediction = predict(LocalRunner(), str(containerd_bin), node, result.writes, REGISTRY, version)
    assert [c.path[-1] for c in prediction.changes] == ["config_path"]


def test_intent_survives_toolkit_restart_and_exit(containerd_bin: Path) -> None:
    version = version_of(containerd_bin)
    node = gpu_node(containerd_bin)
    intent = Intent.from_mapping(
        {"registry.config_path": CERTS_D, "containerd.runtimes.runc.options.SystemdCgroup": False}
    )
    result = synthesize(node, version, intent)
    written = result.files_after(node)
    [dump] = real_dumps(containerd_bin, written)
    # Restart: the toolkit rewrites 99-nvidia.toml from the dump of what we wrote.
    restarted = written.with_file(NVIDIA_DROPIN, toolkit_dropin(dump))
    # Exit: the toolkit deletes its drop-in.
    exited = written.without_file(NVIDIA_DROPIN)
    after_restart, after_exit = real_dumps(containerd_bin, restarted, exited)
    for state in (dump, after_restart, after_exit):
        assert config_path_of(state) == CERTS_D
        assert runtimes_of(state)["runc"]["options"]["SystemdCgroup"] is False
    assert set(runtimes_of(after_restart)) >= HANDLERS
    assert not HANDLERS & set(runtimes_of(after_exit))  # gone, as the toolkit intends
    # The model agrees with both events.
    for files in (restarted, exited):
        model = merge_files(files, version)
        assert synthesize(files, version, intent).is_noop, model.warnings


def test_repair_on_the_broken_node(containerd_bin: Path) -> None:
    version = version_of(containerd_bin)
    broken = gpu_node(containerd_bin).with_file(REGISTRY_DROPIN, NAIVE_REGISTRY)
    intent = Intent.from_mapping({"max_concurrent_downloads": 5})
    result = repair_shadowing(broken, version, intent)
    [after] = real_dumps(containerd_bin, result.files_after(broken))
    assert set(runtimes_of(after)) >= HANDLERS
    assert after["plugins"][_images_plugin(version.major)]["max_concurrent_downloads"] == 5
    if version.major < 2:
        assert config_path_of(after) == CERTS_D  # the shadowing file's own key is kept
    else:
        # On 2.x the naive drop-in is version 2 but the toolkit's version-3 drop-in loads
        # last, so containerd does not migrate it: its registry key is ignored, and the
        # model says so.
        assert config_path_of(after) == ""
        assert any("ignores the version-2 CRI keys registry" in w for w in result.after.warnings)


def _images_plugin(major: int) -> str:
    return "io.containerd.cri.v1.images" if major >= 2 else "io.containerd.grpc.v1.cri"


def test_prediction_refuses_the_naive_dropin(containerd_bin: Path) -> None:
    version = version_of(containerd_bin)
    node = gpu_node(containerd_bin)
    naive = [FileWrite(REGISTRY_DROPIN, None, NAIVE_REGISTRY)]
    with pytest.raises(PredictionRefused) as info:
        predict(LocalRunner(), str(containerd_bin), node, naive, REGISTRY, version)
    message = str(info.value)
    if version.major < 2:
        assert "containerd.runtimes.nvidia" in message and "would vanish" in message
    else:
        # 2.x keeps the handlers, but ignores the version-2 drop-in altogether: the
        # toolkit's version-3 drop-in loads last, so nothing is migrated.
        assert "registry.config_path would be ''" in message


def test_v2_main_config_on_2x() -> None:
    containerd_bin = containerd_binary("2.1")
    version = version_of(containerd_bin)
    node = gpu_node(containerd_bin, config_version=2)
    result = synthesize(node, version, REGISTRY)
    predict(LocalRunner(), str(containerd_bin), node, result.writes, REGISTRY, version)
    [after] = dump_configs(LocalRunner(), str(containerd_bin), [result.files_after(node)])
    assert config_path_of(after) == CERTS_D and set(runtimes_of(after)) >= HANDLERS
