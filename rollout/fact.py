"""The fact seam: one command and one pure parser per fact, and the one way to read a fact.

Live probing, the steps' drift checks and their verifications all read a fact through
`read_fact`, so a fact is never read two ways; recorded facts feed the same parsers.
`CommandFact` is the frame every fact is written in (rollout.facts and the engines' own facts,
rollout.driver): a fact states only its sentence, its command and its parser. It imports only
the foundation (commands, errors), so an engine below rollout.facts can state its facts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar

from rollout.commands import CommandResult, CommandRunner, check
from rollout.errors import RolloutError

T_co = TypeVar("T_co", covariant=True)
T = TypeVar("T")


class ProbeFailed(RolloutError):
    """A fact could not be read or parsed; the message names the node and the fact."""


class Fact(Protocol[T_co]):
    """A fact: the command that reads it and the pure parser of that command's output."""

    @property
    def what(self) -> str:
        """What reading it does, for messages: `read the containerd version`."""
        ...

    @property
    def optional(self) -> bool:
        """True when a failing command means `none` (parsed from empty output), not an error."""
        ...

    def command(self) -> list[str]:
        """The argv, run from the node's login directory; no shell parses any argument."""
        ...

    def parse(self, text: str, host: str) -> T_co:
        """The command's stdout -> the fact; ProbeFailed (or the engine's error) naming host."""
        ...


@dataclass(frozen=True)
class CommandFact(Generic[T]):
    """A Fact stated by what differs, as class attributes; the frame is written here once.

    - `sentence`: what reading it does, each `{field}` filled from the fact's own fields;
    - `argv`: its command (a command built from its fields overrides `command()`);
    - `parser`: the pure parser of the command's stdout (a fact whose parser needs the node or
      one of its fields overrides `parse`);
    - `optional`: true where a failing command means `none` (the parser reads empty
      output); false by default, so a failing command is an error unless a fact says so.
    A subclass with fields of its own is a frozen dataclass too.
    """

    sentence: ClassVar[str]
    argv: ClassVar[tuple[str, ...]]
    parser: ClassVar[staticmethod[[str], T]]
    optional: ClassVar[bool] = False

    @property
    def what(self) -> str:
        return self.sentence.format_map(vars(self))

    def command(self) -> list[str]:
        return list(self.argv)

    def parse(self, text: str, host: str) -> T:
        return self.parser(text)


class ShellFact(CommandFact[T]):
    """A fact read by one `sh -c` script, its `script`, in place of an argv."""

    script: ClassVar[str]

    def command(self) -> list[str]:
        return ["sh", "-c", self.script]


def fact_output(fact: Fact[object], result: CommandResult) -> str:
    """The text a fact's parser reads of its command's result: empty where the command of an
    optional fact failed; CommandFailed where another's did."""
    if not result.ok and fact.optional:
        return ""
    return check(result, fact.what).stdout


def read_output(runner: CommandRunner, fact: Fact[object]) -> str:
    """Run the fact's command on the runner's node: the text its parser reads."""
    return fact_output(fact, runner.run(fact.command()))


def read_fact(runner: CommandRunner, fact: Fact[T]) -> T:
    """Run the fact's command on the runner's node and parse its output."""
    return fact.parse(read_output(runner, fact), runner.host)
