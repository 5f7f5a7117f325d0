"""Retry policies: the one place rollout retries anything, and the only module using tenacity.

A policy retries only errors declared transient (rollout.transports.errors.TransientError)
with exponential backoff, under both an attempt limit and a total deadline; every other
error raises at once, so a typo or a 403 is reported in milliseconds, not after a minute
of futile tries. When the policy gives up, the last error is raised as it was, with a note
saying how long rollout kept trying.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import tenacity

from rollout.transports.errors import TransientError

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

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.first_wait_s < 0 or self.max_wait_s < 0 or self.deadline_s < 0:
            raise ValueError("waits and the deadline must not be negative")


DEFAULT_POLICY = RetryPolicy()


def is_transient(error: BaseException) -> bool:
    """Whether a policy may retry after `error`."""
    return isinstance(error, TransientError)


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


def call_with_policy(op: Callable[[], T], policy: RetryPolicy, *, sleep: Sleep = time.sleep) -> T:
    """Call `op` under `policy`; see retry_transient."""
    started = time.monotonic()
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(is_transient),
        stop=tenacity.stop_after_attempt(policy.attempts)
        | tenacity.stop_before_delay(policy.deadline_s),
        wait=tenacity.wait_exponential(multiplier=policy.first_wait_s, max=policy.max_wait_s),
        sleep=sleep,
        reraise=True,
    )
    try:
        return retrying(op)
    except TransientError as error:
        tries = retrying.statistics.get("attempt_number", 1)
        if tries > 1:
            error.add_note(f"(gave up after {tries} attempts in {time.monotonic() - started:.1f}s)")
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
