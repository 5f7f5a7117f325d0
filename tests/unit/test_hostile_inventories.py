"""Hostile inventories: range and host-count bombs, alias bombs, no hosts, addresses and users
that are not what SSH expects, bytes and file kinds. Every case: exit 2 (1 with
--detailed-exitcode), a located message, no traceback, nothing written, fast (tests/hostile.py).
"""

from __future__ import annotations

import functools

import pytest

from rollout.inventory import MAX_HOSTS, InventoryFormat, expand_host_pattern, parse_inventory
from rollout.inventory.model import check_address, check_user
from tests.hostile import GOOD_PLAN, HostileCase, hostile_test, make_fifo, make_symlink


def inventory_case(
    inventory: str, id: str, text: str | bytes, where: str, *says: str, **more: object
) -> HostileCase:
    """`rollout plan plan.yaml -i <inventory>` with `text` as the inventory file."""
    return HostileCase(
        id,
        argv=("plan", "plan.yaml", "-i", inventory),
        files={"plan.yaml": GOOD_PLAN, inventory: text},
        where=where,
        says=says,
        **more,  # type: ignore[arg-type]
    )


# An INI (or any undetected) inventory, and a YAML one.
ini_case = functools.partial(inventory_case, "inv.ini")
yaml_case = functools.partial(inventory_case, "inv.yaml")


def native(*nodes: str, defaults: str = "") -> str:
    """A rollout inventory; each node is the text after `- ` (one line, flow style)."""
    head = "apiVersion: rollout/v1\nkind: Inventory\n"
    if defaults:
        head += f"defaults: {defaults}\n"
    return head + "nodes:\n" + "".join(f"  - {node}\n" for node in nodes)


def laughs(levels: int) -> str:
    lines = ['v0: &v0 "lol"'] + [
        f"v{i}: &v{i} [{', '.join([f'*v{i - 1}'] * 10)}]" for i in range(1, levels)
    ]
    return "\n".join("        " + line for line in lines) + "\n"


def wide_mapping(anchor: str, alias: str) -> str:
    """`anchor: &anchor {k0: *alias, ..., k9: *alias}`: ten times the one before."""
    items = ", ".join(f"k{j}: *{alias}" for j in range(10))
    return f"{anchor}: &{anchor} {{{items}}}\n"


RANGES = [
    ini_case("range-hundred-million", "[gpu]\ngpu[0:99999999]\n", "inv.ini:2", "10000"),
    ini_case("range-of-ten-digits", "gpu[0:9999999999]\n", "inv.ini:1", "digits"),
    ini_case("range-of-5000-digits", "gpu[0:" + "9" * 5000 + "]\n", "inv.ini:1", "digits"),
    ini_case("range-10001", "gpu[1:10001]\n", "inv.ini:1", "the limit is 10000"),
    ini_case(
        "ranges-multiply", "n[0:999]x[0:999]\n", "inv.ini:1", "more than 10000 hosts", max_s=1.0
    ),
    ini_case("ranges-times-letters", "n[0:9999]-[a:Z]\n", "inv.ini:1", "more than"),
    ini_case(
        "many-ranges-each-small",
        "".join(f"g{i}-[0000:4999]\n" for i in range(3)),
        "inv.ini:3",
        "over 10000 hosts",
        problems=1,
    ),
    ini_case(
        "eleven-thousand-lines",
        "".join(f"gpu{i}\n" for i in range(11_000)),
        "inv.ini:10001",
        "more than 10000 hosts",
        max_s=4.0,
    ),
    ini_case("range-backwards", "gpu[9:1]\n", "inv.ini:1", "backwards"),
    ini_case("range-step-zero", "gpu[1:9:0]\n", "inv.ini:1", "step"),
    ini_case("range-superscript-digit", "gpu[1:\u00b2]\n", "inv.ini:1", "numeric"),
    ini_case("range-unicode-letters", "gpu[\u00e9:\u00ff]\n", "inv.ini:1"),
    ini_case("range-four-parts", "gpu[1:2:3:4]\n", "inv.ini:1", "[start:end]"),
    ini_case("range-without-end", "gpu[1:]\n", "inv.ini:1", "no end"),
    yaml_case(
        "yaml-range-hundred-million",
        "all:\n  hosts:\n    gpu[0:99999999]:\n",
        "inv.yaml:3",
        "10000",
    ),
    yaml_case(
        "native-over-max-hosts",
        native(*[f"{{name: n{i}}}" for i in range(MAX_HOSTS + 1)]),
        "inv.yaml:3",
        "at most 10000",
        max_s=6.0,
    ),
]

