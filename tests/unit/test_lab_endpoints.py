"""The lab's SSH endpoints: names, addresses, the nodes they stand for, the sshd configs
(at most 16 addresses per sshd, OpenSSH's limit) and lab.json's endpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.errors import BadInput, InputError
from rollout.lab.description import LabDescription
from rollout.lab.endpoints import LISTEN_PER_SSHD, UNIT, plan_endpoints, write_endpoint_sshds


def test_a_16_prefix_deals_250_addresses_per_24_over_the_nodes_in_turn() -> None:
    endpoints = plan_endpoints(1000, "127.20", ["lab-node-1", "lab-node-2"])
    assert [e.name for e in endpoints[:2]] == ["lab-ep-0001", "lab-ep-0002"]
    assert endpoints[-1].name == "lab-ep-1000"
    assert [e.address for e in endpoints[248:252]] == [
        "127.20.0.249",
        "127.20.0.250",
        "127.20.1.1",
        "127.20.1.2",
    ]
    assert endpoints[-1].address == "127.20.3.250"
    assert [e.node for e in endpoints[:3]] == ["lab-node-1", "lab-node-2", "lab-node-1"]
    assert len({e.address for e in endpoints}) == 1000


def test_a_24_prefix_holds_250() -> None:
    assert plan_endpoints(3, "127.0.85", ["n"])[2].address == "127.0.85.3"
    with pytest.raises(BadInput, match="holds 250 endpoints, not 251"):
        plan_endpoints(251, "127.0.85", ["n"])


@pytest.mark.parametrize("prefix", ["10.20", "127", "127.0.0.1", "127.x"])
def test_only_loopback_prefixes(prefix: str) -> None:
    with pytest.raises(BadInput, match="loopback octets"):
        plan_endpoints(1, prefix, ["n"])


def test_each_sshd_listens_on_at_most_16_addresses(tmp_path: Path) -> None:
    addresses = [f"127.20.0.{i}" for i in range(1, 41)]
    write_endpoint_sshds(tmp_path, addresses)
    configs = sorted((tmp_path / "etc/ssh").glob("rollout-lab-endpoints-*.conf"))
    listened = [
        [line.split()[1] for line in c.read_text().splitlines() if line.startswith("ListenAddress")]
        for c in configs
    ]
    assert [len(x) for x in listened] == [LISTEN_PER_SSHD, LISTEN_PER_SSHD, 8]
    assert sorted(a for x in listened for a in x) == sorted(addresses)
    wants = tmp_path / "etc/systemd/system/multi-user.target.wants"
    assert sorted(p.name for p in wants.iterdir()) == [UNIT.replace("@", f"@{g}") for g in range(3)]
    assert "PidFile /run/rollout-lab-endpoints-1.pid" in configs[1].read_text()


def test_lab_json_reads_endpoints_and_refuses_one_naming_no_node() -> None:
    node = {"name": "lab-node-1", "address": "127.0.84.1"}
    endpoint = {"name": "lab-ep-0001", "address": "127.20.0.1", "node": "lab-node-1"}
    lab = LabDescription.from_dict({"nodes": [node], "endpoints": [endpoint]})
    assert [(e.name, e.node) for e in lab.endpoints] == [("lab-ep-0001", "lab-node-1")]
    with pytest.raises(InputError, match="name a node"):
        LabDescription.from_dict({"nodes": [node], "endpoints": [{**endpoint, "node": "x"}]})
