"""The one retry policy: backoff with jitter under Retry-After and a deadline, announced to
listeners; and the classification that decides which operations it may repeat."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kubernetes.client import ApiClient

import rollout.transports.kube.client as client
from rollout.retry import (
    REQUEST_POLICY,
    RetryEvent,
    RetryPolicy,
    call_with_policy,
    retry_kind,
    watch_retries,
)
from rollout.transports.errors import (
    Conflict,
    KubeUnreachable,
    ServerError,
    SshConnectError,
    TooManyRequests,
)
from rollout.transports.idempotence import (
    API_VERBS,
    Idempotence,
    classify_command,
    classify_request,
)
from rollout.transports.kube.calls import JsonCalls, retryable_blindly

IDEMPOTENT, CHECKED = Idempotence.IDEMPOTENT, Idempotence.CHECKED


@pytest.mark.parametrize(
    ("verb", "expected"),
    [
        ("get", IDEMPOTENT),
        ("list", IDEMPOTENT),
        ("read log of", IDEMPOTENT),
        ("patch", IDEMPOTENT),
        ("create", CHECKED),
        ("replace", CHECKED),
        ("evict", CHECKED),
        ("delete", CHECKED),
        ("frobnicate", CHECKED),  # unknown: never retried blindly
    ],
)
def test_api_requests_are_classified(verb: str, expected: Idempotence) -> None:
    assert classify_request(verb) is expected


def test_every_verb_the_client_uses_is_classified() -> None:
    source = Path(client.__file__).read_text()
    used = set(re.findall(r'request(?:_once)?\(\s*"([a-z ]+)"', source))
    used |= set(re.findall(r'guarded\(\s*"([a-z ]+)"', source))
    assert used and used <= API_VERBS.keys(), used - API_VERBS.keys()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["cat", "/etc/containerd/config.toml"], IDEMPOTENT),
        (["sha256sum", "--", "/a", "/b"], IDEMPOTENT),
        (["systemctl", "show", "containerd", "-p", "MainPID"], IDEMPOTENT),
        (["systemctl", "restart", "containerd"], CHECKED),
        (["/usr/bin/containerd", "--config", "/etc/c.toml", "config", "dump"], IDEMPOTENT),
        (["containerd", "--version"], IDEMPOTENT),
        (["find", "/etc/containerd", "-type", "f"], IDEMPOTENT),
        (["find", "/tmp", "-name", "x", "-delete"], CHECKED),
        (["sh", "-c", "script", "rollout-read", "/a"], IDEMPOTENT),
        (["sh", "-c", "script", "rollout-backup", "/a", "/b"], CHECKED),
        (["sh", "-c", "echo hi"], CHECKED),
        (["rm", "-f", "--", "/a"], CHECKED),
        (["tar", "-x", "-C", "/tmp/s", "-f", "-"], CHECKED),
        ([], CHECKED),
    ],
)
def test_remote_commands_are_classified(argv: list[str], expected: Idempotence) -> None:
    assert classify_command(argv) is expected


def test_waits_double_with_bounded_jitter_and_never_undercut_retry_after() -> None:
    policy = RetryPolicy(first_wait_s=1.0, max_wait_s=8.0, jitter=0.5)
    assert [policy.wait_s(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert policy.wait_s(2, rand=0.999) == pytest.approx(2.999)
    throttled = TooManyRequests("get", "node n1", status=429, reason="Too Many Requests")
    throttled.retry_after_s = 5
    assert policy.wait_s(1, throttled) == 5.0
    assert policy.wait_s(4, throttled, rand=0.5) == 10.0  # the backoff is longer


def test_retries_are_announced_with_their_kind_and_wait() -> None:
    errors: list[Exception] = [
        ServerError("get", "node n1", status=503, reason="Service Unavailable"),
        KubeUnreachable("get", "node n1", reason="API server unreachable", message="timed out"),
    ]
    events: list[RetryEvent] = []
    waits: list[float] = []

    def op() -> str:
        if errors:
            raise errors.pop(0)
        return "ok"

    policy = RetryPolicy(attempts=4, first_wait_s=0.5, jitter=0)
    with watch_retries(events.append):
        assert call_with_policy(op, policy, sleep=waits.append, operation="get node n1") == "ok"
    assert [(e.retry, e.kind, e.wait_s, e.operation) for e in events] == [
        (1, "api 503", 0.5, "get node n1"),
        (2, "api timeout", 1.0, "get node n1"),
    ]
    assert waits == [0.5, 1.0]
    assert "retry 1 of get node n1 in 0.5s after api 503" in events[0].describe()
    # outside the block, nobody listens
    call_with_policy(lambda: "ok", policy)
    assert len(events) == 2


def test_retry_kinds() -> None:
    assert retry_kind(SshConnectError("n1", "root@a:22", "connection lost")) == "ssh"
    assert retry_kind(Conflict("patch", "node n1", status=409, reason="Conflict")) == "api 409"
    unreachable = KubeUnreachable("get", "x", reason="API server unreachable", message="reset")
    assert retry_kind(unreachable) == "api unreachable"


def test_a_patch_retries_a_409_but_a_replace_does_not_blindly() -> None:
    conflict = Conflict("patch", "node n1", status=409, reason="Conflict")
    assert retryable_blindly("patch")(conflict)
    assert not retryable_blindly("get")(conflict)


def test_guarded_rechecks_before_each_retry_and_stops_when_done() -> None:
    policy = RetryPolicy(attempts=5, first_wait_s=0)
    calls = JsonCalls(ApiClient(), (1.0, 1.0), policy, sleep=lambda _: None)
    done: list[str] = []
    acts: list[int] = []

    def act() -> str:
        acts.append(1)
        done.append("effect")  # the effect happens, then the answer is lost
        raise KubeUnreachable("create", "pod d/p", reason="timed out", message="read timed out")

    def recheck(error: BaseException) -> str | None:
        return "found" if done else None

    assert calls.guarded("create", "pod d/p", act, recheck) == "found"
    assert len(acts) == 1  # never done twice


def test_request_policy_has_jitter_and_a_deadline() -> None:
    assert REQUEST_POLICY.jitter > 0 and REQUEST_POLICY.deadline_s <= 60


def test_an_error_a_final_policy_gave_up_on_is_not_retried_again_outside() -> None:
    attempts: list[int] = []

    def connect() -> str:
        attempts.append(1)
        raise SshConnectError("n1", "root@a:22", "cannot connect: Connection refused")

    inner = RetryPolicy(attempts=3, first_wait_s=0)
    outer = RetryPolicy(attempts=5, first_wait_s=0)

    def step() -> str:
        return call_with_policy(connect, inner, sleep=lambda _: None, final=True)

    with pytest.raises(SshConnectError) as raised:
        call_with_policy(step, outer, sleep=lambda _: None)
    assert raised.value.final and len(attempts) == 3  # not 3 x 5
