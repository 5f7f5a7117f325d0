"""Hostile recorded facts (`rollout plan --facts DIR`): bytes, types, names, file kinds and
containerd configs that cannot load. Every case: exit 2 (1 with --detailed-exitcode), one
message per problem naming the facts file (with its line where it has lines) and the node,
no traceback, nothing written (see tests/hostile.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollout.containerd import ImportMissing, UnsupportedVersion
from rollout.errors import BadInput
from tests.hostile import (
    GOOD_PLAN,
    REPO,
    HostileCase,
    hostile_test,
    make_fifo,
    make_symlink,
    run_case,
)

ARGV = ("plan", "plan.yaml", "--facts", "facts")
V17 = "containerd github.com/containerd/containerd 1.7.24~ds1 1.7.24~ds1-6+deb13u1"
V21 = "containerd github.com/containerd/containerd/v2 2.1.9+unknown"
NODE_YAML = """\
name: {name}
containerd_version: {version}
labels:
  nvidia.com/gpu.present: 'true'
unschedulable: false
ready: true
gpus:
  count: 4
  product: NVIDIA A100-SXM4-40GB
"""
CONFIG = "/etc/containerd/config.toml"
TOOLKIT = "/etc/containerd/conf.d/99-nvidia.toml"


def example_files(node: str) -> dict[str, str]:
    """The recorded /etc/containerd of one example node, as node path -> text."""
    root = REPO / "examples" / "facts" / node / "files"
    return {
        "/" + p.relative_to(root).as_posix(): p.read_text()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


FILES = {"n1": example_files("gpu-a-2"), "n2": example_files("gpu-b-1")}
VERSIONS = {"n1": V17, "n2": V21}


def fleet(
    node_yaml: dict[str, str | bytes] | None = None,
    files: dict[str, dict[str, str | bytes]] | None = None,
    extra: dict[str, str | bytes] | None = None,
) -> dict[str, str | bytes]:
    """The work directory: plan.yaml and facts/ with nodes n1 (1.7) and n2 (2.1), changed."""
    out: dict[str, str | bytes] = {"plan.yaml": GOOD_PLAN}
    for node in ("n1", "n2"):
        out[f"facts/{node}/node.yaml"] = NODE_YAML.format(name=node, version=VERSIONS[node])
        for path, text in FILES[node].items():
            out[f"facts/{node}/files{path}"] = text
    for node, text in (node_yaml or {}).items():
        out[f"facts/{node}/node.yaml"] = text
    for node, changed in (files or {}).items():
        for path, text in changed.items():
            out[f"facts/{node}/files{path}"] = text
    out.update(extra or {})
    return out


def node_yaml(old: str, new: str, node: str = "n1") -> dict[str, str | bytes]:
    """n1's node.yaml with one piece replaced (asserting it is there)."""
    text = NODE_YAML.format(name=node, version=VERSIONS[node])
    assert old in text
    return {node: text.replace(old, new)}


def case(
    id: str,
    files: dict[str, str | bytes],
    where: str,
    *says: str,
    setup: object = None,
    problems: int | None = 1,
) -> HostileCase:
    """A `rollout plan plan.yaml --facts facts` case; `says` always includes the node."""
    return HostileCase(
        id,
        argv=ARGV,
        files=files,
        setup=setup,  # type: ignore[arg-type]
        where=where,
        says=says,
        problems=problems,
        max_s=5.0,
    )


N1 = "facts/n1/node.yaml"
N1_CONFIG = f"facts/n1/files{CONFIG}"

