"""The CommandRunner's `run`, written once for every runner: this package's and the tests'."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from rollout.commands import DEFAULT_TIMEOUT_S, CommandResult


class ArgvRunner(ABC):
    """A CommandRunner (rollout.commands) whose `run` hands the argv, as a tuple, to
    `run_argv`: the one part each runner does its own way."""

    @property
    @abstractmethod
    def host(self) -> str:
        """Where commands run, as CommandResult.host and messages show it."""

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> CommandResult:
        """Run argv; the result even for a non-zero exit (callers decide, with `check`)."""
        return self.run_argv(tuple(argv), stdin, timeout_s)

    @abstractmethod
    def run_argv(
        self, argv: tuple[str, ...], stdin: bytes | None, timeout_s: float
    ) -> CommandResult:
        """`run`, its argv a tuple: raises CommandTimeout when the command ran past
        timeout_s."""
