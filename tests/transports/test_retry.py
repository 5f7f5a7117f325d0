"""Retry policies: only transient errors are retried, with backoff, under a deadline."""

from __future__ import annotations

import time

import pytest

from rollout.errors import RolloutError, TransientError
from rollout.retry import RetryPolicy, is_transient, retry_transient, transient_retries
from rollout.transports.errors import (
    Conflict,
    EvictionBlocked,
    HostKeyMismatch,
    KubeUnreachable,
    NotFound,
    ServerError,
    SshAuthError,
    SshConnectError,
    TooManyRequests,
)


class Flaky:
    """Fails with the given errors in turn, then returns "done"."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


def unreachable() -> KubeUnreachable:
    return KubeUnreachable("get", "node n1", reason="API server unreachable", message="refused")


def test_transient_errors_are_retried_with_exponential_backoff() -> None:
    waits: list[float] = []
    op = Flaky(unreachable(), unreachable(), unreachable())
    result = retry_transient(op, attempts=5, first_wait_s=0.5, max_wait_s=10, sleep=waits.append)
    assert result == "done"
    assert op.calls == 4
    assert waits == [0.5, 1.0, 2.0]


def test_waits_are_capped_at_max_wait() -> None:
    waits: list[float] = []
    op = Flaky(*(unreachable() for _ in range(5)))
    retry_transient(op, attempts=6, first_wait_s=1, max_wait_s=3, sleep=waits.append)
    assert waits == [1, 2, 3, 3, 3]


@pytest.mark.parametrize(
    "error",
    [
        NotFound("get", "node n1", status=404, reason="Not Found"),
        Conflict("replace", "lease kube-system/rollout", status=409, reason="Conflict"),
        SshAuthError("n1", "root@10.0.0.1:22", "authentication failed"),
        HostKeyMismatch("n1", "root@10.0.0.1:22", "kh", "10.0.0.1", "ssh-ed25519", "A", "B"),
        RolloutError("a plain error"),
        ValueError("a bug"),
    ],
)
def test_permanent_errors_raise_at_once(error: Exception) -> None:
    waits: list[float] = []
    op = Flaky(error)
    with pytest.raises(type(error)) as raised:
        retry_transient(op, attempts=5, sleep=waits.append)
    assert raised.value is error
    assert op.calls == 1
    assert waits == []


def test_the_last_error_is_raised_after_the_last_attempt_with_a_note() -> None:
    errors = [unreachable() for _ in range(3)]
    op = Flaky(*errors)
    with pytest.raises(KubeUnreachable) as raised:
        retry_transient(op, attempts=3, sleep=lambda _: None)
    assert raised.value is errors[-1]
    assert op.calls == 3
    assert any("gave up after 3 attempts" in n for n in raised.value.__notes__)


def test_the_deadline_stops_retries_before_the_attempts_run_out() -> None:
    op = Flaky(*(unreachable() for _ in range(100)))
    started = time.monotonic()
    with pytest.raises(KubeUnreachable):
        retry_transient(op, attempts=100, first_wait_s=0.05, max_wait_s=0.05, deadline_s=0.3)
    elapsed = time.monotonic() - started
    # the deadline, not the 100 attempts (5 s of waits), ended it: a bound with room for a
    # loaded machine (CI runs three test processes on two cores), the count below is exact
    assert elapsed < 2.0
    assert 2 <= op.calls <= 7


def test_a_transient_then_a_permanent_error_stops_at_the_permanent_one() -> None:
    missing = NotFound("get", "pod d/p", status=404, reason="Not Found")
    op = Flaky(unreachable(), missing)
    with pytest.raises(NotFound):
        retry_transient(op, attempts=5, sleep=lambda _: None)
    assert op.calls == 2


def test_the_decorator_applies_a_policy() -> None:
    calls: list[int] = []

    @transient_retries(RetryPolicy(attempts=3, first_wait_s=0), sleep=lambda _: None)
    def fetch(value: int) -> int:
        calls.append(value)
        if len(calls) < 3:
            raise SshConnectError("n1", "root@10.0.0.1:22", "connection refused")
        return value * 2

    assert fetch(21) == 42
    assert calls == [21, 21, 21]


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (unreachable(), True),
        (ServerError("get", "node n1", status=503, reason="Service Unavailable"), True),
        (TooManyRequests("list", "pods", status=429, reason="Too Many Requests"), True),
        (
            EvictionBlocked(
                "evict", "pod d/p", status=429, reason="Too Many Requests", message="", pdb="web"
            ),
            True,
        ),
        (SshConnectError("n1", "root@10.0.0.1:22", "connection reset"), True),
        (SshAuthError("n1", "root@10.0.0.1:22", "authentication failed"), False),
        (NotFound("get", "node n1", status=404), False),
        (RuntimeError("x"), False),
    ],
)
def test_what_counts_as_transient(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient
    assert isinstance(error, TransientError) is transient


def test_a_policy_refuses_nonsense() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(attempts=0)
