"""containerd's defaults: the recorded data against the real binaries, the overlay rules, the
real-binary source and its cache.

Re-record the data after fetching new binaries:
    ROLLOUT_RECORD_DEFAULTS=1 .venv/bin/pytest tests/containerd/test_defaults.py -k recorded
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, given, settings

from rollout.containerd import (
    ConfigFiles,
    ContainerdVersion,
    FilesOnly,
    LoadedConfig,
    LocalContainerd,
    RecordedDefaults,
    load_effective,
    merge_files,
)
from rollout.containerd.binaries import BinariesMissing
from rollout.containerd.defaults import (
    Defaults,
    overlay_defaults,
    recorded_defaults,
    render_recorded,
)
from rollout.containerd.localdump import record_defaults
from rollout.transports.local import LocalRunner
from tests.containerd.realdump import real_dumps, version_of
from tests.containerd.test_differential import MAX_EXAMPLES, node_files
from tests.fakes import ScriptedRunner

DATA = Path(__file__).resolve().parents[2] / "rollout" / "containerd" / "data"
MAIN = "/etc/containerd/config.toml"
V16 = ContainerdVersion.from_series("1.6.20")
V17 = ContainerdVersion.from_series("1.7.24")
V21 = ContainerdVersion.from_series("2.1.9")
SYSTEMD = {"SystemdCgroup": True}


# --- recorded data against the real binaries ----------------------------------------------------


def test_recorded_defaults_are_the_real_binarys(containerd_bin: Path) -> None:
    real = record_defaults(str(containerd_bin))
    if os.environ.get("ROLLOUT_RECORD_DEFAULTS"):
        for name, text in render_recorded(real, str(version_of(containerd_bin))).items():
            (DATA / name).write_text(text)
        recorded_defaults.cache_clear()
    assert recorded_defaults(real.series) == real, (
        "the recorded defaults differ from the real binary's; re-record with "
        "ROLLOUT_RECORD_DEFAULTS=1"
    )


# --- the overlay rules, on the recorded data ------------------------------------------------------


def _cri_runtime(version: ContainerdVersion) -> str:
    return "io.containerd.grpc.v1.cri" if version.major < 2 else "io.containerd.cri.v1.runtime"


def test_recorded_2_1_loads_enable_cdi_and_an_empty_config_path() -> None:
    files = ConfigFiles(MAIN, {MAIN: "version = 3\n"})
    loaded = load_effective(files, V21, RecordedDefaults())
    assert loaded.defaults_source == "recorded defaults of containerd 2.1"
    assert loaded.get(("plugins", "io.containerd.cri.v1.runtime", "enable_cdi")) is True
    assert loaded.get(("plugins", "io.containerd.cri.v1.images", "registry", "config_path")) == ""
    assert loaded.configured == {"version": 3}  # the files alone set only the version


def test_a_setting_overrides_its_default_and_tables_merge() -> None:
    defaults = Defaults("2.1", {"a": {"x": 1, "y": [1, 2]}, "b": True}, {})
    configured = {"a": {"y": []}, "b": False, "c": {"z": 0}}
    assert overlay_defaults(defaults, configured, V21) == {
        "a": {"x": 1, "y": []},
        "b": False,
        "c": {"z": 0},
    }
    assert defaults.tree == {"a": {"x": 1, "y": [1, 2]}, "b": True}  # not mutated


@pytest.mark.parametrize("version", [V16, V17, V21], ids=str)
def test_runtime_handlers_start_from_the_zero_handler(version: ContainerdVersion) -> None:
    cri = _cri_runtime(version)
    configured = {
        "version": version.max_config_version,
        "plugins": {
            cri: {"containerd": {"runtimes": {"runc": {"options": {"SystemdCgroup": True}}}}}
        },
    }
    loaded = overlay_defaults(recorded_defaults(version.series), configured, version)
    runc = loaded["plugins"][cri]["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is True
    if version.major < 2:
        # 1.x: the file's runtimes map replaces the default one, runc's runtime_type included
        assert runc["runtime_type"] == ""
        assert runc["options"] == {"SystemdCgroup": True}
    else:
        assert runc["runtime_type"] == "io.containerd.runc.v2"
        assert runc["options"]["BinaryName"] == ""


def test_1x_dumps_no_unknown_plugin_2x_keeps_it() -> None:
    configured = {"version": 2, "plugins": {"io.containerd.example.v1.x": {"a": 1}}}
    assert (
        "io.containerd.example.v1.x"
        not in overlay_defaults(recorded_defaults("1.7"), configured, V17)["plugins"]
    )
    configured["version"] = 3
    assert overlay_defaults(recorded_defaults("2.1"), configured, V21)["plugins"][
        "io.containerd.example.v1.x"
    ] == {"a": 1}


def test_a_series_without_recorded_defaults_uses_the_nearest_and_says_so() -> None:
    files = ConfigFiles(MAIN, {MAIN: "version = 2\n"})
    loaded = load_effective(files, ContainerdVersion.from_series("2.0.5"), RecordedDefaults())
    assert loaded.defaults_source == "recorded defaults of containerd 2.1 (none recorded for 2.0)"


def test_files_only_is_the_merge_model() -> None:
    files = ConfigFiles(MAIN, {MAIN: "version = 3\n"})
    loaded = load_effective(files, V21, FilesOnly())
    assert loaded.tree == loaded.configured == merge_files(files, V21).tree == {"version": 3}


# --- the recorded overlay against the real dump (differential) -------------------------------


@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_recorded_overlay_matches_the_real_dump(containerd_bin: Path, data: st.DataObject) -> None:
    version = version_of(containerd_bin)
    files = data.draw(node_files(version))
    try:
        model = merge_files(files, version)
    except Exception:
        return  # what the model refuses is test_differential's business
    (real,) = real_dumps(containerd_bin, files)
    recorded = RecordedDefaults().load(files, version, model.configured)
    assert recorded.tree == real


# --- the real binary, behind the seam, cached by content ------------------------------------


def dumps(runner: ScriptedRunner) -> int:
    return sum(1 for call in runner.calls if "config dump" in " ".join(call))


def test_local_containerd_dumps_once_per_content(containerd_bin: Path) -> None:
    version = version_of(containerd_bin)
    runner = ScriptedRunner(inner=LocalRunner())
    source = LocalContainerd(runner=runner, locate=lambda series: containerd_bin)
    config = "version = 2\n" if version.major < 2 else "version = 3\n"
    files = ConfigFiles(MAIN, {MAIN: config})
    first = load_effective(files, version, source)
    assert first.defaults_source == f"containerd {version}'s own config dump"
    assert first.tree == real_dumps(containerd_bin, files)[0]
    again = load_effective(ConfigFiles(MAIN, {MAIN: config}), version, source)
    assert again.tree == first.tree
    assert dumps(runner) == 1
    load_effective(files.with_file("/etc/containerd/other.toml", ""), version, source)
    assert dumps(runner) == 2  # other content, another dump


def test_local_containerd_falls_back_when_the_binary_is_missing() -> None:
    def missing(series: str) -> Path:
        raise BinariesMissing(f"no {series}")

    class Fallback:
        def load(
            self, files: ConfigFiles, version: ContainerdVersion, configured: Mapping[str, Any]
        ) -> LoadedConfig:
            return LoadedConfig({"fallback": True}, "the fallback")

    source = LocalContainerd(locate=missing, fallback=Fallback())
    loaded = load_effective(ConfigFiles(MAIN, {MAIN: "version = 2\n"}), V17, source)
    assert (loaded.tree, loaded.defaults_source) == ({"fallback": True}, "the fallback")
    assert source.dumps_run == 0
