"""A registry change whose config_path lies outside /etc/containerd, on a lab of its own (one
node): the node already has that hosts.toml, so the live plan shows the node's file as its
`before` (it was planned as a new file, and apply's drift check then refused the node's own),
and `rollout apply` writes the merged file and containerd loads the config_path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from tests.lab.labapi import apply_args, fleet_args
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

CERTS = "/etc/docker/certs.d"
HOSTS = f"{CERTS}/docker.io/hosts.toml"
NODE_HOSTS = 'server = "https://registry-1.docker.io"\n'
MIRROR = "https://mirror.registry.internal:5000"
PLAN = f"""apiVersion: rollout/v1
kind: Plan
metadata: {{name: mirror-outside}}
targets: {{selector: nvidia.com/gpu.present=true}}
changes:
  - registry:
      host: docker.io
      config_path: {CERTS}
      allow_paths_outside: true
      endpoints: [{{url: "{MIRROR}"}}]
policy:
  waves: [1]
  max_unavailable: 1
  on_failure: rollback
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("hosts-outside") / "lab", ("1.7",), 1) as built:
        yield built


def test_an_existing_hosts_toml_outside_is_planned_from_and_applied(
    lab: Lab, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (node,) = lab.nodes
    write = ["sh", "-c", f'mkdir -p {CERTS}/docker.io && printf %s "$1" > {HOSTS}', "sh"]
    ssh_check(lab, node, [*write, NODE_HOSTS])
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    capsys.readouterr()
    assert main(["plan", str(plan), *fleet_args(lab), "--output", "json"]) == 0
    planned = json.loads(capsys.readouterr().out)["waves"][0]["nodes"][0]
    (change,) = [f for f in planned["files"] if f["path"] == HOSTS]
    assert change["before"] == NODE_HOSTS
    assert change["after"].startswith(NODE_HOSTS) and f'[host."{MIRROR}"]' in change["after"]
    assert main(apply_args(lab, plan, tmp_path / "state")) == 0, capsys.readouterr()
    assert ssh_check(lab, node, ["cat", HOSTS]) == change["after"]
    dump = ssh_check(lab, node, ["containerd", "config", "dump"])
    assert f'config_path = "{CERTS}"' in dump
