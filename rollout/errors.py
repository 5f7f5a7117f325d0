"""The one error tree of rollout.

Every error a user can see derives from RolloutError and carries an exit code, so the CLI
maps failures to exit codes in one place: 1 a node failed or the run halted, 2 bad input,
3 aborted.
"""

from __future__ import annotations

from dataclasses import dataclass


class ExitCode:
    OK = 0
    FAILED = 1
    BAD_INPUT = 2
    ABORTED = 3
    # apply/resume stopped at the end of the maintenance window; the next run continues
    WINDOW_CLOSED = 4
    # apply/resume stopped by `rollout pause`: the nodes in flight finished, none started
    PAUSED = 5
    # the output's reader went away (`| head`): a SIGPIPE death's status, said quietly
    READER_GONE = 141


class RolloutError(Exception):
    """Root of every error rollout raises on purpose."""

    exit_code: int = ExitCode.FAILED

    def retry_kind(self) -> str:
        """How a retry after this error is counted in a run's summary: `api 503`, `ssh`, ..."""
        return type(self).__name__


class TransientError(RolloutError):
    """A failure that may go away by itself: a refused connection, a 5xx, throttling.

    The marker of the errors worth retrying: a retry policy (rollout.retry) retries only
    those and raises every other error at once. The layer that raises an error declares it
    transient by deriving from this class (rollout.transports.errors does), so the retry
    policies know no transport. Whether an *operation* is safe to repeat stays the caller's
    decision; the marker only says the *failure* may go away by itself.
    """

    # Set once a retry policy gave up on it with `final`: an outer policy does not retry it.
    final: bool = False


class BadInput(RolloutError):
    """The user gave something rollout cannot use: a plan, an inventory, a facts directory."""

    exit_code = ExitCode.BAD_INPUT


@dataclass(frozen=True)
class SourceLocation:
    """Where in an input file something was found; line and column are 1-based."""

    path: str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.path
        if self.column is None:
            return f"{self.path}:{self.line}"
        return f"{self.path}:{self.line}:{self.column}"


class InputError(BadInput):
    """One problem in an input file, located to file:line:column and a field path."""

    # what the problem is about, shown between the location and the field ("node gpu-1: ")
    subject = ""

    def __init__(
        self,
        location: SourceLocation,
        message: str,
        *,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.location = location
        self.field = field
        self.message = message
        self.hint = hint
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{self.location}: {self.subject}"
        what = f"{self.field}: {self.message}" if self.field else self.message
        return where + what + (f"\n  hint: {self.hint}" if self.hint else "")


class InputErrors(BadInput):
    """Several problems found in one pass over an input, reported together."""

    def __init__(self, errors: list[InputError]) -> None:
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class Aborted(RolloutError):
    """The user declined, or interrupted, the run."""

    exit_code = ExitCode.ABORTED