BYTES = [
    case(
        "node-yaml-not-utf8",
        fleet({"n1": b"name: n1\nlabels: {a: caf\xe9}\n"}),
        N1,
        "node n1",
        "UTF-8",
    ),
    case(
        "node-yaml-utf16",
        fleet({"n1": "name: n1\n".encode("utf-16")}),
        N1,
        "node n1",
        "UTF-8",
    ),
    case(
        "node-yaml-nul",
        fleet(node_yaml("product: NVIDIA", "product: NV\x00IDIA")),
        f"{N1}:9",
        "node n1",
        "NUL",
    ),
    case(
        "config-not-utf8",
        fleet(files={"n1": {CONFIG: b"# \xff\xfe\nversion = 2\n"}}),
        N1_CONFIG,
        "node n1",
        "UTF-8",
    ),
    case(
        "dropin-not-utf8",
        fleet(files={"n2": {TOOLKIT: b"version = 3\n# caf\xe9\n"}}),
        f"facts/n2/files{TOOLKIT}",
        "node n2",
        "UTF-8",
    ),
    case(
        "certificate-in-der",
        fleet(files={"n1": {"/etc/containerd/certs.d/ca.der": b"\x30\x82\x03\xff\x00"}}),
        "facts/n1/files/etc/containerd/certs.d/ca.der",
        "node n1",
        "UTF-8",
    ),
]

TYPES = [
    case(
        "gpu-count-word",
        fleet(node_yaml("count: 4", "count: four")),
        f"{N1}:8",
        "node n1",
        "expected an integer",
        '"four"',
    ),
    case("gpu-count-negative", fleet(node_yaml("count: 4", "count: -1")), f"{N1}:8", "node n1"),
    case(
        "gpu-count-bool",
        fleet(node_yaml("count: 4", "count: true")),
        f"{N1}:8",
        "node n1",
        "expected an integer",
    ),
    case(
        "gpu-count-fraction",
        fleet(node_yaml("count: 4", "count: 4.5")),
        f"{N1}:8",
        "node n1",
        "gpus.count",
    ),
    case(
        "gpus-not-a-mapping",
        fleet(node_yaml("gpus:\n  count: 4\n  product: NVIDIA A100-SXM4-40GB\n", "gpus: 4\n")),
        f"{N1}:7",
        "node n1",
        "expected a mapping",
    ),
    case(
        "gpu-uuids-not-a-list",
        fleet(node_yaml("count: 4", "uuids: GPU-1")),
        f"{N1}:8",
        "node n1",
        "expected a list",
    ),
    case(
        "gpus-unknown-key",
        fleet(node_yaml("count: 4", "cuont: 4")),
        f"{N1}:8",
        "node n1",
        "unknown key 'cuont'",
        "did you mean 'count'",
    ),
    case(
        "ready-string-no",
        fleet(node_yaml("ready: true", "ready: 'no'")),
        f"{N1}:6",
        "node n1",
        "expected true or false",
        '"no"',
    ),
    case(
        "unschedulable-string-false",
        fleet(node_yaml("unschedulable: false", "unschedulable: 'false'")),
        f"{N1}:5",
        "node n1",
        "expected true or false",
    ),
    case(
        "ready-zero",
        fleet(node_yaml("ready: true", "ready: 0")),
        f"{N1}:6",
        "node n1",
        "expected true or false",
    ),
    case(
        "ready-and-unschedulable-strings",
        fleet(node_yaml("unschedulable: false\nready: true", "unschedulable: 'no'\nready: 'yes'")),
        N1,
        "node n1",
        problems=2,
    ),
    case(
        "labels-a-list",
        fleet(node_yaml("labels:\n  nvidia.com/gpu.present: 'true'", "labels: [a, b]")),
        f"{N1}:3",
        "node n1",
        "expected a mapping",
    ),
    case(
        "label-value-unquoted-bool",
        fleet(node_yaml("'true'", "true")),
        f"{N1}:4",
        "node n1",
        "expected a string",
    ),
    case(
        "label-value-a-table",
        fleet(node_yaml("'true'", "{a: b}")),
        f"{N1}:4",
        "node n1",
        "expected a string",
    ),
    case(
        "annotations-a-string",
        fleet(node_yaml("ready: true", "ready: true\nannotations: x")),
        f"{N1}:7",
        "node n1",
        "expected a mapping",
    ),
    case(
        "version-a-number",
        fleet(node_yaml(f"containerd_version: {V17}", "containerd_version: 1.7")),
        f"{N1}:2",
        "node n1",
        "expected a string",
    ),
    case(
        "version-not-containerd",
        fleet(node_yaml(f"containerd_version: {V17}", "containerd_version: hello world")),
        f"{N1}:2",
        "node n1",
        "not containerd --version output",
    ),
    case(
        "version-unsupported",
        fleet(node_yaml("1.7.24~ds1 1.7.24~ds1-6+deb13u1", "1.4.13 x")),
        f"{N1}:2",
        "node n1",
        "1.4.13 is not supported",
    ),
    case(
        "version-missing",
        fleet(node_yaml(f"containerd_version: {V17}\n", "")),
        N1,
        "node n1",
        "'containerd_version' is missing",
    ),
    case(
        "config-path-relative",
        fleet(node_yaml("ready: true", "ready: true\ncontainerd_config: config.toml")),
        f"{N1}:7",
        "node n1",
        "absolute, normalised path",
    ),
    case(
        "config-path-escapes",
        fleet(
            node_yaml(
                "ready: true", "ready: true\ncontainerd_config: /etc/containerd/../../../etc/passwd"
            )
        ),
        f"{N1}:7",
        "node n1",
        "absolute, normalised path",
    ),
    case(
        "config-path-newline",
        fleet(node_yaml("ready: true", 'ready: true\ncontainerd_config: "/etc/x\\n.toml"')),
        f"{N1}:7",
        "node n1",
        "absolute, normalised path",
    ),
    case(
        "config-path-not-recorded",
        fleet(node_yaml("ready: true", "ready: true\ncontainerd_config: /etc/containerd/c.toml")),
        f"{N1}:7",
        "node n1",
        "not among the recorded files",
    ),
    case(
        "node-yaml-a-list",
        fleet({"n1": "- name: n1\n"}),
        f"{N1}:1",
        "node n1",
        "expected a mapping",
    ),
    case(
        "node-yaml-unknown-key",
        fleet(node_yaml("ready: true", "ready: true\nredy: true")),
        f"{N1}:7",
        "node n1",
        "unknown key 'redy'",
    ),
]

