"""Hostile command lines: counts out of range, contradictory sources of facts, odd run ids,
and an unexpected exception (an internal error, never a traceback without --debug)."""

from __future__ import annotations

from pathlib import Path

import pytest

import rollout.cli.plan
from rollout.cli import main
from tests.hostile import EXAMPLE_FACTS, GOOD_PLAN, HostileCase, hostile_test, invoke

INVENTORY = "gpu1 ansible_host=127.0.0.1\n"
FILES = {"plan.yaml": GOOD_PLAN, "inv.ini": INVENTORY}


def cli_case(
    id: str,
    *argv: str,
    says: tuple[str, ...] = (),
    files: dict[str, str] | None = None,
    **more: object,
) -> HostileCase:
    """A command line run with plan.yaml and inv.ini (and `files`) in the working directory."""
    return HostileCase(id, argv=argv, files={**FILES, **(files or {})}, says=says, **more)  # type: ignore[arg-type]


PARALLEL = [
    cli_case(
        f"{command}-parallel-{name}",
        command,
        "plan.yaml",
        "-i",
        "inv.ini",
        "--parallel",
        value,
        says=("--parallel", expected),
    )
    for command in ("plan", "apply")
    for name, value, expected in (
        ("zero", "0", "from 1 to 256, found 0"),
        ("negative", "-1", "found -1"),
        ("very-negative", "-99999999999", "from 1 to 256"),
        ("huge", "1000000", "found 1000000"),
        ("ten-thousand-digits", "9" * 10_000, "from 1 to 256"),
        ("word", "many", "'many'"),
        ("fraction", "1.5", "'1.5'"),
        ("empty", "", "from 1 to 256"),
        ("superscript", "\u00b2", "from 1 to 256"),
    )
]

SOURCES = [
    cli_case(
        "plan-inventory-and-facts",
        "plan",
        "plan.yaml",
        "-i",
        "inv.ini",
        "--facts",
        EXAMPLE_FACTS,
        says=("--facts and --inventory", "pass one of them"),
    ),
    cli_case(
        "plan-facts-and-inventory-reversed",
        "plan",
        "plan.yaml",
        "--facts",
        EXAMPLE_FACTS,
        "--inventory",
        "inv.ini",
        says=("pass one of them",),
    ),
    cli_case(
        "plan-facts-and-bad-inventory",
        "plan",
        "plan.yaml",
        "--facts",
        EXAMPLE_FACTS,
        "-i",
        "nowhere.ini",
        says=("pass one of them",),
    ),
    cli_case("plan-no-facts-source", "plan", "plan.yaml", says=("--inventory", "--facts")),
    cli_case("apply-no-inventory", "apply", "plan.yaml", "--yes", says=("--inventory",)),
    cli_case("plan-no-plan", "plan", "--facts", EXAMPLE_FACTS, says=("PLAN",)),
    cli_case(
        "plan-two-plans",
        "plan",
        "plan.yaml",
        "plan.yaml",
        "--facts",
        EXAMPLE_FACTS,
        says=("unrecognized",),
    ),
    cli_case(
        "plan-output-xml",
        "plan",
        "plan.yaml",
        "--facts",
        EXAMPLE_FACTS,
        "--output",
        "xml",
        says=("--output",),
    ),
    cli_case(
        "apply-output-markdown",
        "apply",
        "plan.yaml",
        "-i",
        "inv.ini",
        "-o",
        "markdown",
        says=("--output",),
    ),
    cli_case("unknown-option", "plan", "plan.yaml", "--facts", EXAMPLE_FACTS, "--frobnicate"),
    cli_case(
        "unknown-command", "destroy-everything", says=("unknown command 'destroy-everything'",)
    ),
    cli_case("no-command", says=("usage",)),
    cli_case("missing-facts-dir", "plan", "plan.yaml", "--facts", "nowhere", where="nowhere"),
    cli_case("facts-dir-is-a-file", "plan", "plan.yaml", "--facts", "plan.yaml", where="plan.yaml"),
    cli_case(
        "bad-plan-before-facts",
        "plan",
        "broken.yaml",
        "--facts",
        "nowhere",
        where="broken.yaml:2",
        files={"broken.yaml": "kind: [\n"},
    ),
]