BOMBS = [
    yaml_case(
        "ansible-yaml-billion-laughs",
        "all:\n  hosts:\n    gpu1:\n  vars:\n" + laughs(10),
        "inv.yaml:",
        "more than 100000 values",
    ),
    yaml_case(
        "ansible-yaml-laughs-as-hosts",
        "x: &y0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9, j: 10}\n"
        + "".join(wide_mapping(f"y{i}", f"y{i - 1}") for i in range(1, 7))
        + "all: {hosts: *y6}\n",
        "inv.yaml:",
        "more than 100000 values",
    ),
    yaml_case(
        "native-laughs-in-vars",
        native("{name: gpu1, vars: *v9}").replace("nodes:\n", "x:\n" + laughs(10) + "nodes:\n"),
        "inv.yaml:",
        "values",
    ),
    yaml_case("ansible-yaml-deep", "all: " + "[" * 5000 + "]" * 5000 + "\n", "inv.yaml:1", "depth"),
    yaml_case(
        "ansible-children-deep",
        "all:\n"
        + "".join(f"{'  ' * (2 * i + 1)}children:\n{'  ' * (2 * i + 2)}g{i}:\n" for i in range(60)),
        "inv.yaml:",
        "levels deep",
    ),
    yaml_case("recursive-alias", "all: &a {children: {x: *a}}\n", "inv.yaml:1", "recursive"),
    ini_case(
        "ini-children-chain-3000",
        "".join(f"[g{i}:children]\ng{i + 1}\n" for i in range(3000))
        + "[g3000]\ngpu1 ansible_host=gpu1 rollout_node_name=gpu1\n[g3000:children]\ng0\n",
        "inv.ini",
        "cycle",
    ),
    ini_case(
        "ini-children-cycle",
        "[a:children]\nb\n[b:children]\na\n[a]\ngpu1\n",
        "inv.ini",
        "a -> b -> a",
    ),
]

NO_HOSTS = [
    ini_case("empty-file", "", "inv.ini", "no hosts"),
    ini_case("only-comments", "# nothing\n; here\n", "inv.ini", "no hosts"),
    ini_case(
        "only-groups", "[gpu]\n[cpu]\n[gpu:vars]\nansible_user=ubuntu\n", "inv.ini", "no hosts"
    ),
    yaml_case("ansible-yaml-empty-all", "all:\n  hosts: {}\n", "inv.yaml", "no hosts"),
    yaml_case("ansible-yaml-only-vars", "all:\n  vars:\n    a: 1\n", "inv.yaml", "no hosts"),
    yaml_case(
        "native-no-nodes", native().replace("nodes:\n", "nodes: []\n"), "inv.yaml:3", "at least 1"
    ),
    yaml_case("yaml-top-level-list", "- gpu1\n- gpu2\n", "inv.yaml:1", "key=value"),
]

ADDRESSES = [
    *(
        ini_case(f"address-{name}", f"gpu1 ansible_host={value}\n", "inv.ini:1", says)
        for name, value, says in (
            ("with-space", "'10.0.0.1 -oProxyCommand=x'", "host name or an IP"),
            ("with-semicolon", "gpu1;reboot", "host name or an IP"),
            ("starting-with-dash", "-oProxyCommand=touch", "host name"),
            ("with-backtick", "`id`", "host name"),
            ("dollar", "$(id)", "host name"),
            ("bad-ipv4", "300.1.1.1", "0 to 255"),
            ("bracketed-ipv6", "[fe80::1]", "without brackets"),
            ("url", "ssh://gpu1", "host name"),
            ("user-at-host", "root@gpu1", "host name"),
        )
    ),
    ini_case(
        "address-from-group-vars",
        "[gpu]\ngpu1\n[gpu:vars]\nansible_host=a|b\n",
        "inv.ini:4",
        "host name",
    ),
    ini_case(
        "old-spelling-ssh-host", "gpu1 ansible_ssh_host='a b'\n", "inv.ini:1", "ansible_ssh_host"
    ),
    ini_case(
        "host-name-is-the-address", "gpu1;id rollout_node_name=gpu1\n", "inv.ini:1", "host name"
    ),
    ini_case(
        "two-bad-hosts",
        "gpu1 ansible_host='a b'\ngpu2 ansible_host='c;d'\n",
        "inv.ini:1",
        problems=2,
    ),
    ini_case("user-with-space", "gpu1 ansible_user='root -oX'\n", "inv.ini:1", "user name"),
    ini_case("user-with-semicolon", "gpu1 ansible_user=a;b\n", "inv.ini:1", "user name"),
    ini_case("port-superscript", "gpu1 ansible_port=\u00b2\n", "inv.ini:1", "port"),
    ini_case("port-zero", "gpu1:0\n", "inv.ini:1", "port"),
    yaml_case(
        "yaml-address-newline",
        'all:\n  hosts:\n    gpu1:\n      ansible_host: "gpu1\\nProxyCommand x"\n',
        "inv.yaml:4",
        "host name",
    ),
    yaml_case(
        "yaml-address-list",
        "all:\n  hosts:\n    gpu1:\n      ansible_host: [a, b]\n",
        "inv.yaml:4",
        "host name",
    ),
    yaml_case(
        "yaml-key-file-newline",
        'all:\n  hosts:\n    gpu1:\n      ansible_ssh_private_key_file: "a\\nb"\n',
        "inv.yaml:4",
        "control characters",
    ),
    *(
        yaml_case(f"native-{name}", native(node), "inv.yaml:4", says)
        for name, node, says in (
            ("address-space", "{name: gpu1, address: 'a b'}", "host name"),
            ("address-semicolon", "{name: gpu1, address: 'gpu1;id'}", "host name"),
            ("address-newline", '{name: gpu1, address: "a\\nb"}', "host name"),
            ("user-dash", "{name: gpu1, user: -oProxyCommand}", "user name"),
            ("known-hosts-control", '{name: gpu1, known_hosts: "k\\x1bh"}', "control characters"),
        )
    ),
    yaml_case(
        "native-default-user-space",
        native("{name: gpu1}", defaults="{user: 'a b'}"),
        "inv.yaml:3",
        "user name",
    ),
]

