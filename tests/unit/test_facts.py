"""Recorded facts: the layout of examples/facts and every way a facts directory can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.errors import InputError
from rollout.facts import load_recorded_facts

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "facts"


def write_node(root: Path, name: str, node_yaml: str, files: dict[str, str]) -> Path:
    node = root / name
    node.mkdir(parents=True)
    (node / "node.yaml").write_text(node_yaml)
    for path, text in files.items():
        target = node / "files" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return node


def test_examples_load_with_versions_and_files() -> None:
    fleet = load_recorded_facts(EXAMPLES)
    assert [n.name for n in fleet.nodes] == ["gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1"]
    series = {n.name: n.containerd.series for n in fleet.nodes}
    assert series == {"gpu-a-1": "1.6", "gpu-a-2": "1.7", "gpu-a-3": "1.7", "gpu-b-1": "2.1"}
    broken = fleet.by_name("gpu-a-3")
    assert broken is not None
    assert "/etc/containerd/conf.d/registry.toml" in broken.config_files.files
    assert broken.config_files.main_path == "/etc/containerd/config.toml"
    assert broken.gpus.count == 4 and len(broken.gpus.uuids) == 4


def test_missing_directory_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="facts directory not found"):
        load_recorded_facts(tmp_path / "nope")


def test_directory_without_nodes_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no node facts"):
        load_recorded_facts(tmp_path)


def test_missing_version_names_the_field(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", "name: n1\n", {"/etc/containerd/config.toml": "version = 2\n"})
    with pytest.raises(InputError) as info:
        load_recorded_facts(tmp_path)
    assert info.value.field == "containerd_version"
    assert str(info.value).startswith(str(tmp_path / "n1" / "node.yaml"))


def test_missing_main_config_says_where_to_put_it(tmp_path: Path) -> None:
    write_node(
        tmp_path,
        "n1",
        "containerd_version: containerd github.com/containerd/containerd 1.7.24 x\n",
        {},
    )
    with pytest.raises(InputError, match=r"/etc/containerd/config\.toml is not among"):
        load_recorded_facts(tmp_path)


def test_unknown_key_is_refused(tmp_path: Path) -> None:
    write_node(
        tmp_path,
        "n1",
        "containerd_version: containerd github.com/containerd/containerd 1.7.24 x\nlabelz: {}\n",
        {"/etc/containerd/config.toml": "version = 2\n"},
    )
    with pytest.raises(InputError, match="unknown key 'labelz'"):
        load_recorded_facts(tmp_path)


def test_yaml_error_carries_line_and_column(tmp_path: Path) -> None:
    write_node(tmp_path, "n1", "name: n1\nlabels: {a: [}\n", {})
    with pytest.raises(InputError) as info:
        load_recorded_facts(tmp_path)
    assert info.value.location.line == 2


def test_cordoned_node_is_unavailable(tmp_path: Path) -> None:
    write_node(
        tmp_path,
        "n1",
        "containerd_version: containerd github.com/containerd/containerd 1.7.24 x\n"
        "unschedulable: true\n",
        {"/etc/containerd/config.toml": "version = 2\n"},
    )
    (node,) = load_recorded_facts(tmp_path).nodes
    assert not node.available
