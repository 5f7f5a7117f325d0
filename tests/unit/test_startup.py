"""Start-up: the CLI imports a library only for the commands that use it.

`rollout --help` lists every command without importing any command's module (their
libraries, kubernetes and fabric above all, cost most of the start-up); each command builds
its own parser when it runs. Measured by bench/run, never timed here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from rollout.cli import COMMANDS, build_parser
from tests.examples import FACTS, PLAN

HEAVY = ("kubernetes", "fabric", "invoke", "paramiko", "pydantic", "rich")


def imported_after(argv: list[str]) -> set[str]:
    """The heavy libraries a fresh interpreter has imported after `python -m rollout ARGV`."""
    script = textwrap.dedent(
        f"""
        import contextlib, io, json, runpy, sys
        sys.argv = ["rollout", *{argv!r}]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                runpy.run_module("rollout", run_name="__main__")
            except SystemExit:
                pass
        print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}})))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    return set(json.loads(result.stdout)) & set(HEAVY)


@pytest.mark.parametrize("argv", [["--help"], [], ["--version"], ["no-such-command"]])
def test_help_imports_none_of_the_heavy_libraries(argv: list[str]) -> None:
    assert imported_after(argv) == set()


def test_plan_from_recorded_facts_reaches_for_no_ssh_and_no_cluster() -> None:
    imported = imported_after(["plan", str(PLAN), "--facts", str(FACTS)])
    assert imported.isdisjoint({"fabric", "invoke", "paramiko", "kubernetes"})
    assert "rich" in imported  # it does render


def test_the_listing_is_the_commands_own_help() -> None:
    """`rollout --help` built from the listing reads as the one built from every module."""
    assert build_parser(()).format_help() == build_parser().format_help()


def test_every_registered_command_is_listed() -> None:
    parser = build_parser()
    registered = next(
        action.choices
        for action in parser._actions
        if isinstance(action.choices, dict) and "plan" in action.choices
    )
    assert list(registered) == [c.name for c in COMMANDS]


@pytest.mark.parametrize("command", [c.name for c in COMMANDS])
def test_a_command_built_alone_parses_as_in_the_full_parser(command: str) -> None:
    alone = build_parser({command})
    full = build_parser()
    assert alone.format_help() == full.format_help()
    sub_alone = alone._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    sub_full = full._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    assert sub_alone.format_help() == sub_full.format_help()