NAMES = [
    case(
        "name-uppercase",
        fleet(node_yaml("name: n1", "name: GPU-1")),
        f"{N1}:1",
        "node n1",
        "expected a Kubernetes name",
    ),
    case(
        "name-underscore",
        fleet(node_yaml("name: n1", "name: gpu_1")),
        f"{N1}:1",
        "node n1",
        "expected a Kubernetes name",
    ),
    case(
        "name-newline",
        fleet(node_yaml("name: n1", 'name: "gpu-1\\nerror: forged"')),
        f"{N1}:1",
        "node n1",
        "expected a Kubernetes name",
    ),
    case(
        "name-too-long",
        fleet(node_yaml("name: n1", "name: " + "a" * 300)),
        f"{N1}:1",
        "node n1",
        "at most 253",
    ),
    case(
        "name-a-number",
        fleet(node_yaml("name: n1", "name: 5")),
        f"{N1}:1",
        "node n1",
        "expected a string",
    ),
    case(
        "directory-name-not-a-node-name",
        {
            **fleet(),
            "facts/N_3/node.yaml": f"containerd_version: {V17}\n",
            **{f"facts/N_3/files{p}": t for p, t in FILES["n1"].items()},
        },
        "facts/N_3/node.yaml",
        "node N_3",
        "not a Kubernetes node name",
    ),
    case(
        "same-node-twice",
        fleet(node_yaml("name: n2", "name: n1", node="n2")),
        "facts/n2/node.yaml",
        "node n1",
        "recorded twice",
        "facts/n1/node.yaml",
    ),
    case(
        "same-node-by-directory-name",
        {
            **fleet(),
            "facts/n3/node.yaml": NODE_YAML.format(name="n1", version=V17),
            **{f"facts/n3/files{p}": t for p, t in FILES["n1"].items()},
        },
        "facts/n3/node.yaml",
        "node n1",
        "recorded twice",
    ),
]


def symlink_to_other_node(work: Path) -> None:
    (work / "facts/n1/files/etc/containerd/peer.toml").symlink_to(work / f"facts/n2/files{CONFIG}")


def symlinked_directory(work: Path) -> None:
    (work / "facts/n1/files/etc/containerd/certs.d").symlink_to("/etc")


def unreadable_file(work: Path) -> None:
    path = work / "facts/n1/files/etc/containerd/secret.toml"
    path.write_text("version = 2\n")
    path.chmod(0)


