"""Fact gathering's progress: the tally, the line on a terminal and elsewhere, and every
node's outcome told as it finishes (rollout.facts.progress, rollout.transports.fanout)."""

from __future__ import annotations

import io
import threading

import pytest

from rollout.closeable import Closeable
from rollout.errors import RolloutError
from rollout.facts import live
from rollout.facts.live import gather_fleet_facts
from rollout.facts.progress import GatherTally, StreamProgress
from rollout.spec.plan import parse_spec
from rollout.transports.fanout import run_on_nodes
from tests.examples import PLAN
from tests.unit.test_live_gathering import Kube, probe_waiting_for


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Named:
    def __init__(self, host: str) -> None:
        self.host = host

    def run(self, *args: object, **kwargs: object) -> object:
        raise NotImplementedError


def test_the_tally_counts_answered_failed_and_left_with_a_rate() -> None:
    tally = GatherTally(total=10)
    for elapsed, ok in ((1.0, True), (1.5, True), (2.0, False), (4.0, True)):
        tally = tally.with_node(ok, elapsed)
    assert (tally.answered, tally.failed, tally.left) == (3, 1, 6)
    assert tally.rate == pytest.approx(1.0)
    assert tally.to_line() == "facts: 3/10 answered, 1 failed, 6 left, 1.0 nodes/s"
    assert tally.to_final_line() == "facts: 3/10 answered, 1 failed in 4.0s (1.0 nodes/s)"


def test_no_rate_before_a_tenth_of_a_second() -> None:
    assert GatherTally(total=2).with_node(True, 0.0).rate == 0.0


def test_off_a_terminal_only_the_final_line_is_written() -> None:
    stream, clock = io.StringIO(), FakeClock()
    progress = StreamProgress(stream, 3, terminal=False, clock=clock)
    for name, ok in (("a", True), ("b", False), ("c", True)):
        clock.now += 1.0
        progress.node_done(name, ok)
    assert stream.getvalue() == ""
    progress.finish()
    assert stream.getvalue() == "facts: 2/3 answered, 1 failed in 3.0s (1.0 nodes/s)\n"


def test_on_a_terminal_one_line_is_redrawn_at_most_every_fifth_of_a_second() -> None:
    stream, clock = io.StringIO(), FakeClock()
    progress = StreamProgress(stream, 4, terminal=True, clock=clock)
    clock.now += 1.0
    progress.node_done("a", True)  # drawn
    clock.now += 0.05
    progress.node_done("b", True)  # too soon: not drawn
    clock.now += 0.95
    progress.node_done("c", False)  # drawn
    progress.finish()
    draws = stream.getvalue().split("\r\x1b[K")
    assert draws == [
        "",
        "facts: 1/4 answered, 0 failed, 3 left, 1.0 nodes/s",
        "facts: 2/4 answered, 1 failed, 1 left, 1.5 nodes/s",
        "facts: 2/4 answered, 1 failed in 2.0s (1.5 nodes/s)\n",
    ]
    assert "\n" not in "".join(draws[:-1])


def test_fan_out_tells_each_outcome_as_it_finishes_and_the_failures_come_back_together() -> None:
    runners = [Named(f"node-{i}") for i in range(12)]
    told: dict[str, bool] = {}
    lock = threading.Lock()

    def probe(runner: Named) -> str:
        if runner.host in ("node-3", "node-8"):
            raise RolloutError(f"{runner.host}: cannot connect")
        return runner.host.upper()

    def on_done(name: str, outcome: str | RolloutError) -> None:
        with lock:
            told[name] = not isinstance(outcome, RolloutError)

    results = run_on_nodes(runners, probe, max_parallel=4, on_done=on_done)
    assert told == {f"node-{i}": i not in (3, 8) for i in range(12)}
    failed = [name for name, r in results.items() if isinstance(r, RolloutError)]
    assert failed == ["node-3", "node-8"]
    assert results["node-0"] == "NODE-0"


class ClosingRunner(Closeable):
    def __init__(self, host: str) -> None:
        self.host = host
        self.closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("release", [True, False])
def test_a_plans_gathering_closes_each_nodes_connection_once_read(
    monkeypatch: pytest.MonkeyPatch, release: bool
) -> None:
    """An idle paramiko connection keeps a thread waking ten times a second: a thousand of
    them starved the nodes still being probed (measured on 1,000 lab endpoints)."""
    kube = Kube()
    monkeypatch.setattr(live, "probe_node", probe_waiting_for(kube))
    spec = parse_spec(PLAN.read_text(), str(PLAN))
    runners = {name: ClosingRunner(name) for name in ("n1", "n2", "n3")}
    progress = StreamProgress(io.StringIO(), 3, terminal=False)
    gather_fleet_facts(spec, runners, kube, progress=progress, release=release)  # type: ignore[arg-type]
    assert [r.closed for r in runners.values()] == [release] * 3
    assert (progress.tally.answered, progress.tally.failed) == (3, 0)
