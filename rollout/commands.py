"""Running commands: the result, the failure, and the runner seam.

The same code that predicts a containerd config runs on the operator's machine (tests,
offline checks) and on a node over SSH; it only ever sees a CommandRunner.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rollout.errors import RolloutError

DEFAULT_TIMEOUT_S = 60.0
TAIL_LINES = 20


@dataclass(frozen=True)
class CommandResult:
    """What one command did: its argv, where it ran, its exit code and output."""

    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    host: str = "local"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def tail(self, lines: int = TAIL_LINES) -> str:
        """The last lines of stderr, or of stdout when stderr is empty."""
        text = self.stderr.strip() or self.stdout.strip()
        return "\n".join(text.splitlines()[-lines:])


class CommandFailed(RolloutError):
    """A command exited non-zero where success was required."""

    def __init__(self, result: CommandResult, what: str | None = None) -> None:
        self.result = result
        head = f"{what}: " if what else ""
        tail = result.tail()
        super().__init__(
            f"{head}`{result.command_line}` on {result.host} exited {result.exit_code}"
            + (f"\n{_indent(tail)}" if tail else "")
        )


class CommandTimeout(RolloutError):
    """A command ran past its timeout and was stopped."""

    def __init__(self, argv: Sequence[str], host: str, timeout_s: float) -> None:
        self.argv = tuple(argv)
        self.host = host
        self.timeout_s = timeout_s
        super().__init__(f"`{shlex.join(argv)}` on {host} ran past {timeout_s:g}s and was stopped")


class CommandRunner(Protocol):
    """Runs one command (an argv, never a shell string) somewhere and returns its result.

    The runner never raises for a non-zero exit: callers decide, usually with `check`.
    """

    @property
    def host(self) -> str: ...

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CommandResult: ...


def check(result: CommandResult, what: str | None = None) -> CommandResult:
    """Return the result when the command succeeded, else raise CommandFailed."""
    if not result.ok:
        raise CommandFailed(result, what)
    return result


def _indent(text: str) -> str:
    return "\n".join("  | " + line for line in text.splitlines())