RUN_IDS = [
    cli_case(f"{command}-run-{name}", command, run_id, says=("no run",))
    for command in ("resume", "status")
    for name, run_id in (
        ("parent-dirs", "../../etc"),
        ("absolute", "/etc/passwd"),
        ("unknown", "20260101-000000-nope-abcd"),
        ("newline", "a\nb"),
        ("dot-dot", ".."),
    )
]

STATE_DIRS = [
    cli_case(f"{name}-state-dir-{kind}", *argv, "--state-dir", path, says=("not a directory",))
    for name, argv in (
        ("status", ("status",)),
        ("status-all", ("status", "--all")),
        ("resume", ("resume", "20260101-000000-x-abcd")),
        ("apply", ("apply", "plan.yaml", "-i", "inv.ini", "--yes")),
    )
    for kind, path in (("file", "plan.yaml"), ("device", "/dev/null"))
]

LAB = [
    # `lab up --nodes 0` checks the machine before its arguments (exit 1): rollout/lab/cli.py
    cli_case("lab-up-word-nodes", "lab", "up", "--nodes", "four", says=("--nodes",)),
    cli_case(
        "lab-up-unknown-containerd", "lab", "up", "--containerd", "9.9", says=("--containerd",)
    ),
]

CASES = [*PARALLEL, *SOURCES, *RUN_IDS, *STATE_DIRS, *LAB]


test_hostile_command_line = hostile_test(CASES)


def _explode(*args: object, **kwargs: object) -> object:
    raise RuntimeError("boom: an invariant broke\nsecond line")


@pytest.fixture
def broken_planner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A good plan.yaml in the working directory, and a planner that raises on reading it."""
    (tmp_path / "plan.yaml").write_text(GOOD_PLAN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rollout.cli.plan, "parse_spec", _explode)


@pytest.mark.usefixtures("broken_planner")
def test_an_internal_error_is_reported_without_a_traceback() -> None:
    result = invoke(["plan", "plan.yaml", "--facts", EXAMPLE_FACTS])
    assert result.code == 1
    assert "Traceback" not in result.stderr
    assert "internal error: RuntimeError: boom: an invariant broke second line" in result.stderr
    assert "--debug" in result.stderr


@pytest.mark.usefixtures("broken_planner")
@pytest.mark.parametrize(
    "argv",
    [
        ["--debug", "plan", "plan.yaml", "--facts", EXAMPLE_FACTS],
        ["plan", "plan.yaml", "--facts", EXAMPLE_FACTS, "--debug"],
    ],
    ids=["before-the-command", "after-the-command"],
)
def test_debug_shows_the_traceback_anywhere_on_the_line(argv: list[str]) -> None:
    result = invoke(argv)
    assert result.code == 1
    assert "Traceback" in result.stderr
    assert "_explode" in result.stderr


@pytest.mark.usefixtures("broken_planner")
def test_an_internal_error_with_detailed_exitcode_is_1() -> None:
    result = invoke(["plan", "plan.yaml", "--facts", EXAMPLE_FACTS, "--detailed-exitcode"])
    assert result.code == 1


def test_parallel_at_its_bounds_is_accepted() -> None:
    parser = rollout.cli.build_parser()
    for value in ("1", "256"):
        args = parser.parse_args(["plan", "p.yaml", "-i", "inv", "--parallel", value])
        assert args.parallel == int(value)


def test_an_error_quoting_a_control_character_prints_it_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hostile file name inside an error message cannot drive the terminal."""
    name = tmp_path / "plan\x1b[2J.yaml"
    assert main(["plan", str(name), "--facts", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J" in err


@pytest.mark.parametrize(
    "args",
    [["--nodes", "0"], ["--nodes", "-3"], ["--gpus", "99"], ["--containerd", "9.9"]],
    ids=["no-nodes", "negative-nodes", "too-many-gpus", "unknown-series"],
)
def test_lab_up_arguments_are_checked_before_the_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    """`lab up` with impossible arguments is bad input (2) on any machine, lab-ready or not."""
    assert main(["lab", "up", "--lab-dir", str(tmp_path / "lab"), *args]) == 2
    assert "error:" in capsys.readouterr().err
    assert not (tmp_path / "lab").exists()
