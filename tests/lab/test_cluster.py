"""The lab as a whole: planning, prerequisites, the lab directory, status, and `down`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path

import pytest

from rollout.errors import BadInput
from rollout.inventory import load_inventory
from rollout.lab import prerequisites
from rollout.lab.cli import add_parser, format_status
from rollout.lab.cluster import (
    Lab,
    LabFailed,
    LabOptions,
    bring_up_lab,
    plan_nodes,
    read_lab_status,
    tear_down_lab,
)
from rollout.lab.nodes import node_cgroup_dirs, process_alive
from tests.lab.test_cluster_shared import (
    TEST_GPUS,
    TEST_SERIES,
    require_lab_prerequisites,
    shared_lab,
)

VERSION_PREFIX = {"1.6": "1.6.20", "1.7": "1.7.24", "2.1": "2.1.9"}


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return shared_lab(request)


# --- pure --------------------------------------------------------------------------------


def test_plan_cycles_the_containerd_list_over_the_nodes(tmp_path: Path) -> None:
    nodes = plan_nodes(LabOptions(lab_dir=tmp_path, nodes=5, containerd=("1.6", "2.1"), gpus=3))
    assert [n.containerd for n in nodes] == ["1.6", "2.1", "1.6", "2.1", "1.6"]
    assert [n.address for n in nodes] == [f"127.0.1.{i}" for i in range(1, 6)]
    assert [n.name for n in nodes] == [f"lab-node-{i}" for i in range(1, 6)]
    uuids = [g.uuid for n in nodes for g in n.gpus]
    assert len(set(uuids)) == 15 and all(u.startswith("GPU-") for u in uuids)
    assert len({n.machine for n in nodes}) == 5


def test_default_plan_is_four_nodes_of_three_series(tmp_path: Path) -> None:
    nodes = plan_nodes(LabOptions(lab_dir=tmp_path))
    assert [n.containerd for n in nodes] == ["1.6", "1.7", "2.1", "1.7"]
    assert all(len(n.gpus) == 4 for n in nodes)


@pytest.mark.parametrize(
    "options",
    [
        {"nodes": 0},
        {"containerd": ("1.5",)},
        {"address_prefix": "10.0.0"},
        {"gpus": -1},
    ],
)
def test_plan_rejects_bad_options(tmp_path: Path, options: dict[str, object]) -> None:
    with pytest.raises(BadInput):
        plan_nodes(LabOptions(lab_dir=tmp_path, **options))  # type: ignore[arg-type]


def test_mirror_is_read_from_deb822_sources() -> None:
    text = (
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example/debian/\nSuites: bookworm\n"
    )
    assert prerequisites._mirror_from_deb822(text) == "http://mirror.example/debian"
    one_line = "deb http://mirror.example/debian-security bookworm-security main\n" + (
        "deb [arch=amd64] http://mirror.example/debian bookworm main\n"
    )
    assert prerequisites._mirror_from_one_line(one_line) == "http://mirror.example/debian"


def test_prerequisites_name_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    missing = [str(m) for m in prerequisites.find_missing()]
    assert any("systemd-nspawn: apt-get install systemd-container" in m for m in missing)
    assert any("debootstrap: apt-get install debootstrap" in m for m in missing)


def test_cli_parses_up_options() -> None:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["lab", "up", "--nodes", "2", "--containerd", "2.1,1.6", "--gpus", "1"]
    )
    assert (args.nodes, args.containerd, args.gpus) == (2, ("2.1", "1.6"), 1)
    assert callable(args.func)
    for command in ("down", "status"):
        assert callable(parser.parse_args(["lab", command, "--lab-dir", "/x"]).func)
    with pytest.raises(SystemExit):
        parser.parse_args(["lab", "up", "--containerd", "1.5"])


# --- the lab -----------------------------------------------------------------------------


@pytest.mark.lab
def test_lab_json_is_the_control_plane_contract(lab: Lab) -> None:
    data = json.loads((lab.lab_dir / "lab.json").read_text())
    assert set(data) == {"api", "device_plugin_grace_s", "nodes", "endpoints"}
    assert data["endpoints"] == []  # the shared lab has no SSH endpoints (lab up --endpoints)
    assert data["api"]["host"] == "127.0.0.1" and isinstance(data["api"]["port"], int)
    assert data["device_plugin_grace_s"] == 300
    assert [n["containerd"] for n in data["nodes"]] == list(TEST_SERIES)
    for node in data["nodes"]:
        assert set(node) == {"name", "address", "containerd", "gpus", "driver_version", "root"}
        assert len(node["gpus"]) == TEST_GPUS
        assert set(node["gpus"][0]) == {"index", "product", "uuid", "memory_mib"}
        assert node["driver_version"] == "535.183.01"
        root = Path(node["root"])
        assert (root / "var/lib/rollout-lab/containerd-running.toml").is_file()
        assert (root / "etc/hostname").read_text().strip() == node["name"]


@pytest.mark.lab
def test_inventory_loads_with_rollouts_loader(lab: Lab) -> None:
    inventory = load_inventory(lab.inventory)
    assert inventory.names == tuple(n.name for n in lab.nodes)
    host = inventory.by_name("lab-node-1")
    assert host is not None
    assert host.address == lab.nodes[0].address and host.user == "root" and host.port == 22
    assert host.key_file == str(lab.lab_dir / "id_ed25519")
    assert host.known_hosts == str(lab.lab_dir / "known_hosts")
    assert not host.become


@pytest.mark.lab
def test_kubeconfig_loads_in_the_official_client(lab: Lab) -> None:
    from kubernetes import config

    client = config.new_client_from_config(str(lab.kubeconfig), context="rollout-lab")
    assert client.configuration.host == lab.api_url


@pytest.mark.lab
def test_status_reports_every_node_running_with_its_containerd(lab: Lab) -> None:
    status = read_lab_status(lab.lab_dir)
    assert [n.name for n in status.nodes] == [n.name for n in lab.nodes]
    for node, spec in zip(status.nodes, lab.nodes, strict=True):
        assert node.running and node.ssh_ok and node.containerd_state == "active"
        assert (
            node.containerd_version and VERSION_PREFIX[spec.containerd] in node.containerd_version
        )
    text = format_status(status)
    assert "lab-node-1" in text and "control plane:" in text


@pytest.mark.lab
def test_up_refuses_a_lab_dir_that_is_up(lab: Lab) -> None:
    with pytest.raises(LabFailed, match="already up"):
        bring_up_lab(LabOptions(lab_dir=lab.lab_dir, nodes=1, address_prefix="127.0.44"))


@pytest.mark.lab
def test_up_refuses_a_foreign_non_empty_directory(tmp_path: Path) -> None:
    require_lab_prerequisites()
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(LabFailed, match="not a lab directory"):
        bring_up_lab(LabOptions(lab_dir=tmp_path, nodes=1, address_prefix="127.0.45"))
    with pytest.raises(LabFailed, match="not a lab directory"):
        tear_down_lab(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.lab
def test_down_leaves_nothing_behind(tmp_path: Path) -> None:
    require_lab_prerequisites()
    lab_dir = tmp_path / "lab"
    options = LabOptions(
        lab_dir=lab_dir,
        nodes=2,
        containerd=("2.1", "1.6"),
        gpus=1,
        address_prefix="127.0.43",
        api_port=0,
    )
    lab = bring_up_lab(options, progress=lambda line: None)
    pids = [int(lab.node_dirs(n).pid_file.read_text()) for n in lab.nodes]
    cgroups = [d for n in lab.nodes for d in node_cgroup_dirs(n)]
    assert all(process_alive(p) for p in pids)
    tear_down_lab(lab_dir, progress=lambda line: None)
    assert not lab_dir.exists()
    assert str(lab_dir) not in Path("/proc/mounts").read_text()
    assert not any(process_alive(p) for p in pids)
    assert not any(d.exists() for d in cgroups)
    machines = {n.machine for n in lab.nodes}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and process_alive(int(proc.name)):
            try:
                cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            assert not any(m in cmdline for m in machines), cmdline
            assert str(lab_dir) not in cmdline, cmdline
    assert os.listdir(tmp_path) == []


@pytest.mark.lab
def test_image_build_is_cached_and_safe_to_run_concurrently(lab: Lab) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from rollout.lab.image import SERIES, build_image, find_image

    cached = find_image()
    assert cached is not None, "the shared lab built (or found) the image"
    lines: list[str] = []
    with ThreadPoolExecutor(max_workers=2) as pool:
        images = list(pool.map(lambda _: build_image(progress=lines.append), range(2)))
    assert images == [cached, cached]
    assert not any("debootstrap" in line for line in lines), "no rebuild of a cached image"
    for series in SERIES:
        assert (cached.layer(series) / "usr/bin/containerd").is_file()
    debs = sorted(p.name for p in (cached.base / "opt/rollout-lab/debs").iterdir())
    assert [d.split("_")[1][:3] for d in debs] == list(SERIES)


@pytest.mark.lab
def test_an_api_port_taken_meanwhile_moves_to_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    from rollout.lab import cluster

    require_lab_prerequisites()
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    real_choose = cluster._choose_port
    chosen = iter([taken])  # the first automatic choice is lost to another process

    def racing_choice(wanted: int) -> int:
        return next(chosen, None) or real_choose(wanted)

    monkeypatch.setattr(cluster, "_choose_port", racing_choice)
    lab_dir = tmp_path / "lab"
    options = LabOptions(
        lab_dir=lab_dir, nodes=1, containerd=("1.7",), gpus=1, address_prefix="127.0.43"
    )
    options = dataclasses.replace(options, api_port=0)
    try:
        lab = bring_up_lab(options, progress=lambda line: None)
        try:
            assert lab.api_port != taken
            assert json.loads((lab_dir / "lab.json").read_text())["api"]["port"] == lab.api_port
            assert f":{lab.api_port}" in (lab_dir / "kubeconfig").read_text()
        finally:
            tear_down_lab(lab_dir, progress=lambda line: None)
    finally:
        holder.close()
