"""Hostile plans: bytes, sizes, file kinds, nesting, alias bombs, odd YAML, paths outside
/etc/containerd. Every case: exit 2 (1 with --detailed-exitcode), a located message, no
traceback, nothing written, and fast (see tests/hostile.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import (
    EXAMPLE_FACTS,
    GOOD_PLAN,
    HostileCase,
    hostile_test,
    make_fifo,
    make_symlink,
)

PLAN = ("plan", "plan.yaml", "--facts", EXAMPLE_FACTS)


def plan_case(id: str, text: str | bytes, where: str, *says: str, **more: object) -> HostileCase:
    """A case running `rollout plan plan.yaml --facts examples/facts` on `text`."""
    return HostileCase(id, argv=PLAN, files={"plan.yaml": text}, where=where, says=says, **more)  # type: ignore[arg-type]


def replaced(old: str, new: str) -> str:
    """GOOD_PLAN with one piece replaced (asserting it is there)."""
    assert old in GOOD_PLAN
    return GOOD_PLAN.replace(old, new)


def nested_flow(depth: int) -> str:
    return GOOD_PLAN + "x: " + "[" * depth + "]" * depth + "\n"


def nested_block(depth: int) -> str:
    lines = [f"{'  ' * i}k{i}:" for i in range(depth)]
    return GOOD_PLAN + "x:\n" + "\n".join("  " + line for line in lines) + " 1\n"


def laughs(levels: int, width: int = 10, mapping: bool = False) -> str:
    """The "billion laughs" document: each anchor holds `width` aliases of the one before."""
    lines = ['a0: &a0 "lol"']
    for level in range(1, levels):
        items = [f"*a{level - 1}"] * width
        if mapping:
            body = ", ".join(f"k{i}: {item}" for i, item in enumerate(items))
            lines.append(f"a{level}: &a{level} {{{body}}}")
        else:
            lines.append(f"a{level}: &a{level} [{', '.join(items)}]")
    return "\n".join(lines) + "\n"


def alias_chain(length: int) -> str:
    """Aliases that each nest the one before: shallow in the file, deep once expanded."""
    lines = ["c0: &c0 [x]"] + [f"c{i}: &c{i} [*c{i - 1}]" for i in range(1, length)]
    return "\n".join(lines) + "\n"


MIB = 1024 * 1024
GOOD_LINES = GOOD_PLAN.count("\n")

BYTES = [
    plan_case(
        "nul-in-value", replaced("name: mirror", "name: mir\x00ror"), "plan.yaml:4:12", "NUL"
    ),
    plan_case("nul-first-byte", "\x00" + GOOD_PLAN, "plan.yaml:1:1", "NUL"),
    plan_case("nul-in-comment", GOOD_PLAN + "# ok\x00\n", f"plan.yaml:{GOOD_LINES + 1}", "NUL"),
    plan_case("nul-in-key", replaced("kind:", "ki\x00nd:"), "plan.yaml:2:3", "NUL"),
    plan_case(
        "nul-on-three-lines",
        "\x00\n" + GOOD_PLAN + "\x00\n\x00\n",
        "plan.yaml:1:1",
        "NUL",
        problems=3,
    ),
    plan_case("escape-character", replaced("name: mirror", "name: \x1b[31mred"), "plan.yaml:4:9"),
    plan_case("bell-character", replaced("docker.io", "docker\x07.io"), "plan.yaml:9:19", "U+0007"),
    plan_case("backspace", GOOD_PLAN + "\x08\n", f"plan.yaml:{GOOD_LINES + 1}:1", "U+0008"),
    plan_case("latin-1-byte", GOOD_PLAN.encode() + b"# caf\xe9\n", "plan.yaml", "UTF-8"),
    plan_case("utf-16", GOOD_PLAN.encode("utf-16"), "plan.yaml", "UTF-8"),
    plan_case("binary-garbage", bytes(range(256)) * 4, "plan.yaml", "UTF-8"),
    plan_case(
        "escape-in-quoted-value",
        replaced("name: mirror", 'name: "\\e[2J"'),
        "plan.yaml:4:9",
        "DNS label",
    ),
    plan_case("lone-surrogate-escape", replaced("name: mirror", 'name: "\\ud800"'), "plan.yaml:4"),
]

SIZES = [
    plan_case(
        "two-mib-of-comments", GOOD_PLAN + ("#" * 99 + "\n") * (2 * MIB // 100), "plan.yaml", "MiB"
    ),
    plan_case("one-mib-plus-one", GOOD_PLAN + "#" * (MIB - len(GOOD_PLAN)) + "\n", "plan.yaml"),
    plan_case(
        "two-mib-scalar", replaced("name: mirror", "name: " + "a" * 2 * MIB), "plan.yaml", "limit"
    ),
    plan_case(
        "sixteen-mib-plan", b"# " + b"x" * (16 * MIB) + b"\n", "plan.yaml", "over the 1 MiB limit"
    ),
    plan_case(
        "two-hundred-thousand-items",
        GOOD_PLAN + "x: [" + "1," * 200_000 + "1]\n",
        f"plan.yaml:{GOOD_LINES + 1}",
        "more than 10000 values",
        max_s=4.0,
    ),
    plan_case(
        "integer-of-ten-thousand-digits",
        replaced("name: mirror", "name: " + "9" * 10_000),
        "plan.yaml:4:9",
        "cannot read the value",
    ),
    plan_case(
        "hundred-kib-key",
        GOOD_PLAN + "k" * 100_000 + ": 1\n",
        f"plan.yaml:{GOOD_LINES + 1}",
        "not valid YAML",
    ),
    plan_case(
        "thousand-character-key",
        GOOD_PLAN + "k" * 1000 + ": 1\n",
        f"plan.yaml:{GOOD_LINES + 1}:1",
        "unknown key",
        max_stderr=2000,
    ),
]


def _touch_unreadable_link_loop(work: Path) -> None:
    (work / "plan.yaml").symlink_to("loop.yaml")
    (work / "loop.yaml").symlink_to("plan.yaml")


FILE_KINDS = [
    HostileCase("fifo", argv=PLAN, setup=make_fifo("plan.yaml"), where="plan.yaml", says=("FIFO",)),
    HostileCase(
        "link-to-dev-zero",
        argv=PLAN,
        setup=make_symlink("plan.yaml", "/dev/zero"),
        where="plan.yaml",
        says=("character device", "regular file"),
    ),
    *(
        HostileCase(
            path.strip("/").replace("/", "-"),
            argv=("plan", path, "--facts", EXAMPLE_FACTS),
            where=path,
            says=("not a regular file",),
        )
        for path in ("/dev/zero", "/dev/null", "/dev/stdin")
    ),
    HostileCase(
        "proc-self-mem",
        argv=("plan", "/proc/self/mem", "--facts", EXAMPLE_FACTS),
        where="/proc/self/mem",
    ),
    HostileCase(
        "directory",
        argv=PLAN,
        setup=lambda work: (work / "plan.yaml").mkdir(),
        where="plan.yaml",
        says=("directory",),
    ),
    HostileCase("missing", argv=PLAN, where="plan.yaml", says=("not found",)),
    HostileCase(
        "dangling-link",
        argv=PLAN,
        setup=make_symlink("plan.yaml", "nowhere.yaml"),
        where="plan.yaml",
        says=("not found",),
    ),
    HostileCase(
        "link-loop", argv=PLAN, setup=_touch_unreadable_link_loop, where="plan.yaml", says=("read",)
    ),
    HostileCase(
        "socket",
        argv=PLAN,
        setup=lambda work: __import__("socket").socket(1).bind(str(work / "plan.yaml")),
        where="plan.yaml",
        says=("socket",),
    ),
]

NESTING = [
    plan_case("flow-lists-10000-deep", nested_flow(10_000), f"plan.yaml:{GOOD_LINES + 1}", "depth"),
    plan_case(
        "flow-lists-101-deep", nested_flow(101), f"plan.yaml:{GOOD_LINES + 1}", "limit is 100"
    ),
    plan_case(
        "flow-mappings-5000-deep",
        GOOD_PLAN + "x: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
        f"plan.yaml:{GOOD_LINES + 1}",
        "depth",
    ),
    plan_case("block-mappings-150-deep", nested_block(150), "plan.yaml:", "levels deep"),
    plan_case(
        "block-lists-500-deep",
        GOOD_PLAN + "x:\n" + "".join("  " * i + "-\n" for i in range(500)) + "  " * 500 + "- 1\n",
        "plan.yaml:",
        "depth",
    ),
    plan_case(
        "deep-inside-changes",
        replaced("host: docker.io", "host: " + "[" * 3000 + "]" * 3000),
        "plan.yaml:9",
        "depth",
    ),
    plan_case(
        "alias-chain-150",
        GOOD_PLAN + alias_chain(150),
        "plan.yaml:",
        "once aliases are expanded",
    ),
    plan_case(
        "alias-chain-3000",
        GOOD_PLAN + alias_chain(3000),
        "plan.yaml:",
        "once aliases are expanded",
    ),
]

BOMBS = [
    plan_case(
        "billion-laughs-lists",
        GOOD_PLAN + laughs(10),
        f"plan.yaml:{GOOD_LINES + 5}",
        "more than 10000 values",
    ),
    plan_case(
        "billion-laughs-mappings",
        GOOD_PLAN + laughs(10, mapping=True),
        "plan.yaml:",
        "alias",
        "more than 10000 values",
    ),
    plan_case(
        "laughs-wide-not-deep",
        GOOD_PLAN + laughs(3, width=2000),
        "plan.yaml:",
        "more than 10000 values",
    ),
    plan_case(
        "laughs-in-description",
        laughs(9) + replaced("name: mirror", "name: mirror\n  description: *a8"),
        "plan.yaml:",
        "more than 10000 values",
    ),
    plan_case(
        "laughs-through-merge-keys",
        GOOD_PLAN
        + "m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8, i: 9, j: 10}\n"
        + "".join(
            f"m{i}: &m{i} {{{', '.join(f'k{j}: *m{i - 1}' for j in range(10))}}}\n"
            for i in range(1, 8)
        )
        + "top: {<<: *m7}\n",
        "plan.yaml:",
        "more than 10000 values",
    ),
    plan_case(
        "laughs-as-changes",
        replaced("changes:\n", "changes: &c\n").replace(
            "apiVersion: rollout/v1\n", laughs(8) + "apiVersion: rollout/v1\n"
        )
        + "extra: ["
        + ", ".join(["*a7"] * 20)
        + "]\n",
        "plan.yaml:",
        "values",
    ),
    plan_case("self-containing-list", GOOD_PLAN + "x: &x [1, *x]\n", "plan.yaml:", "cycle"),
    plan_case("self-containing-map", GOOD_PLAN + "x: &x {a: *x}\n", "plan.yaml:", "cycle"),
    plan_case(
        "undefined-alias",
        GOOD_PLAN + "x: *nowhere\n",
        f"plan.yaml:{GOOD_LINES + 1}",
        "undefined alias",
    ),
    plan_case(
        "duplicate-anchor",
        GOOD_PLAN + "x: &a 1\ny: &a 2\nz: *a\n",
        "plan.yaml:",
    ),
]

ODD_YAML = [
    plan_case("empty", "", "plan.yaml:1", "empty"),
    plan_case("only-comments", "# nothing\n# here\n", "plan.yaml:1", "empty"),
    plan_case("top-level-list", "- a\n- b\n", "plan.yaml:1", "mapping"),
    plan_case("top-level-scalar", "hello\n", "plan.yaml:1", "mapping"),
    plan_case("top-level-null", "null\n", "plan.yaml:1", "mapping"),
    plan_case("two-documents", GOOD_PLAN + "---\n" + GOOD_PLAN, "plan.yaml:", "single document"),
    plan_case(
        "python-object-tag",
        replaced("name: mirror", "name: !!python/object/apply:os.system [touch pwned]"),
        "plan.yaml:4:9",
        "tag",
    ),
    plan_case(
        "python-name-tag",
        GOOD_PLAN + "x: !!python/name:os.system ''\n",
        f"plan.yaml:{GOOD_LINES + 1}",
    ),
    plan_case("unknown-local-tag", replaced("name: mirror", "name: !secret x"), "plan.yaml:4:9"),
    plan_case("binary-tag", replaced("name: mirror", "name: !!binary aGVsbG8="), "plan.yaml:4:9"),
    plan_case("bad-base64", replaced("name: mirror", "name: !!binary '%%%'"), "plan.yaml:4:9"),
    plan_case("timestamp", replaced("name: mirror", "name: 2024-01-01"), "plan.yaml:4:9"),
    plan_case("set-tag", replaced("name: mirror", "name: !!set {a, b}"), "plan.yaml:4:9"),
    plan_case("huge-float", replaced("name: mirror", "name: 1.0e+999"), "plan.yaml:4:9"),
    plan_case(
        "list-as-key", GOOD_PLAN + "? [a, b]\n: 1\n", f"plan.yaml:{GOOD_LINES + 1}", "unhashable"
    ),
    plan_case("null-key", GOOD_PLAN + "~: 1\n", f"plan.yaml:{GOOD_LINES + 1}", "string key"),
    plan_case("integer-key", GOOD_PLAN + "7: 1\n", f"plan.yaml:{GOOD_LINES + 1}", "string key"),
    plan_case("omap-tag", replaced("metadata:\n", "metadata: !!omap\n"), "plan.yaml:3", "tag"),
    plan_case(
        "set-tag-on-metadata", replaced("metadata:\n", "metadata: !!set\n"), "plan.yaml:3", "tag"
    ),
    plan_case("duplicate-key", replaced("kind: Plan\n", "kind: Plan\nkind: Plan\n"), "plan.yaml:3"),
    plan_case(
        "two-duplicate-keys",
        GOOD_PLAN + "kind: Plan\nmetadata: {}\n",
        "plan.yaml:",
        "duplicate key",
        problems=2,
    ),
    plan_case("tab-indent", replaced("  name: mirror", "\tname: mirror"), "plan.yaml:4"),
    plan_case("unclosed-quote", replaced("name: mirror", 'name: "mirror'), "plan.yaml:"),
    plan_case("unclosed-flow", GOOD_PLAN + "x: [1, 2\n", "plan.yaml:"),
    plan_case(
        "thousand-unknown-keys",
        GOOD_PLAN + "".join(f"unknown{i}: 1\n" for i in range(300)),
        f"plan.yaml:{GOOD_LINES + 1}",
        "unknown key",
        problems=300,
        max_stderr=100_000,
    ),
]

PATHS = [
    plan_case(
        "config-path-cron",
        replaced("host: docker.io\n", "host: docker.io\n      config_path: /etc/cron.d\n"),
        "plan.yaml:10",
        "/etc/containerd",
        "allow_paths_outside",
    ),
    plan_case(
        "config-path-root-ssh",
        replaced("host: docker.io\n", "host: docker.io\n      config_path: /root/.ssh\n"),
        "plan.yaml:10",
        "/etc/containerd",
    ),
    plan_case(
        "config-path-prefix-trick",
        replaced("host: docker.io\n", "host: docker.io\n      config_path: /etc/containerd-evil\n"),
        "plan.yaml:10",
        "/etc/containerd",
    ),
    plan_case(
        "config-path-dot-dot",
        replaced(
            "host: docker.io\n", "host: docker.io\n      config_path: /etc/containerd/../cron.d\n"
        ),
        "plan.yaml:10",
    ),
    plan_case(
        "config-path-relative",
        replaced("host: docker.io\n", "host: docker.io\n      config_path: certs.d\n"),
        "plan.yaml:10",
        "absolute",
    ),
    plan_case(
        "ca-file-authorized-keys",
        replaced(
            "- url: https://mirror.registry.internal:5000\n",
            "- url: https://mirror.registry.internal:5000\n"
            "          ca_file: /root/.ssh/authorized_keys\n",
        ),
        "plan.yaml:12",
        "/etc/containerd",
    ),
    plan_case(
        "ca-file-etc-passwd",
        replaced(
            "- url: https://mirror.registry.internal:5000\n",
            "- url: https://mirror.registry.internal:5000\n          ca_file: /etc/passwd\n",
        ),
        "plan.yaml:12",
        "allow_paths_outside",
    ),
    plan_case(
        "allow-paths-outside-quoted",
        replaced(
            "host: docker.io\n",
            'host: docker.io\n      config_path: /etc/cron.d\n      allow_paths_outside: "true"\n',
        ),
        "plan.yaml:11",
        "true or false",
    ),
    plan_case(
        "ca-file-nul",
        replaced(
            "- url: https://mirror.registry.internal:5000\n",
            "- url: https://mirror.registry.internal:5000\n"
            '          ca_file: "/etc/containerd/a\\0b"\n',
        ),
        "plan.yaml:12",
    ),
]


def in_window(timezone: str) -> str:
    window = '  maintenance_window:\n    start: "22:00"\n    end: "02:00"\n'
    return GOOD_PLAN + "policy:\n" + window + f"    timezone: {timezone}\n"


FIELDS = [
    plan_case(
        "timezone-of-5000-characters",
        in_window("a" * 5000),
        f"plan.yaml:{GOOD_LINES + 5}",
        "unknown time zone",
        max_stderr=2000,
    ),
    plan_case(
        "timezone-directory", in_window("Europe"), f"plan.yaml:{GOOD_LINES + 5}", "time zone"
    ),
    plan_case(
        "timezone-path",
        in_window("../../../etc/passwd"),
        f"plan.yaml:{GOOD_LINES + 5}",
        "time zone",
    ),
    plan_case(
        "metadata-name-of-a-megabyte-minus",
        replaced("name: mirror", "name: " + "a" * 900_000),
        "plan.yaml:4:9",
        "DNS label",
        max_stderr=2000,
    ),
    plan_case(
        "selector-of-100k",
        replaced("selector: nvidia.com/gpu.present=true", "selector: " + "a=b," * 25_000 + "a=b"),
        "plan.yaml:6",
        max_stderr=5000,
    ),
]


def apply_case(id: str, plan: str | None, where: str, *says: str, **more: object) -> HostileCase:
    """`rollout apply plan.yaml -i inv.ini --yes` on `plan` (None: `setup` makes plan.yaml)."""
    files = {"inv.ini": "gpu1\n"} if plan is None else {"plan.yaml": plan, "inv.ini": "gpu1\n"}
    argv = ("apply", "plan.yaml", "-i", "inv.ini", "--yes")
    return HostileCase(id, argv=argv, files=files, where=where, says=says, **more)  # type: ignore[arg-type]


APPLY = [
    apply_case("apply-fifo-plan", None, "plan.yaml", "FIFO", setup=make_fifo("plan.yaml")),
    HostileCase(
        "apply-dev-zero-plan",
        argv=("apply", "/dev/zero", "-i", "inv.ini", "--yes"),
        files={"inv.ini": "gpu1\n"},
        where="/dev/zero",
        says=("character device",),
    ),
    apply_case(
        "apply-billion-laughs", GOOD_PLAN + laughs(10), "plan.yaml:", "more than 10000 values"
    ),
    apply_case("apply-nul-byte", "\x00" + GOOD_PLAN, "plan.yaml:1:1", "NUL"),
    apply_case(
        "apply-paths-outside",
        replaced("host: docker.io\n", "host: docker.io\n      config_path: /etc/cron.d\n"),
        "plan.yaml:10",
        "allow_paths_outside",
    ),
]


CASES = [*BYTES, *SIZES, *FILE_KINDS, *NESTING, *BOMBS, *ODD_YAML, *PATHS, *FIELDS, *APPLY]


test_hostile_plan = hostile_test(CASES)


def test_the_good_plan_is_good(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case breaks GOOD_PLAN in one place; unbroken it plans (changes pending)."""
    from tests.hostile import invoke

    (tmp_path / "plan.yaml").write_text(GOOD_PLAN)
    monkeypatch.chdir(tmp_path)
    result = invoke([*PLAN, "--detailed-exitcode", "--output", "json"])
    assert result.code == 2, result.stderr


def test_paths_outside_are_accepted_when_the_plan_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.hostile import invoke

    text = replaced(
        "host: docker.io\n",
        "host: docker.io\n      config_path: /srv/certs.d\n      allow_paths_outside: true\n",
    )
    (tmp_path / "plan.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    result = invoke([*PLAN, "--output", "json"])
    assert result.code == 0, result.stderr
    assert "/srv/certs.d/docker.io/hosts.toml" in result.stdout


def test_a_plan_of_just_under_the_limit_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.hostile import invoke

    text = GOOD_PLAN + ("#" * 99 + "\n") * ((1024 * 1024 - len(GOOD_PLAN)) // 100)
    assert len(text.encode()) <= 1024 * 1024
    (tmp_path / "plan.yaml").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert invoke([*PLAN, "--output", "json"]).code == 0