FILE_KINDS = [
    case(
        "fifo-among-files",
        fleet(),
        "facts/n1/files/etc/containerd/conf.d/fifo",
        "node n1",
        "named pipe",
        setup=make_fifo("facts/n1/files/etc/containerd/conf.d/fifo"),
    ),
    case(
        "symlink-loop",
        fleet(),
        "facts/n1/files/etc/containerd/loop.toml",
        "node n1",
        "symlink loop",
        setup=make_symlink("facts/n1/files/etc/containerd/loop.toml", "loop.toml"),
    ),
    case(
        "dangling-symlink",
        fleet(),
        "facts/n2/files/etc/containerd/gone.toml",
        "node n2",
        "symlink to nothing",
        setup=make_symlink("facts/n2/files/etc/containerd/gone.toml", "nowhere.toml"),
    ),
    case(
        "symlink-to-a-secret",
        fleet(),
        "facts/n1/files/etc/containerd/shadow.toml",
        "node n1",
        "out of the node's recorded files",
        setup=make_symlink("facts/n1/files/etc/containerd/shadow.toml", "/etc/passwd"),
    ),
    case(
        "symlink-to-dev-zero",
        fleet(),
        "facts/n1/files/etc/containerd/zero.toml",
        "node n1",
        setup=make_symlink("facts/n1/files/etc/containerd/zero.toml", "/dev/zero"),
    ),
    case(
        "symlink-to-another-node",
        fleet(),
        "facts/n1/files/etc/containerd/peer.toml",
        "node n1",
        "out of the node's recorded files",
        setup=symlink_to_other_node,
    ),
    case(
        "symlinked-directory",
        fleet(),
        "facts/n1/files/etc/containerd/certs.d",
        "node n1",
        "symlink to a directory",
        setup=symlinked_directory,
    ),
    case(
        "file-too-big",
        fleet(files={"n1": {"/etc/containerd/core": "#" * 1_100_000}}),
        "facts/n1/files/etc/containerd/core",
        "node n1",
        "over the",
    ),
    case(
        "node-yaml-a-fifo",
        fleet(),
        "facts/n1/node.yaml",
        "node n1",
        setup=lambda work: (os.remove(work / N1), os.mkfifo(work / N1)),
    ),
    case(
        "fifo-and-loop-on-two-nodes",
        fleet(),
        "facts/n",
        "node n1",
        "node n2",
        setup=lambda work: (
            make_fifo("facts/n1/files/etc/containerd/fifo")(work),
            make_symlink("facts/n2/files/etc/containerd/loop", "loop")(work),
        ),
        problems=2,
    ),
]
if os.geteuid() != 0:  # root reads a file of mode 000 anyway
    FILE_KINDS.append(
        case(
            "unreadable-file",
            fleet(),
            "facts/n1/files/etc/containerd/secret.toml",
            "node n1",
            "cannot read",
            setup=unreadable_file,
        )
    )

CONFIGS = [
    case(
        "config-not-toml",
        fleet(files={"n1": {CONFIG: "version = 2\nx = = 1\n"}}),
        f"{N1_CONFIG}:2",
        "node n1",
        "not valid TOML",
    ),
    case(
        "dropin-not-toml",
        fleet(files={"n2": {TOOLKIT: "version = 3\n[plugins\n"}}),
        f"facts/n2/files{TOOLKIT}:2",
        "node n2",
        "not valid TOML",
    ),
    case(
        "import-missing-on-1.7",
        fleet(files={"n1": {CONFIG: 'version = 2\nimports = ["/etc/containerd/gone.toml"]\n'}}),
        N1_CONFIG,
        "node n1",
        "/etc/containerd/gone.toml, which does not exist",
    ),
    case(
        "config-version-a-string",
        fleet(files={"n1": {CONFIG: 'version = "2"\n'}}),
        N1_CONFIG,
        "node n1",
        "`version` must be an integer",
    ),
    case(
        "config-version-9",
        fleet(files={"n2": {CONFIG: "version = 9\n"}}),
        f"facts/n2/files{CONFIG}",
        "node n2",
        "unknown config version 9",
    ),
    case(
        "imports-not-strings",
        fleet(files={"n1": {CONFIG: "version = 2\nimports = [1, 2]\n"}}),
        N1_CONFIG,
        "node n1",
        "array of strings",
    ),
    case(
        "import-of-a-directory",
        fleet(
            files={
                "n1": {
                    CONFIG: 'version = 2\nimports = ["/etc/containerd/conf.d"]\n',
                }
            }
        ),
        N1_CONFIG,
        "node n1",
        "is a directory",
    ),
    case(
        "config-version-1-on-2.1",
        fleet(files={"n2": {CONFIG: "version = 1\n", TOOLKIT: "version = 1\n"}}),
        f"facts/n2/files{CONFIG}",
        "node n2",
        "config version 1",
    ),
    case(
        "one-broken-node-of-many",
        {
            **fleet(),
            **{
                f"facts/n{i}/node.yaml": NODE_YAML.format(name=f"n{i}", version=V17)
                for i in range(3, 9)
            },
            **{
                f"facts/n{i}/files{p}": t
                for i in range(3, 9)
                for p, t in {**FILES["n1"], CONFIG: "version = 2\n"}.items()
            },
            f"facts/n6/files{CONFIG}": "version = [\n",
        },
        "facts/n6/files/etc/containerd/config.toml:1",
        "node n6",
    ),
]


