"""A runc handler's `options` keys, checked against runc's options message per version."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.containerd import (
    ContainerdVersion,
    CriSetting,
    UnknownRuntimeOption,
    check_runtime_options,
    runtime_type_in,
)
from rollout.containerd.localdump import record_defaults
from rollout.containerd.runtimeoptions import runc_option_keys
from rollout.containerd.version import CRI_RUNTIME, CRI_V2
from tests.containerd.realdump import version_of
from tests.hostile import EXAMPLE_FACTS, GOOD_PLAN, HostileCase, hostile_test

VERSIONS = [ContainerdVersion.from_series(v) for v in ("1.6.20", "1.7.24", "2.1.9", "2.2.0")]
TYPO = "containerd.runtimes.nvidia.options.SystemdCgroups"


def test_the_keys_are_the_real_binarys_runc_options(containerd_bin: Path) -> None:
    version = version_of(containerd_bin)
    cri = CRI_V2 if version.major < 2 else CRI_RUNTIME
    real = record_defaults(str(containerd_bin)).tree["plugins"][cri]["containerd"]["runtimes"]
    dumped = set(real["runc"]["options"])
    assert dumped <= runc_option_keys(version)
    # 1.x dumps the whole message; 2.x a template without three of its fields (source)
    extra = {"NoPivotRoot", "TaskApiAddress", "TaskApiVersion"} if version.major >= 2 else set()
    assert runc_option_keys(version) == dumped | extra


def test_keys_differ_by_version() -> None:
    v16, v21 = ContainerdVersion.from_series("1.6.20"), ContainerdVersion.from_series("2.1.9")
    assert "CriuPath" in runc_option_keys(v16)  # removed from the message in 2.0
    assert "CriuPath" not in runc_option_keys(v21)
    assert "TaskApiAddress" in runc_option_keys(v21)


@pytest.mark.parametrize("version", VERSIONS, ids=str)
def test_a_typo_is_refused_with_the_real_key(version: ContainerdVersion) -> None:
    with pytest.raises(UnknownRuntimeOption, match="did you mean 'SystemdCgroup'"):
        check_runtime_options(CriSetting(TYPO, True), version, None)
    check_runtime_options(CriSetting(TYPO[:-1], True), version, "io.containerd.runc.v2")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("containerd.runtimes.nvidia.options", {"SystemdCgroup": True, "BinaryNam": "/x"}),
        ("containerd.runtimes.nvidia", {"options": {"BinaryNam": "/x"}}),
    ],
)
def test_keys_inside_a_table_value_are_checked(key: str, value: object) -> None:
    with pytest.raises(UnknownRuntimeOption, match="'BinaryNam'; did you mean 'BinaryName'"):
        check_runtime_options(CriSetting(key, value), VERSIONS[0], None)


def test_another_shims_options_are_its_own() -> None:
    kata = CriSetting("containerd.runtimes.kata.options.ConfigPath", "/etc/kata.toml")
    stated = (CriSetting("containerd.runtimes.kata.runtime_type", "io.containerd.kata.v2"),)
    runtime_type = runtime_type_in("kata", (*stated, kata), {})
    assert runtime_type == "io.containerd.kata.v2"
    check_runtime_options(kata, VERSIONS[2], runtime_type)
    # the node's own config says which shim a handler runs
    tree = {
        "plugins": {
            CRI_RUNTIME: {
                "containerd": {"runtimes": {"kata": {"runtime_type": "io.containerd.kata.v2"}}}
            }
        }
    }
    assert runtime_type_in("kata", (kata,), tree) == "io.containerd.kata.v2"
    assert runtime_type_in("nvidia", (kata,), tree) is None


TYPO_PLAN = (
    GOOD_PLAN
    + f"""  - containerd:
      settings:
        {TYPO}: true
"""
)

test_typo_refused_and_nothing_written = hostile_test(
    [
        HostileCase(
            "runtime-option-typo",
            argv=("plan", "plan.yaml", "--facts", EXAMPLE_FACTS),
            files={"plan.yaml": TYPO_PLAN},
            where="plan.yaml:14",
            says=(
                "'containerd.runtimes.nvidia.options.SystemdCgroups'",
                "no key 'SystemdCgroups'; did you mean 'SystemdCgroup'?",
            ),
            problems=1,
            max_s=60.0,  # a refusal, not a bomb: no time limit of its own on a busy machine
        )
    ]
)
