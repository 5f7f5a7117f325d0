"""The run lock through the API emulator: one holder at a time, expiry, own-run takeover."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from rollout.lease import LeaseHeld, RunLease, run_identity
from rollout.transports.errors import NotFound
from rollout.transports.kube import KubeClient, Lease
from tests.emulator import emulated_kube


@pytest.fixture()
def kube() -> Iterator[KubeClient]:
    with emulated_kube(None, "kube-system") as client:
        yield client


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def test_second_run_is_refused_while_the_first_holds(kube: KubeClient) -> None:
    first = RunLease(kube, "rollout/run-a", renew_every_s=3600)
    first.acquire()
    try:
        with pytest.raises(LeaseHeld, match="held by rollout/run-a"):
            RunLease(kube, "rollout/run-b", renew_every_s=3600).acquire()
    finally:
        first.release()
    # released: the next run starts at once
    second = RunLease(kube, "rollout/run-b", renew_every_s=3600)
    second.acquire()
    assert kube.get_lease("kube-system", "rollout").holder_identity == "rollout/run-b"
    second.release()


def test_a_dead_runs_lease_expires(kube: KubeClient) -> None:
    clock = Clock()
    dead = RunLease(kube, "rollout/run-a", duration_s=60, renew_every_s=3600, clock=clock)
    dead.acquire()  # never renewed nor released: the process died
    clock.now += timedelta(seconds=30)
    with pytest.raises(LeaseHeld, match="expires at"):
        RunLease(kube, "rollout/run-b", clock=clock, renew_every_s=3600).acquire()
    clock.now += timedelta(seconds=61)
    taker = RunLease(kube, "rollout/run-b", clock=clock, renew_every_s=3600)
    taker.acquire()
    lease = kube.get_lease("kube-system", "rollout")
    assert lease.holder_identity == "rollout/run-b" and lease.lease_transitions == 1
    taker.release()


def test_resume_of_the_same_run_takes_its_own_lease_back(kube: KubeClient) -> None:
    RunLease(kube, "rollout/run-a", renew_every_s=3600).acquire()  # killed with -9
    again = RunLease(kube, "rollout/run-a", renew_every_s=3600)
    again.acquire()
    again.release()


def test_renewal_keeps_the_lease_and_a_stolen_lease_is_noticed(kube: KubeClient) -> None:
    clock = Clock()
    lease = RunLease(kube, "rollout/run-a", renew_every_s=3600, clock=clock)
    lease.acquire()
    clock.now += timedelta(seconds=20)
    lease.renew()
    assert kube.get_lease("kube-system", "rollout").renew_time == clock.now
    lease.check()
    current = kube.get_lease("kube-system", "rollout")
    kube.replace_lease(replace(current, holder_identity="someone-else"))
    lease.renew()
    with pytest.raises(LeaseHeld, match="taken by another run"):
        lease.check()
    lease.release()


def test_a_block_holds_the_lease_and_gives_it_back_even_on_error(kube: KubeClient) -> None:
    class Boom(Exception):
        pass

    lease = RunLease(kube, run_identity("20261129-231500-p-ab12"), renew_every_s=3600)
    with pytest.raises(Boom), lease:
        holder = kube.get_lease("kube-system", "rollout").holder_identity
        assert holder == "rollout/20261129-231500-p-ab12"
        raise Boom
    assert kube.get_lease("kube-system", "rollout").holder_identity == ""


def test_a_refused_block_never_runs(kube: KubeClient) -> None:
    first = RunLease(kube, run_identity("run-a"), renew_every_s=3600)
    first.acquire()
    ran = False
    try:
        with pytest.raises(LeaseHeld), RunLease(kube, run_identity("run-b"), renew_every_s=3600):
            ran = True
    finally:
        first.release()
    assert not ran


def test_losing_the_race_to_create_names_the_winner(
    kube: KubeClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs found no lease and both created one: the loser says who won."""
    winner = RunLease(kube, "rollout/run-a/pod-a", renew_every_s=3600)
    winner.acquire()
    read = kube.get_lease
    calls: list[str] = []

    def first_read_finds_none(namespace: str, name: str) -> Lease:
        calls.append(name)
        if len(calls) == 1:  # read before the winner's create landed
            raise NotFound("get", f"lease kube-system/{name}", status=404)
        return read(namespace, name)

    monkeypatch.setattr(kube, "get_lease", first_read_finds_none)
    try:
        with pytest.raises(LeaseHeld, match="taken just now by rollout/run-a/pod-a"):
            RunLease(kube, "rollout/run-a/pod-b", renew_every_s=3600).acquire()
    finally:
        monkeypatch.undo()
        winner.release()
