"""Facts read in one round trip (rollout.facts.batch) give what each read alone gives: the same
stdout byte for byte, stderr, exit code, optional facts, and failures worded the same."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from rollout.commands import CommandFailed, CommandResult
from rollout.fact import ProbeFailed, read_fact
from rollout.facts.batch import read_facts
from rollout.transports.local import LocalRunner


@dataclass(frozen=True)
class ShellFact:
    """A fact whose command is a shell snippet; parsed as the raw text."""

    script: str
    optional: bool = False

    @property
    def what(self) -> str:
        return f"run {self.script!r}"

    def command(self) -> list[str]:
        return ["sh", "-c", self.script]

    def parse(self, text: str, host: str) -> str:
        return text


TRICKY = (
    ShellFact("printf 'no newline at the end'"),
    ShellFact("printf 'a\\0b\\0'"),  # NUL-separated, as the files fact prints
    ShellFact("printf '\\n\\n'"),  # only newlines
    ShellFact("true"),  # nothing at all
    ShellFact("echo out; echo err >&2"),
    ShellFact("printf '%s\\n' 'looks like a frame 0' 'rollout-fact-0 1'"),
    ShellFact("cat"),  # reads stdin: gets /dev/null, not the next command
    ShellFact("exit 3", optional=True),
    ShellFact("printf '%s\\n' \"it's\" '$HOME' '`x`'"),  # quotes, no expansion
)


def test_a_batch_reads_every_fact_as_reading_it_alone() -> None:
    runner = LocalRunner()
    alone = [read_fact(runner, fact) for fact in TRICKY]
    assert read_facts(runner, TRICKY) == alone
    assert alone[1] == "a\0b\0" and alone[0] == "no newline at the end" and alone[7] == ""


def test_each_command_is_its_own_argv_never_reparsed() -> None:
    runner = LocalRunner()
    odd = ShellFact('printf \'%s|\' "$0" "$1"')
    (value,) = read_facts(runner, [odd])
    assert value == read_fact(runner, odd)


def test_a_failing_fact_fails_as_it_would_alone() -> None:
    runner = LocalRunner()
    failing = ShellFact("echo 'bad things' >&2; exit 4")
    with pytest.raises(CommandFailed) as alone:
        read_fact(runner, failing)
    with pytest.raises(CommandFailed) as batched:
        read_facts(runner, [ShellFact("true"), failing])
    assert str(batched.value) == str(alone.value)
    assert "bad things" in str(batched.value) and "exited 4" in str(batched.value)


class CutShort:
    """A runner whose session ends after the first command (the connection dropped)."""

    host = "node-1"

    def run(
        self, argv: object, *, stdin: bytes | None = None, timeout_s: float = 0
    ) -> CommandResult:
        real = LocalRunner().run(argv, timeout_s=timeout_s)  # type: ignore[arg-type]
        # cut before the second fact's frames
        out = real.stdout[: real.stdout.index(" 1\n")]
        err = real.stderr[: real.stderr.index(" 1\n")]
        return CommandResult(real.argv, 255, out, err, "node-1")


def test_a_batch_cut_short_names_the_fact_it_did_not_reach() -> None:
    with pytest.raises(ProbeFailed, match=r"node-1: the batched probe stopped before `sh -c true`"):
        read_facts(CutShort(), [ShellFact("echo first"), ShellFact("true")])  # type: ignore[arg-type]