def cluster_case(id: str, text: str | bytes, line: int | None, says: str) -> HostileCase:
    """A case whose facts/cluster.yaml is `text`; the error names `line` (None: no line)."""
    where = "facts/cluster.yaml" + (f":{line}" if line is not None else "")
    return case(id, fleet(extra={"facts/cluster.yaml": text}), where, says)


CLUSTER = [
    cluster_case("configmaps-a-list", "configmaps: [a, b]\n", 1, "expected a mapping"),
    cluster_case(
        "configmap-name-without-namespace", "configmaps:\n  profiles: {a: b}\n", 2, "namespace/name"
    ),
    cluster_case("configmap-data-a-list", "configmaps:\n  ns/cm: [a]\n", 2, "expected a mapping"),
    cluster_case("cluster-policy-a-list", "cluster_policy: [a]\n", 1, "expected a mapping"),
    cluster_case("cluster-yaml-not-utf8", b"configmaps: {ns/cm: {a: \xff}}\n", None, "UTF-8"),
]


CASES = BYTES + TYPES + NAMES + FILE_KINDS + CONFIGS + CLUSTER


test_hostile_facts = hostile_test(CASES)


def test_the_table_is_long_enough() -> None:
    assert len(CASES) >= 50


def test_the_unbroken_fleet_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cases break one thing each: the fleet they start from plans cleanly."""
    good = HostileCase("good", argv=ARGV, files=fleet(), exit_code=0, max_s=30.0)
    run_case(good, tmp_path, monkeypatch)


@pytest.mark.parametrize("error", [UnsupportedVersion("x"), ImportMissing("x")])
def test_engine_refusals_of_node_configs_are_bad_input(error: BadInput) -> None:
    assert isinstance(error, BadInput) and error.exit_code == 2


def test_the_fast_read_leaves_every_refusal_to_read_text(tmp_path: Path) -> None:
    """read_plain_text reads what read_text reads, and None wherever read_text would refuse
    or follow a link (it then reads the file again and words why)."""
    from rollout.facts.recorded_files import read_plain_text
    from rollout.inputs.inputfile import read_text

    (tmp_path / "ok.toml").write_text("version = 2\n# é\n", encoding="utf-8")
    (tmp_path / "big.toml").write_bytes(b"x" * 101)
    (tmp_path / "limit.toml").write_bytes(b"x" * 100)
    (tmp_path / "latin1.toml").write_bytes(b"caf\xe9\n")
    (tmp_path / "dir").mkdir()
    os.mkfifo(tmp_path / "fifo")
    os.symlink(tmp_path / "ok.toml", tmp_path / "link.toml")
    for name in ("ok.toml", "limit.toml"):
        path = tmp_path / name
        assert read_plain_text(str(path), 100) == read_text(path, max_bytes=100)
    for name in ("big.toml", "latin1.toml", "dir", "fifo", "link.toml", "missing"):
        assert read_plain_text(str(tmp_path / name), 100) is None, name
