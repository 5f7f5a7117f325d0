"""The fact seam: one command and one pure parser per fact, and the one way to read a fact.

Live probing, the steps' drift checks and their verifications all read a fact through
`read_fact`, so a fact is never read two ways; recorded facts feed the same parsers.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from rollout.commands import CommandRunner, check
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


def read_fact(runner: CommandRunner, fact: Fact[T]) -> T:
    """Run the fact's command on the runner's node and parse its output."""
    result = runner.run(fact.command())
    if not result.ok and fact.optional:
        return fact.parse("", runner.host)
    return fact.parse(check(result, fact.what).stdout, runner.host)
