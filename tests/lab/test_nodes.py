"""Lab nodes, through the real parts: sshd, systemd, containerd, apt, the nvidia-smi stand-in."""

from __future__ import annotations

import json
import re
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from rollout.containerd.toolkit import NVIDIA_RUNTIMES, render_toolkit_dropin
from rollout.containerd.version import RUNTIME_PLUGIN
from rollout.lab.cluster import Lab
from rollout.lab.nodes import RUNNING_RECORD
from rollout.transports.local import LocalRunner
from tests.lab.labapi import wait_for
from tests.lab.test_cluster_shared import (
    node_of_series,
    shared_lab,
    ssh_check,
)

SERIES = ("1.6", "1.7", "2.1")
VERSION_PREFIX = {"1.6": "1.6.20", "1.7": "1.7.24", "2.1": "2.1.9"}
RESTART_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return shared_lab(request)


def runtimes_of(config: dict[str, Any]) -> dict[str, Any]:
    plugin = RUNTIME_PLUGIN[int(config["version"])]
    runtimes: dict[str, Any] = config["plugins"][plugin]["containerd"]["runtimes"]
    return runtimes


def service_state(lab: Lab, series: str) -> dict[str, str]:
    out = ssh_check(
        lab,
        node_of_series(lab, series),
        [
            "systemctl",
            "show",
            "containerd",
            "-p",
            "MainPID",
            "-p",
            "NRestarts",
            "-p",
            "ActiveState",
        ],
    )
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# --- pure: the toolkit drop-in -----------------------------------------------------------


def test_toolkit_drop_in_copies_the_whole_v2_cri_table() -> None:
    dump = {
        "version": 2,
        "plugins": {
            "io.containerd.grpc.v1.cri": {
                "sandbox_image": "registry.k8s.io/pause:3.8",
                "registry": {"config_path": ""},
                "containerd": {
                    "default_runtime_name": "runc",
                    "runtimes": {
                        "runc": {
                            "runtime_type": "io.containerd.runc.v2",
                            "options": {"SystemdCgroup": True},
                        }
                    },
                },
            },
            "io.containerd.internal.v1.opt": {"path": "/opt"},
        },
    }
    drop_in = render_toolkit_dropin(dump)
    cri = drop_in["plugins"]["io.containerd.grpc.v1.cri"]
    assert drop_in["version"] == 2
    assert set(drop_in["plugins"]) == {"io.containerd.grpc.v1.cri"}
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.8"
    assert cri["registry"] == {"config_path": ""}
    runtimes = cri["containerd"]["runtimes"]
    for name, binary in NVIDIA_RUNTIMES.items():
        assert runtimes[name]["runtime_type"] == "io.containerd.runc.v2"
        assert runtimes[name]["options"] == {"SystemdCgroup": True, "BinaryName": binary}
    assert "BinaryName" not in runtimes["runc"]["options"], "the source table is not modified"


def test_toolkit_drop_in_uses_the_v3_runtime_plugin() -> None:
    dump = {
        "version": 3,
        "plugins": {
            "io.containerd.cri.v1.runtime": {"containerd": {"runtimes": {"runc": {}}}},
            "io.containerd.cri.v1.images": {"registry": {"config_path": ""}},
        },
    }
    drop_in = render_toolkit_dropin(dump)
    assert drop_in["version"] == 3
    assert set(drop_in["plugins"]) == {"io.containerd.cri.v1.runtime"}
    runtimes = drop_in["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", *NVIDIA_RUNTIMES}


# --- the lab -----------------------------------------------------------------------------


@pytest.mark.lab
def test_nodes_answer_ssh_with_the_lab_key_and_known_hosts(lab: Lab) -> None:
    for node in lab.nodes:
        assert ssh_check(lab, node, ["hostname"]).strip() == node.name


@pytest.mark.lab
def test_a_wrong_host_key_is_refused(lab: Lab, tmp_path: Path) -> None:
    first, second = lab.nodes[0], lab.nodes[1]
    lines = lab.ssh.known_hosts.read_text().splitlines()
    first_key = next(line for line in lines if line.startswith(first.address + " "))
    wrong = tmp_path / "known_hosts"
    wrong.write_text(first_key.replace(first.address, second.address, 1) + "\n")
    argv = lab.ssh.argv(second.address, ["true"])
    argv[argv.index(f"UserKnownHostsFile={lab.ssh.known_hosts}")] = f"UserKnownHostsFile={wrong}"
    result = LocalRunner().run(argv, timeout_s=30.0)
    assert result.exit_code == 255
    assert "HOST IDENTIFICATION HAS CHANGED" in result.stderr or "host key" in result.stderr.lower()


