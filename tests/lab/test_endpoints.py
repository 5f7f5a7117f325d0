"""`rollout lab up --endpoints N` and `plan -i` over them: a lab of its own, one node and
20 SSH endpoints it serves.

Every endpoint answers over its own address with its own host key entry and is planned
from its own Node object and the node's real files; one endpoint made unreachable (its
address a listener that never speaks SSH, so the connection times out) fails the
gathering only once every other endpoint has answered, named with the others that failed
in one message at the end, and exit 1. Off a terminal the progress is one final line.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from rollout.lab.cluster import Lab, LabOptions, bring_up_lab, tear_down_lab
from tests.examples import REPO
from tests.lab.labapi import fleet_args
from tests.lab.test_cluster_shared import OWN_ADDRESS_PREFIX, require_lab_prerequisites

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

ENDPOINTS = 20
ENDPOINT_PREFIX = os.environ.get("ROLLOUT_TEST_ENDPOINT_PREFIX", "127.0.46")
# an address of the endpoint /24 past the endpoints, for the silent listener
SILENT_ADDRESS = f"{ENDPOINT_PREFIX}.240"
UNREACHABLE = "lab-ep-0007"


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    require_lab_prerequisites()
    lab_dir = tmp_path_factory.mktemp("endpoints") / "lab"
    options = LabOptions(
        lab_dir=lab_dir,
        nodes=1,
        containerd=("1.7",),
        gpus=2,
        address_prefix=OWN_ADDRESS_PREFIX,
        api_port=0,
        endpoints=ENDPOINTS,
        endpoint_prefix=ENDPOINT_PREFIX,
    )
    built = bring_up_lab(options, progress=quiet)
    try:
        yield built
    finally:
        tear_down_lab(lab_dir, progress=quiet)


def plan(lab: Lab, inventory: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = fleet_args(lab)
    if inventory is not None:
        args[1] = str(inventory)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "rollout",
            "plan",
            str(REPO / "examples" / "lab-plan.yaml"),
            *args,
            "-o",
            "json",
            "--parallel",
            "8",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_every_endpoint_is_its_own_node_in_the_inventory_known_hosts_and_api(lab: Lab) -> None:
    inventory = yaml.safe_load(lab.inventory.read_text())
    names = [n["name"] for n in inventory["nodes"]]
    assert names == ["lab-node-1", *(f"lab-ep-{i:04d}" for i in range(1, ENDPOINTS + 1))]
    known = {
        line.split()[0]: line.split()[2] for line in lab.ssh.known_hosts.read_text().splitlines()
    }
    node_key = known[lab.nodes[0].address]
    assert {known[e.address] for e in lab.endpoints} == {node_key}
    with urllib.request.urlopen(f"{lab.api_url}/api/v1/nodes", timeout=60) as response:
        items = json.load(response)["items"]
    api_nodes = {n["metadata"]["name"]: n for n in items}
    assert set(api_nodes) == set(names)
    endpoint = api_nodes["lab-ep-0003"]
    assert endpoint["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"
    assert {"type": "InternalIP", "address": f"{ENDPOINT_PREFIX}.3"} in endpoint["status"][
        "addresses"
    ]


def test_plan_over_the_endpoints_plans_every_one_with_one_final_progress_line(lab: Lab) -> None:
    result = plan(lab)
    assert result.returncode == 0, result.stderr
    planned = {n["name"] for w in json.loads(result.stdout)["waves"] for n in w["nodes"]}
    assert planned == {"lab-node-1", *(e.name for e in lab.endpoints)}
    progress = [line for line in result.stderr.splitlines() if line.startswith("facts:")]
    assert len(progress) == 1
    assert progress[0].startswith(f"facts: {ENDPOINTS + 1}/{ENDPOINTS + 1} answered, 0 failed in ")
    assert "\r" not in result.stderr


def test_an_unreachable_endpoint_is_reported_at_the_end_with_the_others_answered(
    lab: Lab, tmp_path: Path
) -> None:
    inventory = yaml.safe_load(lab.inventory.read_text())
    for node in inventory["nodes"]:
        if node["name"] == UNREACHABLE:
            node["address"] = SILENT_ADDRESS
    edited = tmp_path / "inventory.yaml"
    edited.write_text(yaml.safe_dump(inventory, sort_keys=False))
    with socket.socket() as silent:  # accepts TCP, never sends an SSH banner
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        silent.bind((SILENT_ADDRESS, 22))
        silent.listen(16)
        result = plan(lab, edited)
    assert result.returncode == 1, result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("facts:")]
    assert len(progress) == 1
    assert progress[0].startswith(f"facts: {ENDPOINTS}/{ENDPOINTS + 1} answered, 1 failed in ")
    error = result.stderr[result.stderr.index("error:") :]
    assert error.startswith(f"error: could not gather facts from 1 of {ENDPOINTS + 1} node(s):")
    assert f"{UNREACHABLE}: node {UNREACHABLE} (root@{SILENT_ADDRESS}:22)" in error
    assert result.stdout == ""