BYTES_AND_FILES = [
    ini_case("ini-nul-byte", "gpu1\ngpu\x002\n", "inv.ini:2:4", "NUL"),
    ini_case("ini-escape", "gpu1 ansible_host=\x1b[2J\n", "inv.ini:1", "U+001B"),
    ini_case("ini-latin-1", b"gpu1 # caf\xe9\n", "inv.ini", "UTF-8"),
    ini_case("ini-two-mib", "# " + "x" * (2 * 1024 * 1024) + "\n", "inv.ini", "limit"),
    HostileCase(
        "inventory-fifo",
        argv=("plan", "plan.yaml", "-i", "inv.ini"),
        files={"plan.yaml": GOOD_PLAN},
        setup=make_fifo("inv.ini"),
        where="inv.ini",
        says=("FIFO",),
    ),
    HostileCase(
        "inventory-dev-zero",
        argv=("plan", "plan.yaml", "-i", "inv.ini"),
        files={"plan.yaml": GOOD_PLAN},
        setup=make_symlink("inv.ini", "/dev/zero"),
        where="inv.ini",
        says=("character device",),
    ),
    HostileCase(
        "inventory-directory",
        argv=("plan", "plan.yaml", "-i", "."),
        files={"plan.yaml": GOOD_PLAN},
        where=".",
        says=("directory",),
    ),
    HostileCase(
        "inventory-missing",
        argv=("apply", "plan.yaml", "-i", "nowhere.ini", "--yes"),
        files={"plan.yaml": GOOD_PLAN},
        where="nowhere.ini",
        says=("not found",),
    ),
    HostileCase(
        "apply-with-alias-bomb-inventory",
        argv=("apply", "plan.yaml", "-i", "inv.yaml", "--yes"),
        files={
            "plan.yaml": GOOD_PLAN,
            "inv.yaml": "all:\n  hosts:\n    gpu1:\n  vars:\n" + laughs(10),
        },
        where="inv.yaml:",
        says=("more than 100000 values",),
    ),
]

CASES = [*RANGES, *BOMBS, *NO_HOSTS, *ADDRESSES, *BYTES_AND_FILES]


test_hostile_inventory = hostile_test(CASES)


@pytest.mark.parametrize(
    "good", ["gpu1", "gpu-1.lab.example", "10.0.0.1", "fe80::1", "node_7", "gpu1.", "127.0.1.3"]
)
def test_good_addresses_pass(good: str) -> None:
    assert check_address(good) == good


@pytest.mark.parametrize("good", ["root", "ubuntu", "_svc", "ci-bot", "a.b"])
def test_good_users_pass(good: str) -> None:
    assert check_user(good) == good


def test_a_range_at_the_limit_is_expanded() -> None:
    names = expand_host_pattern(f"gpu[1:{MAX_HOSTS}]")
    assert len(names) == MAX_HOSTS
    assert names[0] == "gpu1"


def test_ini_at_the_host_limit_is_read() -> None:
    text = f"gpu[1:{MAX_HOSTS}]\n"
    assert len(parse_inventory(text, "inv.ini", InventoryFormat.ANSIBLE_INI).hosts) == MAX_HOSTS