@pytest.mark.lab
@pytest.mark.parametrize("series", SERIES)
def test_node_runs_containerd_of_its_series(lab: Lab, series: str) -> None:
    node = node_of_series(lab, series)
    assert VERSION_PREFIX[series] in ssh_check(lab, node, ["containerd", "--version"])
    assert ssh_check(lab, node, ["systemctl", "is-active", "containerd"]).strip() == "active"
    server = ssh_check(lab, node, ["ctr", "version"])
    assert server.count(VERSION_PREFIX[series]) >= 2, "client and server versions"
    unit = ssh_check(lab, node, ["systemctl", "show", "containerd", "-p", "FragmentPath"])
    assert unit.strip().endswith("/lib/systemd/system/containerd.service"), "Debian's unit"


@pytest.mark.lab
@pytest.mark.parametrize("series", SERIES)
def test_config_dump_has_the_nvidia_handlers(lab: Lab, series: str) -> None:
    node = node_of_series(lab, series)
    dump = tomllib.loads(ssh_check(lab, node, ["containerd", "config", "dump"]))
    runtimes = runtimes_of(dump)
    for name, binary in NVIDIA_RUNTIMES.items():
        assert runtimes[name]["options"]["BinaryName"] == binary
    main = ssh_check(lab, node, ["cat", "/etc/containerd/config.toml"])
    assert 'imports = [\n    "/etc/containerd/conf.d/*.toml",\n]' in main


@pytest.mark.lab
@pytest.mark.parametrize("series", SERIES)
def test_running_record_holds_the_loaded_handlers(lab: Lab, series: str) -> None:
    node = node_of_series(lab, series)
    record = lab.node_dirs(node).host_path(RUNNING_RECORD)
    runtimes = runtimes_of(tomllib.loads(record.read_text()))
    assert "nvidia" in runtimes
    root = lab.to_json()["nodes"][lab.nodes.index(node)]["root"]
    assert record == Path(root) / RUNNING_RECORD.lstrip("/")


@pytest.mark.lab
@pytest.mark.parametrize("series", SERIES)
def test_sighup_is_a_restart_by_systemd(lab: Lab, series: str) -> None:
    node = node_of_series(lab, series)
    before = service_state(lab, series)
    since = ssh_check(lab, node, ["date", "+%Y-%m-%d %H:%M:%S"]).strip()
    time.sleep(1.0)  # journalctl --since has one-second resolution
    ssh_check(lab, node, ["systemctl", "kill", "-s", "HUP", "containerd"])

    def restarted() -> dict[str, str] | None:
        state = service_state(lab, series)
        if state["ActiveState"] == "active" and state["NRestarts"] != before["NRestarts"]:
            return state
        return None

    after = wait_for(restarted, RESTART_TIMEOUT_S, what="containerd to restart", interval_s=0.5)
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    assert after["MainPID"] != before["MainPID"]
    journal = ssh_check(
        lab, node, ["journalctl", "-u", "containerd", "--since", since, "--no-pager", "-o", "cat"]
    )
    expected = ("Sent signal SIGHUP", "Scheduled restart job", "Stopped", "Started")
    positions = [journal.find(line) for line in expected]
    assert all(p >= 0 for p in positions), journal
    assert positions == sorted(positions), journal
    record = lab.node_dirs(node).host_path(RUNNING_RECORD)
    wait_for(record.is_file, 10.0, what=f"{record} to be written", interval_s=0.2)
    assert "nvidia" in runtimes_of(tomllib.loads(record.read_text()))


@pytest.mark.lab
def test_nvidia_smi_reports_the_node_gpus(lab: Lab) -> None:
    node = lab.nodes[0]
    listing = ssh_check(lab, node, ["nvidia-smi", "-L"])
    pattern = re.compile(r"^GPU (\d+): (.+) \(UUID: (GPU-[0-9a-f-]{36})\)$")
    found = [pattern.match(line) for line in listing.splitlines()]
    assert all(found), listing
    assert [(int(m[1]), m[2], m[3]) for m in found if m] == [
        (g.index, g.product, g.uuid) for g in node.gpus
    ]
    csv = ssh_check(
        lab,
        node,
        [
            "nvidia-smi",
            "--query-gpu=name,uuid,driver_version,memory.total",
            "--format=csv,noheader",
        ],
    )
    first = csv.splitlines()[0].split(", ")
    assert first == [node.gpus[0].product, node.gpus[0].uuid, node.driver_version, "40960 MiB"]
    table = ssh_check(lab, node, ["nvidia-smi"])
    assert f"Driver Version: {node.driver_version}" in table
    gpus = json.loads(ssh_check(lab, node, ["cat", "/etc/rollout-lab/gpus.json"]))
    assert [g["uuid"] for g in gpus["gpus"]] == [g.uuid for g in node.gpus]
