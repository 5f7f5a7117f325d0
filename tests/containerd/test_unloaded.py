"""Drop-ins whose settings containerd does not load, on the real binaries, and diagnose's finding.

For each case the real `containerd config dump` of 1.6, 1.7 or 2.1 shows the setting absent;
rollout.containerd.find_unloaded names the file, the settings and why; and diagnose (its runtime
branch, the real dump standing for the node's own, as live) reports it: an error where a
runtime handler is lost with it, a warning otherwise. A case that loads fine on a version is
checked there too: nothing reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from rollout.containerd import ConfigFiles, UnloadedKind, find_unloaded
from rollout.diagnose import Severity
from rollout.diagnose.runtime import check_runtime
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.gpu import GpuFacts
from tests.conftest import containerd_binary
from tests.containerd.nodes import (
    CERTS_D,
    CONF_D,
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
HANDLERS = {"nvidia", "nvidia-cdi", "nvidia-legacy"}
ELSEWHERE = "/etc/containerd/other.d/registry.toml"
MISSING = "/etc/containerd/missing.toml"
V2_NVIDIA = "/etc/containerd/conf.d/50-nvidia.toml"
CONFIG_PATH = ("registry", "config_path")


def gpu_node(binary: Path, imports: str = f'"{CONF_D}/*.toml"') -> ConfigFiles:
    """The node image's main config (this version's config version) plus the toolkit's drop-in,
    made from this binary's real dump of the main config."""
    version = version_of(binary)
    text = main_config(3 if version.major >= 2 else 2).replace(f'"{CONF_D}/*.toml"', imports)
    main = ConfigFiles(MAIN, {MAIN: text})
    return main.with_file(NVIDIA_DROPIN, toolkit_dropin(real_dumps(binary, main)[0]))


