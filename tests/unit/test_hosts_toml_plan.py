"""`rollout plan --facts` of a registry change over a hosts.toml the node already has."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from tests.examples import FACTS

HOSTS = "etc/containerd/certs.d/docker.io/hosts.toml"
# what an operator wrote by hand: Docker Hub's real endpoint, a one-line array
NODE_HOSTS = """server = "https://registry-1.docker.io"

[host."https://mirror.registry.internal:5000"]
  capabilities = ["pull", "resolve"]
"""
PLAN = """apiVersion: rollout/v1
kind: Plan
metadata:
  name: registry-mirror
targets:
  selector: nvidia.com/gpu.present=true
changes:
  - registry:
      host: docker.io
      endpoints:
{endpoints}
"""
MIRROR = "        - url: https://mirror.registry.internal:5000\n"


def node_with_hosts_toml(tmp_path: Path) -> Path:
    """gpu-b-1 (containerd 2.1) whose config_path is set and whose hosts.toml lists the mirror."""
    facts = tmp_path / "facts"
    shutil.copytree(FACTS / "gpu-b-1", facts / "gpu-b-1")
    files = facts / "gpu-b-1" / "files"
    config = files / "etc/containerd/config.toml"
    config.write_text(
        config.read_text()
        + '\n[plugins."io.containerd.cri.v1.images".registry]\n'
        + '  config_path = "/etc/containerd/certs.d"\n'
    )
    (files / HOSTS).parent.mkdir(parents=True)
    (files / HOSTS).write_text(NODE_HOSTS)
    return facts


def plan_json(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, facts: Path, endpoints: str
) -> dict[str, Any]:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN.format(endpoints=endpoints))
    assert main(["plan", str(plan), "--facts", str(facts), "--output", "json"]) == 0
    node: dict[str, Any] = json.loads(capsys.readouterr().out)["waves"][0]["nodes"][0]
    return node


def test_an_already_correct_hosts_toml_is_a_no_op_that_says_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    node = plan_json(capsys, tmp_path, node_with_hosts_toml(tmp_path), MIRROR)
    assert node["files"] == []
    write = next(s for s in node["steps"] if s["kind"] == "containerd.write")
    assert write["action"] is None
    assert write["noop_reason"] == (
        "the effective containerd config already holds the intent; "
        f"/{HOSTS} already lists the plan's mirrors for docker.io; "
        "its server is the node's: the plan sets none"
    )


def test_a_new_mirror_keeps_the_nodes_server_and_formatting(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    endpoints = MIRROR + "        - url: https://second.registry.internal\n"
    node = plan_json(capsys, tmp_path, node_with_hosts_toml(tmp_path), endpoints)
    [change] = node["files"]
    assert change["path"] == f"/{HOSTS}"
    assert change["after"] == NODE_HOSTS + (
        '\n[host."https://second.registry.internal"]\ncapabilities = ["pull", "resolve"]\n'
    )
