"""Inventories in three formats: detection, Ansible semantics, errors with locations."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.errors import InputError, InputErrors
from rollout.inputs.fieldproblems import FieldProblem
from rollout.inventory import (
    Host,
    Inventory,
    InventoryFormat,
    detect_format,
    expand_host_pattern,
    load_inventory,
    parse_inventory,
)

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data" / "inventory"
EXAMPLES = {
    "example.yaml": InventoryFormat.ROLLOUT,
    "example.ini": InventoryFormat.ANSIBLE_INI,
    "example-ansible.yaml": InventoryFormat.ANSIBLE_YAML,
}


def connection(host: Host) -> tuple[object, ...]:
    return (host.name, host.address, host.port, host.user, host.key_file, host.become, host.groups)


def errors_of(text: str, fmt: InventoryFormat | None = None) -> str:
    with pytest.raises(InputErrors) as caught:
        parse_inventory(text, "inv", fmt)
    return str(caught.value)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_describe_the_same_four_nodes(name: str) -> None:
    inventory = load_inventory(ROOT / "inventory" / name)
    reference = load_inventory(ROOT / "inventory" / "example.yaml")
    assert inventory.format is EXAMPLES[name]
    assert inventory.names == ("gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4")
    assert [connection(h) for h in inventory.hosts] == [connection(h) for h in reference.hosts]
    node4 = inventory.by_name("gpu-node-4")
    assert node4 is not None and (node4.address, node4.port) == ("10.0.0.14", 2222)
    assert inventory.by_name("gpu-node-9") is None


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_format_is_detected_by_content(name: str) -> None:
    assert detect_format((ROOT / "inventory" / name).read_text()) is EXAMPLES[name]


def test_detection_of_plain_host_lists() -> None:
    assert detect_format("gpu1\ngpu2\n") is InventoryFormat.ANSIBLE_INI
    assert detect_format("[gpu]\ngpu1\n") is InventoryFormat.ANSIBLE_INI
    assert detect_format("gpu1:2222\n") is InventoryFormat.ANSIBLE_INI


def test_explicit_format_wins() -> None:
    text = "all:\n  hosts:\n    gpu1:\n"
    assert parse_inventory(text, "inv").names == ("gpu1",)
    # read as INI, `all:` is a host pattern YAML-minded users did not mean
    assert "all" not in parse_inventory(text, "inv", InventoryFormat.ANSIBLE_YAML).names


def test_rollout_defaults_and_overrides() -> None:
    inventory = load_inventory(DATA / "rollout-defaults.yaml")
    first, second = inventory.hosts
    assert connection(first) == (
        "gpu-a-1",
        "gpu-a-1",
        2022,
        "admin",
        "/keys/fleet",
        True,
        frozenset(),
    )
    assert first.known_hosts == "/keys/known_hosts"
    assert connection(second) == (
        "gpu-a-2",
        "192.0.2.2",
        22,
        "root",
        "/keys/other",
        False,
        frozenset({"canary"}),
    )
    assert second.known_hosts == "/keys/other_known_hosts"
    assert dict(second.vars) == {"rack": "r12", "weight": "3", "spare": "false"}
    assert second.location is not None and second.location.line == 6


def test_ini_precedence_ranges_and_ports() -> None:
    inventory = load_inventory(DATA / "precedence.ini")
    assert inventory.format is InventoryFormat.ANSIBLE_INI
    hosts = {h.name: h for h in inventory.hosts}
    assert sorted(hosts) == sorted(
        [
            "standalone.example.com",
            "gpu01.example.com",
            "gpu02.example.com",
            "gpu03.example.com",
            "h100-a",
            "h100-b",
            "h100-c",
            "h100-zulu",
        ]
    )
    standalone = hosts["standalone.example.com"]
    assert (standalone.user, standalone.port, standalone.become) == ("all-user", 2200, False)
    assert standalone.groups == frozenset({"ungrouped"})
    assert standalone.vars["site"] == "all"
    gpu01 = hosts["gpu01.example.com"]
    assert gpu01.user == "a100-user"  # child group over parent group
    assert gpu01.vars["site"] == "host"  # host vars over every group
    assert gpu01.groups == frozenset({"a100", "gpu", "h100"})
    assert hosts["gpu02.example.com"].vars["site"] == "zz"  # equal depth: later name wins
    assert hosts["gpu03.example.com"].vars["site"] == "gpu"
    h100 = hosts["h100-b"]
    assert (h100.address, h100.user, h100.become) == ("10.0.1.1", "gpu-user", True)
    zulu = hosts["h100-zulu"]
    assert (zulu.address, zulu.port, zulu.key_file) == ("h100-z", 2222, "/keys/my key")
    assert zulu.location is not None and zulu.location.line == 27


def test_ansible_yaml_nesting() -> None:
    inventory = load_inventory(DATA / "nested.yaml")
    hosts = {h.name: h for h in inventory.hosts}
    assert sorted(hosts) == ["extra-1", "gpu-node-3", "lonely", "node1", "node2"]
    assert (hosts["lonely"].user, hosts["lonely"].become) == ("all-user", False)
    assert (hosts["node1"].user, hosts["node1"].port, hosts["node1"].become) == (
        "gpu-user",
        2022,
        True,
    )
    assert hosts["node2"].groups == frozenset({"a100", "gpu"})
    assert (hosts["gpu-node-3"].user, hosts["gpu-node-3"].address) == ("host-user", "node3")
    assert hosts["extra-1"].address == "192.0.2.9"
    assert hosts["extra-1"].groups == frozenset({"gpu-extra"})


def test_select_groups() -> None:
    inventory = load_inventory(DATA / "precedence.ini")
    assert inventory.select(None) is inventory
    assert inventory.select(["all"]) is inventory
    assert inventory.select(["zz"]).names == ("gpu02.example.com",)
    assert set(inventory.select(["a100", "zz"]).names) == {
        "gpu01.example.com",
        "gpu02.example.com",
        "gpu03.example.com",
    }
    with pytest.raises(InputError) as caught:
        inventory.select(["h10"])
    assert "no group 'h10'" in str(caught.value)
    assert "did you mean 'h100'?" in str(caught.value)


@pytest.mark.parametrize(
    ("pattern", "expanded"),
    [
        ("gpu[01:03].x", ["gpu01.x", "gpu02.x", "gpu03.x"]),
        ("gpu[1:3]", ["gpu1", "gpu2", "gpu3"]),
        ("gpu[8:10]", ["gpu8", "gpu9", "gpu10"]),
        ("n[a:c]", ["na", "nb", "nc"]),
        ("n[1:5:2]", ["n1", "n3", "n5"]),
        ("r[1:2]-n[a:b]", ["r1-na", "r1-nb", "r2-na", "r2-nb"]),
        ("plain", ["plain"]),
        ("[:2]x", ["0x", "1x", "2x"]),
    ],
)
def test_expand_host_pattern(pattern: str, expanded: list[str]) -> None:
    assert expand_host_pattern(pattern) == expanded


@pytest.mark.parametrize(
    ("pattern", "fragment"),
    [
        ("n[3:1]", "runs backwards"),
        ("n[c:a]", "runs backwards"),
        ("n[1:]", "has no end"),
        ("n[1:3:0]", "positive integer"),
        ("n[a:3]", "numeric"),
        ("n[1:2:3:4]", "must be [start:end]"),
    ],
)
def test_expand_host_pattern_errors(pattern: str, fragment: str) -> None:
    with pytest.raises(FieldProblem) as caught:
        expand_host_pattern(pattern)
    assert fragment in str(caught.value)


INI_ERRORS = [
    ("[gpu]\nnode1 ansible_port=http\n", ["inv:2: ansible_port: node1: expected a port"]),
    ("[gpu]\nnode1 ansible_port=70000\n", ["inv:2: ansible_port"]),
    (
        "[gpu]\nnode1\n\n[gpu:vars]\nansible_become=maybe\n",
        ["inv:5: ansible_become", "use true"],
    ),
    (
        "[gpu:child]\na100\n",
        ["inv:1: bad section header '[gpu:child]'", "did you mean 'children'?"],
    ),
    ("[gpu\nnode1\n", ["inv:1: bad section header"]),
    ("[gpu:vars]\nnovalue\n", ["inv:2: gpu:vars: expected key=value"]),
    ("[gpu]\nnode1 stray\n", ["inv:2: node1: expected key=value"]),
    ("[gpu]\nnode[3:1]\n", ["inv:2: node[3:1]: range [3:1] runs backwards"]),
    ("[gpu]\nnode1 x='unclosed\n", ["inv:2: gpu: cannot split host line"]),
    ("[gpu]\nGPU1\n", ["inv:2: host: GPU1: node name", "rollout_node_name"]),
    (
        "a rollout_node_name=n1\nb rollout_node_name=n1\n",
        ["inv:2: rollout_node_name: hosts 'a' and 'b' both map to node 'n1'"],
    ),
    ("[a:children]\nb\n[b:children]\na\n", ["group children form a cycle"]),
]
ANSIBLE_YAML_ERRORS = [
    ("all:\n  host:\n    a:\n", ["inv:2:3: all: unknown key 'host'", "did you mean 'hosts'?"]),
    ("all:\n  hosts: [a, b]\n", ["inv:2:10: all.hosts: expected a mapping", "on its own line"]),
    ("all:\n  hosts:\n    a: 3\n", ["inv:3:8: all.hosts.a: expected the host's variables"]),
    ("all: [a]\n", ["inv:1:6: all: expected a group"]),
    (
        "all:\n  hosts:\n    a:\n      ansible_port: 0\n",
        ['inv:4:21: ansible_port: a: expected a port from 1 to 65535, found "0"'],
    ),
    ("all:\n  hosts:\n    a:\n    a:\n", ["inv:4:5: all.hosts: duplicate key 'a'"]),
]
ROLLOUT_ERRORS = [
    (
        "apiVersion: rollout/v1\nkind: Inventory\nnodes:\n  - name: a\n  - name: a\n",
        ["inv:5:11: nodes[1].name: node 'a' is listed twice (first at line 4)"],
    ),
    (
        "apiVersion: rollout/v1\nkind: Inventory\nnodes:\n  - name: a\n    adress: x\n",
        ["inv:5:5: nodes[0]: unknown key 'adress'", "did you mean 'address'?"],
    ),
    ("apiVersion: rollout/v1\nkind: Inventory\n", ["inv:1:1: nodes: required key 'nodes'"]),
    (
        "apiVersion: rollout/v1\nkind: Inventory\ndefaults: {port: 0}\nnodes: [{name: a}]\n",
        ["inv:3:18: defaults.port: expected a number >= 1, found 0"],
    ),
    (
        "apiVersion: rollout/v1\nkind: Inventory\nnodes: [{name: A_1, become: 'yes'}]\n",
        ["inv:3:16: nodes[0].name: expected a Kubernetes name", "nodes[0].become"],
    ),
    (
        "apiVersion: rollout/v1\nkind: Inventory\nnodes: []\n",
        ["inv:3:1: nodes: expected at least 1"],
    ),
]
ERROR_CASES = [
    *((InventoryFormat.ANSIBLE_INI, text, fragments) for text, fragments in INI_ERRORS),
    *((InventoryFormat.ANSIBLE_YAML, text, fragments) for text, fragments in ANSIBLE_YAML_ERRORS),
    # rollout's own format is detected, not named
    *((None, text, fragments) for text, fragments in ROLLOUT_ERRORS),
]


@pytest.mark.parametrize(("fmt", "text", "fragments"), ERROR_CASES)
def test_errors_say_where_and_what(
    fmt: InventoryFormat | None, text: str, fragments: list[str]
) -> None:
    found = errors_of(text, fmt)
    for fragment in fragments:
        assert fragment in found, found


def test_ini_reports_every_problem() -> None:
    found = errors_of("[gpu]\nn1 ansible_port=x\nn2 ansible_port=y\n[bad:section]\n")
    assert [line.split(":")[1] for line in found.splitlines() if line.startswith("inv:")] == [
        "2",
        "3",
        "4",
    ]


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(InputErrors, match="file not found"):
        load_inventory(tmp_path / "missing.ini")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(InputErrors, match="the file is empty"):
        load_inventory(empty, InventoryFormat.ROLLOUT)
    with pytest.raises(InputErrors, match="the inventory has no hosts"):
        load_inventory(empty)  # an inventory without hosts is a mistake, not a no-op


def test_inventory_is_immutable() -> None:
    inventory = Inventory(hosts=(Host(name="a", address="a"),), source="x")
    with pytest.raises(AttributeError):
        inventory.hosts = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        inventory.hosts[0].vars["k"] = "v"  # type: ignore[index]
    assert hash(inventory.hosts[0]) == hash(Host(name="a", address="a"))


@pytest.mark.parametrize(
    ("line", "hosts", "port"),
    [
        ("gpu-[01:03]:2222", ["gpu-01", "gpu-02", "gpu-03"], 2222),
        ("gpu-[a:b].example.com:2200", ["gpu-a.example.com", "gpu-b.example.com"], 2200),
        ("gpu-[01:02]", ["gpu-01", "gpu-02"], 22),
    ],
)
def test_an_ini_range_takes_a_port_after_it(line: str, hosts: list[str], port: int) -> None:
    inventory = parse_inventory(f"[gpu]\n{line}\n", "inv", InventoryFormat.ANSIBLE_INI)
    assert sorted(h.name for h in inventory.hosts) == hosts
    assert {h.port for h in inventory.hosts} == {port}
