"""Hostile containerd changes: what `rollout apply` would fail on (at the node's write, after
cordon and drain, or with containerd refusing its config) fails in `rollout plan`, located at
the plan's line and naming the node: unknown keys, values of a type containerd cannot load,
integers beyond int64, a scalar for a table, a default runtime no file defines, registry
config_paths that are not one normalised line or where a file stands. Every case: exit 2 (1
with --detailed-exitcode), no traceback, nothing written (see tests/hostile.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.changes.containerd.writes import plan_node_containerd
from rollout.containerd import (
    ContainerdVersion,
    CriSetting,
    SettingTypeError,
    UnknownCriSetting,
    place_setting,
)
from rollout.facts.model import NodeFactsError
from rollout.spec.plan import parse_spec
from tests.hostile import EXAMPLE_FACTS, HostileCase, hostile_test, run_case
from tests.node_facts import containerd_node

V16, V17, V21 = "gpu-a-1", "gpu-a-2", "gpu-b-1"  # the example nodes of each series
HEAD = """\
apiVersion: rollout/v1
kind: Plan
metadata:
  name: settings
targets:
  nodes: [{node}]
changes:
"""
MAIN = "/etc/containerd/config.toml"
SETTING_LINE = 10  # the line of the one setting in a settings plan
PATH_LINE = 10  # the line of config_path in a registry plan


def settings_plan(node: str, key: str, value: str) -> str:
    return HEAD.format(node=node) + f"  - containerd:\n      settings:\n        {key}: {value}\n"


def registry_plan(config_path: str, node: str = V17) -> str:
    return HEAD.format(node=node) + (
        "  - registry:\n"
        "      host: docker.io\n"
        f"      config_path: {config_path}\n"
        "      endpoints:\n"
        "        - url: https://mirror.registry.internal:5000\n"
    )


def plan_case(id: str, text: str, line: int, *says: str) -> HostileCase:
    return HostileCase(
        id,
        argv=("plan", "plan.yaml", "--facts", EXAMPLE_FACTS),
        files={"plan.yaml": text},
        where=f"plan.yaml:{line}",
        says=says,
        problems=1,
        max_s=10.0,
    )


def setting_case(id: str, node: str, key: str, value: str, *says: str) -> HostileCase:
    """A plan setting `key: value` on `node`; the message names the node and says `says`."""
    return plan_case(id, settings_plan(node, key, value), SETTING_LINE, f"node {node}", *says)


def spec_case(id: str, key: str, value: str, *says: str) -> HostileCase:
    """A setting the plan itself refuses, whatever the node."""
    return plan_case(id, settings_plan(V17, key, value), SETTING_LINE, *says)


UNKNOWN_KEYS = [
    setting_case("typo-enable-cdii", V17, "enable_cdii", "true", "not a CRI setting"),
    setting_case("enable-cdi-on-1.6", V16, "enable_cdi", "true", "not a CRI setting", "1.6.20"),
    setting_case(
        "systemd-cgroup-on-2.1", V21, "systemd_cgroup", "true", "removed in containerd 2.x"
    ),
    setting_case(
        "containerd-table-typo", V17, "containerd.default_runtime_nmae", "runc", "is not a key"
    ),
    setting_case(
        "default-runtime-removed-in-2", V21, "containerd.default_runtime.runtime_type", "x", "2.1.9"
    ),
    setting_case("key-under-a-value", V17, "enable_cdi.x", "true", "is a value, not a table"),
    setting_case(
        "whole-runtime-as-a-scalar", V17, "containerd.runtimes.nvidia", '"x"', "name a key"
    ),
    setting_case("containerd-as-a-scalar", V17, "containerd", "5", "name a key"),
]

WRONG_TYPES = [
    setting_case("bool-quoted", V17, "enable_cdi", '"yes"', "as a boolean", "without quotes"),
    setting_case("bool-as-int", V17, "enable_cdi", "1", "as a boolean", "found an integer"),
    setting_case("bool-quoted-on-2.1", V21, "enable_cdi", '"false"', "as a boolean"),
    setting_case("int-quoted", V16, "max_concurrent_downloads", '"3"', "as an integer"),
    setting_case("int-as-fraction", V17, "max_concurrent_downloads", "3.5", "as an integer"),
    setting_case("int-as-bool", V21, "max_concurrent_downloads", "true", "as an integer"),
    setting_case("string-as-int", V16, "stream_server_port", "10010", "as a string"),
    setting_case("string-as-list", V17, "sandbox_image", "[a]", "as a string"),
    setting_case("sandbox-image-int-on-2.1", V21, "sandbox_image", "5", "as a string"),
    setting_case("table-as-string", V16, "cni", '"x"', "as a table"),
    setting_case("table-as-list", V21, "cni", "[x]", "as a table"),
    setting_case("array-as-string", V17, "cdi_spec_dirs", "/etc/cdi", "as an array"),
    setting_case("array-of-ints", V17, "cdi_spec_dirs", "[1, 2]", "as a string"),
    setting_case(
        "runtime-type-int", V17, "containerd.runtimes.nvidia.runtime_type", "5", "as a string"
    ),
    setting_case(
        "runtime-option-quoted-bool",
        V16,
        "containerd.runtimes.nvidia.options.SystemdCgroup",
        '"true"',
        "as a boolean",
    ),
    setting_case(
        "runtime-option-quoted-bool-on-2.1",
        V21,
        "containerd.runtimes.nvidia.options.SystemdCgroup",
        '"true"',
        "as a boolean",
    ),
    setting_case(
        "runtime-flag-word",
        V17,
        "containerd.runtimes.nvidia.privileged_without_host_devices",
        "'no'",
        "as a boolean",
    ),
    setting_case(
        "table-with-a-wrong-leaf",
        V17,
        "cni",
        "{bin_dir: /opt/cni/bin, max_conf_num: many}",
        "cni.max_conf_num",
        "as an integer",
    ),
    setting_case(
        "runtime-annotations-a-string",
        V21,
        "containerd.runtimes.nvidia.pod_annotations",
        "nvidia.com/*",
        "as an array",
    ),
]

BEYOND_INT64 = [
    spec_case("int-2-to-the-64", "max_concurrent_downloads", str(2**64), "64-bit"),
    spec_case("int-below-int64", "max_concurrent_downloads", str(-(2**63) - 1), "64-bit"),
    spec_case(
        "int-beyond-int64-in-a-table",
        "containerd.runtimes.nvidia.options",
        f"{{Threshold: {2**70}}}",
        "64-bit",
    ),
    spec_case("int-beyond-int64-in-a-list", "cdi_spec_dirs", f"[{2**65}]", "64-bit"),
]

DEFAULT_RUNTIME = [
    plan_case(
        "default-runtime-undefined",
        HEAD.format(node=V17) + "  - containerd:\n      default_runtime: ghost\n",
        9,
        f"node {V17}",
        "'ghost' is not defined",
        "nvidia",
    ),
    plan_case(
        "default-runtime-undefined-on-2.1",
        HEAD.format(node=V21) + "  - containerd:\n      default_runtime: ghost\n",
        9,
        f"node {V21}",
        "'ghost' is not defined",
    ),
    setting_case(
        "default-runtime-name-setting-undefined",
        V16,
        "containerd.default_runtime_name",
        "ghost",
        "'ghost' is not defined",
    ),
]

CONFIG_PATHS = [
    plan_case("config-path-double-slash", registry_plan("/etc/containerd//certs.d"), PATH_LINE),
    plan_case("config-path-trailing-slash", registry_plan("/etc/containerd/certs.d/"), PATH_LINE),
    plan_case("config-path-dot", registry_plan("/etc/containerd/./certs.d"), PATH_LINE),
    plan_case(
        "config-path-newline",
        registry_plan('"/etc/containerd/certs.d\\n[plugins]"'),
        PATH_LINE,
        "normalised",
    ),
    plan_case(
        "config-path-tab", registry_plan('"/etc/containerd/certs\\t.d"'), PATH_LINE, "control"
    ),
    plan_case(
        "config-path-a-file",
        registry_plan("/etc/containerd/config.toml"),
        PATH_LINE,
        f"node {V17}",
        "is a file on the node",
    ),
    plan_case(
        "config-path-inside-a-dropin",
        registry_plan("/etc/containerd/conf.d/99-nvidia.toml/x", node=V21),
        PATH_LINE,
        f"node {V21}",
        "is a file on the node",
    ),
    plan_case(
        "registry-host-named-like-a-file",
        registry_plan("/etc/containerd", node=V16).replace("host: docker.io", "host: config.toml"),
        PATH_LINE,
        f"node {V16}",
        "/etc/containerd/config.toml is a file on the node",
    ),
]

CASES = UNKNOWN_KEYS + WRONG_TYPES + BEYOND_INT64 + DEFAULT_RUNTIME + CONFIG_PATHS


test_hostile_containerd_change = hostile_test(CASES)


def test_the_table_is_long_enough() -> None:
    assert len(CASES) >= 40


# --- the engine's own answer, without the CLI ------------------------------------------------

ACCEPTED: list[tuple[str, Any]] = [
    ("enable_cdi", True),
    ("max_concurrent_downloads", 3),
    ("cdi_spec_dirs", ["/etc/cdi"]),
    ("containerd.runtimes.nvidia.options.SystemdCgroup", True),
    ("containerd.runtimes.nvidia.runtime_type", "io.containerd.runc.v2"),
    ("containerd.runtimes.nvidia.options.BinaryName", "/usr/bin/nvidia-container-runtime"),
    ("containerd.runtimes.kata.options.ConfigPath", "/opt/kata.toml"),  # unknown option: free
    ("registry.config_path", "/etc/containerd/certs.d"),
]
REFUSED: list[tuple[str, Any]] = [
    ("enable_cdi", "true"),
    ("max_concurrent_downloads", 2**63),
    ("max_concurrent_downloads", 1.0),
    ("cdi_spec_dirs", "/etc/cdi"),
    ("containerd.runtimes.nvidia.options.SystemdCgroup", 1),
    ("cni", {"bin_dir": 5}),
    ("registry.config_path", ["/etc/containerd/certs.d"]),
]
SERIES = ["1.7.24", "2.1.9"]


@pytest.mark.parametrize("series", SERIES)
@pytest.mark.parametrize(("key", "value"), ACCEPTED)
def test_values_of_the_defaults_type_are_placed(series: str, key: str, value: Any) -> None:
    version = ContainerdVersion.from_series(series)
    place_setting(CriSetting(key, value), version, 2)


@pytest.mark.parametrize("series", SERIES)
@pytest.mark.parametrize(("key", "value"), REFUSED)
def test_values_of_another_type_are_refused(series: str, key: str, value: Any) -> None:
    version = ContainerdVersion.from_series(series)
    with pytest.raises(SettingTypeError, match=key.split(".")[0]) as info:
        place_setting(CriSetting(key, value), version, 2)
    assert info.value.exit_code == 2


def test_an_unknown_key_is_bad_input() -> None:
    with pytest.raises(UnknownCriSetting) as info:
        place_setting(CriSetting("enable_cdii", True), ContainerdVersion.from_series("1.7"), 2)
    assert info.value.exit_code == 2


# --- a live node's own files: named by node and path, bad input -------------------------------

LIVE_BROKEN = [
    (
        "not-toml",
        "version = 2\nx = = 1\n",
        "gpu-9:/etc/containerd/config.toml:2:5",
        "not valid TOML",
    ),
    (
        "import-missing",
        'version = 2\nimports = ["/etc/containerd/gone.toml"]\n',
        "gpu-9:/etc/containerd/config.toml",
        "does not exist",
    ),
    ("version-a-string", 'version = "2"\n', "gpu-9:/etc/containerd/config.toml", "integer"),
]


@pytest.mark.parametrize(
    ("text", "where", "says"), [c[1:] for c in LIVE_BROKEN], ids=[c[0] for c in LIVE_BROKEN]
)
def test_a_live_nodes_broken_config_names_the_node_and_file(
    text: str, where: str, says: str
) -> None:
    node = containerd_node("gpu-9", config=text)
    spec = parse_spec(settings_plan("gpu-9", "enable_cdi", "true"), "plan.yaml")
    with pytest.raises(NodeFactsError) as info:
        plan_node_containerd(spec, node)
    assert str(info.value).startswith(f"{where}: node gpu-9: ")
    assert says in str(info.value)
    assert info.value.exit_code == 2


def test_a_default_runtime_defined_by_the_same_change_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = HEAD.format(node=V17) + (
        "  - containerd:\n"
        "      default_runtime: kata\n"
        "      settings:\n"
        "        containerd.runtimes.kata.runtime_type: io.containerd.kata.v2\n"
    )
    ok = HostileCase(
        "ok",
        argv=("plan", "plan.yaml", "--facts", EXAMPLE_FACTS),
        files={"plan.yaml": text},
        exit_code=0,
        max_s=30.0,
    )
    run_case(ok, tmp_path, monkeypatch)