# Debian's packaged config.toml (version 2 on every series), with the toolkit's imports added:
# the lab's nodes, and many real ones.
DEBIAN_MAIN = f"""version = 2
imports = ["{CONF_D}/*.toml"]

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""


def debian_node(binary: Path) -> ConfigFiles:
    """Debian's version-2 main config and the toolkit's drop-in from its dump (version 3 on
    2.x): 2.1 ignores the main config's CRI keys, but the toolkit's copy carries them."""
    main = ConfigFiles(MAIN, {MAIN: DEBIAN_MAIN})
    return main.with_file(NVIDIA_DROPIN, toolkit_dropin(real_dumps(binary, main)[0]))


def v2_toolkit_beside_a_later_v3_file(binary: Path) -> ConfigFiles:
    """2.x: an old version-2 toolkit drop-in, and a version-3 file that sorts after it."""
    v2_handlers = "version = 2\n" + "".join(
        f'[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{name}]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        f'[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{name}.options]\n'
        f'  BinaryName = "/usr/local/nvidia/toolkit/{name}"\n'
        for name in sorted(HANDLERS)
    )
    return (
        ConfigFiles(MAIN, {MAIN: main_config(3)})
        .with_file(V2_NVIDIA, v2_handlers)
        .with_file(
            f"{CONF_D}/99-zz.toml",
            'version = 3\n[plugins."io.containerd.cri.v1.images"]\n'
            "  max_concurrent_downloads = 4\n",
        )
    )


@dataclass(frozen=True)
class Case:
    """Files on a node of one series; the file not loaded, how, and what the dump lacks."""

    id: str
    series: str
    files: Callable[[Path], ConfigFiles]
    file: str | None  # None: everything loads on this version
    kind: UnloadedKind | None = None
    check: str = ""
    lost_handlers: bool = False  # else: registry.config_path is what is not loaded
    why: str = ""


CASES = [
    # The finding: 2.1 ignores a version-2 drop-in beside the toolkit's version-3 one,
    # whether it sorts before or after it (neither sets `version`; 99-nvidia.toml says 3).
    *(
        Case(
            f"v2-registry-{name}-v3-toolkit-2.1",
            "2.1",
            lambda b, path=path: gpu_node(b).with_file(path, NAIVE_REGISTRY),
            path,
            UnloadedKind.IGNORED_FOR_VERSION,
            "runtime.dropin-ignored",
            why="(version = 3)",
        )
        for name, path in (("before", EARLY_REGISTRY_DROPIN), ("after", REGISTRY_DROPIN))
    ),
    *(Case(f"debian-main-{s}", s, debian_node, None) for s in ("1.6", "1.7", "2.1")),
    Case(
        "v2-registry-beside-debian-main-2.1",
        "2.1",
        lambda b: debian_node(b).with_file(REGISTRY_DROPIN, NAIVE_REGISTRY),
        REGISTRY_DROPIN,
        UnloadedKind.IGNORED_FOR_VERSION,
        "runtime.dropin-ignored",
        why="(version = 3)",
    ),
    Case(
        "v2-toolkit-ignored-loses-handlers-2.1",
        "2.1",
        v2_toolkit_beside_a_later_v3_file,
        V2_NVIDIA,
        UnloadedKind.IGNORED_FOR_VERSION,
        "runtime.dropin-ignored",
        lost_handlers=True,
        why="does not migrate",
    ),
    # 1.6 resolves a relative glob against its working directory: the toolkit's drop-in is
    # imported by nothing, its handlers are lost. 1.7 and 2.1 load it.
    Case(
        "relative-glob-1.6",
        "1.6",
        lambda b: gpu_node(b, '"conf.d/*.toml"'),
        NVIDIA_DROPIN,
        UnloadedKind.NOT_IMPORTED,
        "runtime.dropin-not-loaded",
        lost_handlers=True,
        why="relative glob",
    ),
    *(
        Case(f"relative-glob-{s}", s, lambda b: gpu_node(b, '"conf.d/*.toml"'), None)
        for s in ("1.7", "2.1")
    ),
    # A drop-in in a directory no import matches, on every version.
    *(
        Case(
            f"imported-by-nothing-{s}",
            s,
            lambda b: gpu_node(b).with_file(ELSEWHERE, NAIVE_REGISTRY),
            ELSEWHERE,
            UnloadedKind.NOT_IMPORTED,
            "runtime.dropin-not-loaded",
            why="no import",
        )
        for s in ("1.6", "1.7", "2.1")
    ),
    # 2.1 stops loading at an import that does not exist: the toolkit's drop-in after it too.
    Case(
        "after-a-missing-import-2.1",
        "2.1",
        lambda b: gpu_node(b, f'"{MISSING}", "{CONF_D}/*.toml"'),
        NVIDIA_DROPIN,
        UnloadedKind.NOT_IMPORTED,
        "runtime.dropin-not-loaded",
        lost_handlers=True,
        why="stops loading",
    ),
    # 1.x shadowing: a registry drop-in after the toolkit's loses the handlers; one before it
    # loses its own config_path.
    *(
        Case(
            f"shadowed-handlers-{s}",
            s,
            lambda b: gpu_node(b).with_file(REGISTRY_DROPIN, NAIVE_REGISTRY),
            NVIDIA_DROPIN,
            UnloadedKind.SHADOWED,
            "runtime.shadowing",
            lost_handlers=True,
            why="replaces the whole",
        )
        for s in ("1.6", "1.7")
    ),
    *(
        Case(
            f"shadowed-registry-{s}",
            s,
            lambda b: gpu_node(b).with_file(EARLY_REGISTRY_DROPIN, NAIVE_REGISTRY),
            EARLY_REGISTRY_DROPIN,
            UnloadedKind.SHADOWED,
            "runtime.shadowing-settings",
            why="replaces the whole",
        )
        for s in ("1.6", "1.7")
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_unloaded_against_the_real_binary(case: Case) -> None:
    binary = containerd_binary(case.series)
    version = version_of(binary)
    files = case.files(binary)
    [dump] = real_dumps(binary, files)
    found = find_unloaded(files, version)
    node = NodeFacts("gpu-1", version, files, gpus=GpuFacts(count=4), effective_config=dump)
    findings = [f for f in check_runtime(node, ClusterFacts()) if f.check != "runtime.restarts"]
    if case.file is None:
        assert set(runtimes_of(dump)) >= HANDLERS
        assert found == [] and findings == []
        return
    # The real binary: what the file sets is not loaded.
    if case.lost_handlers:
        assert not HANDLERS & set(runtimes_of(dump)), sorted(runtimes_of(dump))
    else:
        assert config_path_of(dump) != CERTS_D
    # The engine: this file, these settings, why on this version.
    [mine] = [u for u in found if u.file == case.file]
    assert mine.kind is case.kind
    assert case.why in mine.describe() and mine.remedy in mine.describe()
    if case.lost_handlers:
        assert set(mine.handlers) >= HANDLERS
    else:
        assert any(p[-2:] == CONFIG_PATH for p in mine.settings), mine.settings
    # diagnose: the finding, an error exactly when a handler is lost with the file.
    [finding] = [f for f in findings if f.check == case.check]
    assert finding.severity is (Severity.ERROR if case.lost_handlers else Severity.WARNING)
    text = "\n".join((finding.cause, *finding.evidence))
    assert f"containerd {version.series}" in text
    assert any(line.startswith("to fix: ") for line in finding.evidence)
    if case.kind is not UnloadedKind.SHADOWED:
        assert case.file in finding.cause and case.why in finding.cause
        shown = "config_path" if not case.lost_handlers else "runtimes.nvidia"
        assert any(line.startswith("not loaded: ") and shown in line for line in finding.evidence)
