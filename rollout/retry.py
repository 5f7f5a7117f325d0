"""Retry policies: the one place rollout retries anything, and the only module using tenacity.

A policy retries only errors declared transient (rollout.errors.TransientError)
with exponential backoff and jitter, under both an attempt limit and a total deadline; every
other error raises at once, so a typo or a 403 is reported in milliseconds, not after a minute
of futile tries. A wait is never shorter than the server's Retry-After (an error's
`retry_after_s`). When the policy gives up, the last error is raised as it was, with a note
saying how long rollout kept trying.

Whether an *operation* may be repeated is its caller's decision (rollout.transports.
idempotence classifies every API call and remote command): only idempotent operations are
retried blindly; a non-idempotent one is retried only after a re-check of fresh state.

Every retry is announced to the listeners of `watch_retries` (progress lines, the run's
summary of retries per kind) before its wait.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import tenacity

from rollout.errors import RolloutError, TransientError

T = TypeVar("T")
P = ParamSpec("P")

Sleep = Callable[[float], None]


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: attempts, backoff (first wait doubling up to max_wait_s), deadline.

    The deadline counts from the first attempt: the policy gives up rather than sleep past
    it, so no attempt starts after it.
    """

    attempts: int = 5
    first_wait_s: float = 0.5
    max_wait_s: float = 10.0
    deadline_s: float = 60.0
    # Up to this fraction of each wait is added at random, so that many clients failed by one
    # fault do not all come back at the same instant.
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.first_wait_s < 0 or self.max_wait_s < 0 or self.deadline_s < 0:
            raise ValueError("waits and the deadline must not be negative")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter is a fraction of the wait, between 0 and 1")

    def wait_s(self, retry: int, error: BaseException | None = None, rand: float = 0.0) -> float:
        """The wait before retry number `retry` (1 is the first): backoff, jitter (`rand` in
        [0, 1)), and never less than the error's Retry-After."""
        backoff = min(self.first_wait_s * 2.0 ** (retry - 1), self.max_wait_s)
        backoff += backoff * self.jitter * rand
        return max(backoff, retry_after_of(error))


DEFAULT_POLICY = RetryPolicy(jitter=0.25)
# One API request or one idempotent remote command: quick first retries, a minute at most.
REQUEST_POLICY = RetryPolicy(
    attempts=6, first_wait_s=0.2, max_wait_s=5.0, deadline_s=60.0, jitter=0.5
)

ErrorFilter = Callable[[BaseException], bool]


def is_transient(error: BaseException) -> bool:
    """Whether a policy may retry after `error`: a transient error that no inner policy
    already gave up on (see call_with_policy's `final`)."""
    return isinstance(error, TransientError) and not error.final


def retry_after_of(error: BaseException | None) -> float:
    """The server's Retry-After carried by `error` (0 when none)."""
    value = getattr(error, "retry_after_s", None)
    if isinstance(value, int | float) and value > 0:
        return float(value)
    return 0.0


def retry_kind(error: BaseException) -> str:
    """How a retry is counted in the summary: `api 503`, `api unreachable`, `ssh`, ..."""
    if isinstance(error, RolloutError):
        return error.retry_kind()
    return type(error).__name__


# ------------------------------------------------------------------------------ listeners


@dataclass(frozen=True)
class RetryEvent:
    """One retry about to happen: what is retried, after which error, how long it waits."""

    operation: str
    retry: int  # 1 for the first retry
    wait_s: float
    error: BaseException

    @property
    def kind(self) -> str:
        return retry_kind(self.error)

    def describe(self) -> str:
        first_line = str(self.error).splitlines()[0] if str(self.error) else type(self.error)
        return (
            f"retry {self.retry} of {self.operation} in {self.wait_s:.1f}s "
            f"after {self.kind}: {first_line}"
        )


RetryListener = Callable[[RetryEvent], None]
_listeners: list[RetryListener] = []
_listeners_lock = threading.Lock()


@contextmanager
def watch_retries(listener: RetryListener) -> Iterator[None]:
    """Call `listener` with every retry any policy makes while the block runs."""
    with _listeners_lock:
        _listeners.append(listener)
    try:
        yield
    finally:
        with _listeners_lock:
            _listeners.remove(listener)


def _announce(event: RetryEvent) -> None:
    with _listeners_lock:
        listeners = list(_listeners)
    for listener in listeners:
        listener(event)


def describe_operation(op: Callable[..., object]) -> str:
    """A name for an operation without one: the function's qualified name."""
    target = op.func if isinstance(op, functools.partial) else op
    return str(getattr(target, "__qualname__", None) or repr(target))


def retry_transient(
    op: Callable[[], T],
    *,
    attempts: int = DEFAULT_POLICY.attempts,
    max_wait_s: float = DEFAULT_POLICY.max_wait_s,
    deadline_s: float = DEFAULT_POLICY.deadline_s,
    first_wait_s: float = DEFAULT_POLICY.first_wait_s,
    sleep: Sleep = time.sleep,
) -> T:
    """Call `op` until it returns, retrying transient errors only; raise the last error."""
    policy = RetryPolicy(
        attempts=attempts, first_wait_s=first_wait_s, max_wait_s=max_wait_s, deadline_s=deadline_s
    )
    return call_with_policy(op, policy, sleep=sleep)


def call_with_policy(
    op: Callable[[], T],
    policy: RetryPolicy,
    *,
    sleep: Sleep = time.sleep,
    operation: str | None = None,
    retry_on: ErrorFilter = is_transient,
    rand: Callable[[], float] = random.random,
    final: bool = False,
) -> T:
    """Call `op` under `policy`, retrying the errors `retry_on` accepts (transient ones);
    see retry_transient. `operation` names it in retry announcements. With `final`, an
    error the policy gave up on is marked so that no outer policy retries it again (a node
    that refused six fresh connections in a row is gone, not hiccuping: retrying the whole
    step five more times would only delay the halt)."""
    started = time.monotonic()
    name = operation or describe_operation(op)

    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome else None
        return policy.wait_s(state.attempt_number, error, rand())

    def announce(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        if error is not None:
            wait_s = state.next_action.sleep if state.next_action else 0.0
            _announce(RetryEvent(name, state.attempt_number, wait_s, error))

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(retry_on),
        stop=tenacity.stop_after_attempt(policy.attempts)
        | tenacity.stop_before_delay(policy.deadline_s),
        wait=wait,
        sleep=sleep,
        before_sleep=announce,
        reraise=True,
    )
    try:
        return retrying(op)
    except Exception as error:
        tries = retrying.statistics.get("attempt_number", 1)
        if tries > 1 and retry_on(error):
            error.add_note(f"(gave up after {tries} attempts in {time.monotonic() - started:.1f}s)")
            if final and isinstance(error, TransientError):
                error.final = True
        raise


def transient_retries(
    policy: RetryPolicy = DEFAULT_POLICY, *, sleep: Sleep = time.sleep
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorator form: `@transient_retries(RetryPolicy(attempts=3))` over a function."""

    def decorate(function: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            return call_with_policy(lambda: function(*args, **kwargs), policy, sleep=sleep)

        return wrapper

    return decorate
