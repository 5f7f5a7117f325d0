"""Fan-out over nodes: every outcome gathered in order, bounded parallelism, bugs raised."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from rollout.commands import CommandResult
from rollout.errors import RolloutError
from rollout.transports.errors import SshConnectError
from rollout.transports.fanout import close_runners, run_on_nodes


class FakeRunner:
    def __init__(self, name: str, delay_s: float = 0.0, error: Exception | None = None) -> None:
        self.name = name
        self.delay_s = delay_s
        self.error = error

    @property
    def host(self) -> str:
        return self.name

    def run(self, argv: Sequence[str], **options: object) -> CommandResult:
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return CommandResult(tuple(argv), 0, f"{self.name}\n", "", self.name)


def test_fan_out_gathers_results_and_errors_in_order() -> None:
    down = SshConnectError("n2", "root@10.0.0.2:22", "connection refused")
    runners = [FakeRunner("n1", 0.05), FakeRunner("n2", error=down), FakeRunner("n3")]
    outcomes = run_on_nodes(runners, lambda r: r.run(["hostname"]).stdout.strip(), max_parallel=3)
    assert list(outcomes) == ["n1", "n2", "n3"]
    assert outcomes["n1"] == "n1" and outcomes["n3"] == "n3"
    assert outcomes["n2"] is down


def test_fan_out_is_bounded() -> None:
    running = 0
    peak = 0
    lock = threading.Lock()

    def work(r: FakeRunner) -> str:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.02)
        with lock:
            running -= 1
        return r.host

    outcomes = run_on_nodes([FakeRunner(f"n{i}") for i in range(10)], work, max_parallel=3)
    assert len(outcomes) == 10
    assert peak <= 3


def test_fan_out_raises_bugs_after_everyone_finished() -> None:
    finished: list[str] = []

    def work(r: FakeRunner) -> str:
        if r.host == "n1":
            raise KeyError("a bug")
        time.sleep(0.05)
        finished.append(r.host)
        return r.host

    with pytest.raises(KeyError):
        run_on_nodes([FakeRunner("n1"), FakeRunner("n2")], work, max_parallel=2)
    assert finished == ["n2"]


def test_fan_out_refuses_duplicates_and_nonsense() -> None:
    with pytest.raises(ValueError):
        run_on_nodes([FakeRunner("n1"), FakeRunner("n1")], lambda r: r.host)
    with pytest.raises(ValueError):
        run_on_nodes([FakeRunner("n1")], lambda r: r.host, max_parallel=0)
    assert run_on_nodes([], lambda r: r.host) == {}


def test_every_outcome_error_is_a_rollout_error() -> None:
    outcomes = run_on_nodes([FakeRunner("n1", error=RolloutError("x"))], lambda r: r.run(["x"]))
    assert isinstance(outcomes["n1"], RolloutError)


def test_close_runners_closes_every_runner_of_a_list_or_a_mapping() -> None:
    closed: list[str] = []

    class Closing:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            closed.append(self.name)

    close_runners([Closing("a"), Closing("b")])
    close_runners({"c": Closing("c")})
    assert closed == ["a", "b", "c"]
