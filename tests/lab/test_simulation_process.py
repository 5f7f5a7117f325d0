"""The control plane as `rollout lab up` starts it: a process reading lab.json."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from kubernetes import client

from rollout.lab.description import LabDescription
from rollout.lab.simulation.probe import RUNNING_CONFIG_PATH, RunningConfigProbe
from tests.lab.labapi import wait_for

RUNNING_1X = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
"""
REGISTRY_ONLY_1X = """version = 2
[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = "/etc/containerd/certs.d"
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def write_lab(lab_dir: Path, port: int) -> None:
    nodes = []
    for i, name in enumerate(("lab-node-1", "lab-node-2")):
        root = lab_dir / name
        (root / RUNNING_CONFIG_PATH).parent.mkdir(parents=True)
        nodes.append(
            {
                "name": name,
                "address": f"127.0.1.{i + 1}",
                "containerd": "1.7",
                "driver_version": "535.183.01",
                "root": str(root),
                "gpus": [
                    {
                        "index": 0,
                        "product": "NVIDIA A100-SXM4-40GB",
                        "uuid": f"GPU-838f60d9-651f-9166-ea42-f9da674a694{i}",
                        "memory_mib": 40960,
                    }
                ],
            }
        )
    (lab_dir / "lab.json").write_text(
        json.dumps(
            {
                "api": {"host": "127.0.0.1", "port": port},
                "device_plugin_grace_s": 1,
                "nodes": nodes,
                "simulation": {"tick_s": 0.05, "pod_start_s": 0.05},
            }
        )
    )
    (lab_dir / "lab-node-1" / RUNNING_CONFIG_PATH).write_text(RUNNING_1X)


def test_file_probe_reads_the_running_config(tmp_path: Path) -> None:
    write_lab(tmp_path, 0)
    probe = RunningConfigProbe.from_lab(LabDescription.from_file(tmp_path / "lab.json"))
    assert probe.has_handler("lab-node-1", "nvidia")
    assert not probe.has_handler("lab-node-2", "nvidia")  # containerd not running
    (tmp_path / "lab-node-2" / RUNNING_CONFIG_PATH).write_text(REGISTRY_ONLY_1X)
    assert not probe.has_handler("lab-node-2", "nvidia")  # the incident: handler lost
    assert not probe.has_handler("unknown", "nvidia")


def test_a_dead_nodes_stale_record_is_cleared(tmp_path: Path) -> None:
    """No nspawn runs these nodes: they are down, and a record left behind is removed."""
    write_lab(tmp_path, 0)
    probe = RunningConfigProbe.from_lab(LabDescription.from_file(tmp_path / "lab.json"))
    record = tmp_path / "lab-node-1" / RUNNING_CONFIG_PATH
    assert record.is_file()
    state = probe.state("lab-node-1")
    assert (state.alive, state.containerd_active) == (False, False)
    assert not record.exists()
    (tmp_path / "nspawn.pid").write_text(f"{os.getpid()}\n")  # alive, but not an nspawn
    assert not probe.state("lab-node-1").alive


def test_control_plane_process_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    write_lab(tmp_path, port)
    process = subprocess.Popen(
        [sys.executable, "-m", "rollout.lab.controlplane", "--lab-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        def health() -> str:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    return str(r.read().decode())
            except OSError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                return ""

        assert wait_for(health, 20, what="the control plane's /healthz", interval_s=0.05) == "ok"
        assert (tmp_path / "controlplane.pid").read_text().strip() == str(process.pid)
        with client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{port}")) as api_client:
            core = client.CoreV1Api(api_client)
            # No nspawn runs these nodes: the kubelets post nothing, the nodes are Unknown.
            unknown = {"lab-node-1": ["Unknown"], "lab-node-2": ["Unknown"]}

            def readiness() -> dict[str, list[str]]:
                return {
                    n.metadata.name: [c.status for c in n.status.conditions if c.type == "Ready"]
                    for n in core.list_node().items
                }

            wait_for(lambda: readiness() == unknown, 5, what="both nodes Unknown", interval_s=0.05)
            assert all(
                "nvidia.com/gpu" not in (n.status.allocatable or {}) for n in core.list_node().items
            )
        assert not (tmp_path / "lab-node-1" / RUNNING_CONFIG_PATH).exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not (tmp_path / "controlplane.pid").exists()
    assert "serving http://127.0.0.1:" in (tmp_path / "controlplane.log").read_text()
    with socket.socket() as probe:  # nothing listens there any more
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))


def test_bad_lab_description_exits_with_bad_input(tmp_path: Path) -> None:
    (tmp_path / "lab.json").write_text('{"nodes": [{"name": ""}]}')
    done = subprocess.run(
        [sys.executable, "-m", "rollout.lab.controlplane", "--lab-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "nodes[0].name" in done.stderr
