"""The nodes of a wave in parallel, with fake steps that take time and a fake cluster watched
from outside: the budget is never exceeded, journal records of concurrent nodes fold to the
same state in any interleaving, and a failure on one node of a parallel wave ends as each
on_failure policy says."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from rollout.executor import Executor
from rollout.plan import StepPlan
from rollout.run import Entry, Journal, NodeOutcome, RunOutcome, RunStarted, read_journal
from rollout.run.state import Fold
from rollout.steps.base import StepContext, StepFailed, StepResult
from tests.examples import PLAN
from tests.sampler import sampling
from tests.unit.test_executor import KINDS, FakeCluster, FakeStep, Log, make_executor, setup

NODES = ("gpu-a-1", "gpu-a-2", "gpu-a-3", "gpu-b-1")
STEP_S = 0.03


def plan_text(*, waves: str = "[4]", max_unavailable: int = 4, on_failure: str = "rollback") -> str:
    text = PLAN.read_text()
    text = text.replace('waves: [1, "50%"]', f"waves: {waves}")
    text = text.replace("max_unavailable: 1", f"max_unavailable: {max_unavailable}")
    return text.replace("on_failure: rollback", f"on_failure: {on_failure}")


class SlowStep(FakeStep):
    """A fake step that takes STEP_S, and notes how many nodes run a step at the same time."""

    running = 0
    most_running = 0
    lock = threading.Lock()

    def apply(self, ctx: StepContext) -> StepResult:
        with SlowStep.lock:
            SlowStep.running += 1
            SlowStep.most_running = max(SlowStep.most_running, SlowStep.running)
        try:
            time.sleep(STEP_S)
            return super().apply(ctx)
        finally:
            with SlowStep.lock:
                SlowStep.running -= 1


@pytest.fixture(autouse=True)
def _reset_counts() -> None:
    SlowStep.running = SlowStep.most_running = 0


def slow_setup(
    tmp_path: Path, text: str, fail_on: set[str] | None = None
) -> tuple[Executor, FakeCluster, Log, Journal, dict[str, Any]]:
    plan, spec, cluster, log, journal, _ = setup(tmp_path, spec_text=text)
    steps: dict[str, Any] = {k: SlowStep(k, log, cluster, fail_on or set()) for k in KINDS}
    return make_executor(plan, spec, cluster, journal, steps), cluster, log, journal, steps


@contextmanager
def watch_unavailable(cluster: FakeCluster) -> Iterator[list[int]]:
    """Poll the cluster from another thread, as an operator's kubectl would; yields the counts."""
    with sampling(
        lambda: [sum(1 for n in list(cluster.nodes.values()) if n.unschedulable)], 0.001
    ) as seen:
        yield seen


def test_a_wave_runs_its_nodes_at_once_up_to_max_unavailable(tmp_path: Path) -> None:
    executor, cluster, log, _journal, _ = slow_setup(tmp_path, plan_text(max_unavailable=2))
    with watch_unavailable(cluster) as seen:
        report = executor.run()
    assert report.outcome is RunOutcome.SUCCEEDED
    assert max(seen) == 2  # the budget, used and never exceeded
    # two nodes' steps ran at the same moment (counted, not timed: a timed bound fails on a
    # loaded machine, and speed is bench/'s)
    assert SlowStep.most_running == 2
    for node in NODES:
        assert [k for verb, n, k in log.calls if n == node] == list(KINDS)


def test_the_budget_counts_a_target_cordoned_by_someone_else(tmp_path: Path) -> None:
    executor, cluster, log, _journal, _ = slow_setup(tmp_path, plan_text(max_unavailable=2))
    cluster.nodes["gpu-b-1"].unschedulable = True  # cordoned by hand: one slot is gone
    with watch_unavailable(cluster) as seen:
        report = executor.run()
    assert report.outcome is RunOutcome.SUCCEEDED
    assert max(seen) == 2
    # the one slot left: gpu-a-1, -2, -3 one after another; gpu-b-1 (its own slot already
    # taken) may run beside gpu-a-3
    order = [n for _, n, _ in log.calls]

    def span(node: str) -> tuple[int, int]:
        return order.index(node), len(order) - 1 - order[::-1].index(node)

    assert span("gpu-a-1")[1] < span("gpu-a-2")[0]
    assert span("gpu-a-2")[1] < span("gpu-a-3")[0]
    assert span("gpu-a-2")[1] < span("gpu-b-1")[0]


def test_nodes_not_taken_down_need_no_slot(tmp_path: Path) -> None:
    # gpu-b-1 is cordoned by hand and the budget is 1, yet nodes that are never cordoned
    # (every step a no-op here) still run, all at once
    executor, cluster, log, _journal, steps = slow_setup(tmp_path, plan_text(max_unavailable=1))
    plan = executor.plan

    def idle(node: Any) -> Any:
        return dataclasses.replace(
            node, steps=tuple(StepPlan.skipping(s.kind, "nothing to do") for s in node.steps)
        )

    waves = tuple(dataclasses.replace(w, nodes=tuple(idle(n) for n in w.nodes)) for w in plan.waves)
    quiet = dataclasses.replace(plan, waves=waves)
    executor = make_executor(quiet, executor.spec, cluster, executor.journal, steps)
    cluster.nodes["gpu-b-1"].unschedulable = True
    report = executor.run()
    assert report.outcome is RunOutcome.SUCCEEDED
    assert log.calls == []  # no-op steps are not applied


def test_interleaved_records_of_concurrent_nodes_fold_to_the_same_state(tmp_path: Path) -> None:
    fail = {"gpu-a-3/gpu.wait"}  # one node also rolls back: step-undone records interleave too
    executor, _cluster, _log, journal, _ = slow_setup(
        tmp_path, plan_text(max_unavailable=4), fail_on=fail
    )
    executor.run()
    entries = journal.entries()
    # really interleaved: some node's records are not contiguous in the journal
    nodes = [getattr(e.record, "node", "") for e in entries if getattr(e.record, "node", "")]
    runs = [n for i, n in enumerate(nodes) if i == 0 or nodes[i - 1] != n]
    assert len(runs) > len(set(nodes))  # some node's records are split by another's
    expected = journal.replay()
    on_disk = read_journal(journal.path)
    assert on_disk.entries == entries  # the file holds the records in the order appended
    head, *body = entries
    assert isinstance(head.record, RunStarted)
    per_node: dict[str, list[Entry]] = {}
    tail: list[Entry] = []
    for entry in body:
        node = getattr(entry.record, "node", "")
        (per_node.setdefault(node, []) if node else tail).append(entry)
    rng = random.Random(13)
    for _ in range(50):
        queues = {n: list(es) for n, es in per_node.items()}
        order: list[Entry] = []
        while queues:
            node = rng.choice(sorted(queues))
            order.append(queues[node].pop(0))
            if not queues[node]:
                del queues[node]
        fold = Fold()
        for seq, entry in enumerate([head, *order, *tail], start=1):
            fold.apply(Entry(seq=seq, at=entry.at, record=entry.record))
        state = fold.freeze()
        for node in NODES:
            assert state.node(node) == expected.node(node)
        assert (state.outcome, state.halted_reason) == (expected.outcome, expected.halted_reason)


def test_rollback_policy_a_failure_rolls_that_node_back_and_the_others_finish(
    tmp_path: Path,
) -> None:
    executor, cluster, log, _journal, _ = slow_setup(
        tmp_path, plan_text(max_unavailable=4), fail_on={"gpu-a-2/systemd.restart"}
    )
    with watch_unavailable(cluster) as seen:
        report = executor.run()
    assert max(seen) <= 4
    assert SlowStep.most_running == 4
    assert report.outcome is RunOutcome.HALTED
    assert "failure budget of 0" in report.halt_reason
    assert report.nodes["gpu-a-2"] == ("rolled-back", "gpu-a-2: systemd.restart: injected failure")
    for node in ("gpu-a-1", "gpu-a-3", "gpu-b-1"):
        assert report.nodes[node][0] == "succeeded"  # already in flight: they finish
    undone = [k for verb, n, k in log.calls if verb == "undo" and n == "gpu-a-2"]
    assert undone == ["containerd.write", "drain", "cordon", "gates.baseline", "preflight"]
    assert not any(n.unschedulable for n in cluster.nodes.values())


def test_rollback_policy_no_node_starts_after_the_budget_is_exceeded(tmp_path: Path) -> None:
    # two waves of two; a failure in the first halts the run before the second wave
    executor, _cluster, log, _journal, _ = slow_setup(
        tmp_path, plan_text(waves="[2]", max_unavailable=2), fail_on={"gpu-a-1/drain"}
    )
    report = executor.run()
    assert report.outcome is RunOutcome.HALTED
    assert report.nodes["gpu-a-1"][0] == "rolled-back"
    assert report.nodes["gpu-a-2"][0] == "succeeded"
    assert report.nodes["gpu-a-3"][0] == report.nodes["gpu-b-1"][0] == "pending"
    assert not [c for c in log.calls if c[1] in ("gpu-a-3", "gpu-b-1")]


def test_a_failure_within_the_failure_budget_lets_the_run_go_on(tmp_path: Path) -> None:
    text = plan_text(waves="[2]", max_unavailable=2).replace(
        "on_failure: rollback", "on_failure: rollback\n  failure_budget: 1"
    )
    executor, _cluster, _log, _journal, _ = slow_setup(tmp_path, text, fail_on={"gpu-a-1/drain"})
    report = executor.run()
    assert report.outcome is RunOutcome.FAILED  # finished, with one failed node
    assert report.nodes["gpu-a-1"][0] == "rolled-back"
    assert [report.nodes[n][0] for n in NODES[1:]] == ["succeeded"] * 3


def test_halt_policy_a_failure_stops_the_others_before_their_next_step(tmp_path: Path) -> None:
    executor, cluster, log, journal, steps = slow_setup(
        tmp_path,
        plan_text(max_unavailable=4, on_failure="halt"),
        fail_on={"gpu-a-2/systemd.restart"},
    )
    with watch_unavailable(cluster) as seen:
        report = executor.run()
    assert max(seen) <= 4
    assert report.outcome is RunOutcome.HALTED
    assert report.nodes["gpu-a-2"][0] == "failed"
    assert not [c for c in log.calls if c[0] == "undo"]
    assert cluster.nodes["gpu-a-2"].unschedulable  # left as it is, as the policy says
    state = journal.replay()
    for node in ("gpu-a-1", "gpu-a-3", "gpu-b-1"):
        assert report.nodes[node][0] == "pending"
        ns = state.node(node)
        assert ns.in_flight is None  # stopped between steps, never in the middle of one
        assert 0 < len(ns.completed) < len(KINDS)
        assert cluster.nodes[node].unschedulable  # cordoned, waiting for resume
    # resume finishes the stopped nodes; the failed one stays failed
    journal.close()
    resumed = Journal.open(tmp_path, journal.run_id)
    plan, spec = executor.plan, executor.spec
    again = make_executor(plan, spec, cluster, resumed, steps).run()
    assert again.outcome is RunOutcome.FAILED
    assert again.nodes["gpu-a-2"][0] == "failed"
    assert [again.nodes[n][0] for n in ("gpu-a-1", "gpu-a-3", "gpu-b-1")] == ["succeeded"] * 3
    for node in ("gpu-a-1", "gpu-a-3", "gpu-b-1"):
        applied = [k for verb, n, k in log.calls if verb == "apply" and n == node]
        assert applied == list(KINDS)  # every step exactly once across the two runs


def test_a_lost_lease_stops_every_node_before_its_next_step(tmp_path: Path) -> None:
    executor, _cluster, log, _journal, _ = slow_setup(tmp_path, plan_text(max_unavailable=4))

    class Lease:
        lost_after = time.monotonic() + 3 * STEP_S

        def check(self) -> None:
            if time.monotonic() > self.lost_after:
                raise StepFailed("-", "lease", "lease kube-system/rollout was taken by another run")

    executor.lease = Lease()
    report = executor.run()
    assert report.outcome is RunOutcome.HALTED
    assert "taken by another run" in report.halt_reason
    assert all(outcome == "pending" for outcome, _ in report.nodes.values())
    assert all(len([c for c in log.calls if c[1] == n]) < len(KINDS) for n in NODES)


def test_killed_during_a_parallel_wave_resume_converges(tmp_path: Path) -> None:
    executor, cluster, log, journal, steps = slow_setup(tmp_path, plan_text(max_unavailable=4))

    class Killed(BaseException):
        pass

    real_apply = steps["containerd.verify"].apply

    def dying(ctx: StepContext) -> StepResult:
        if ctx.node == "gpu-a-3" and not any(c == ("apply", "gpu-a-3", "*") for c in log.calls):
            log.calls.append(("apply", "gpu-a-3", "*"))
            raise Killed
        return real_apply(ctx)

    steps["containerd.verify"].apply = dying
    with pytest.raises(Killed):
        executor.run()
    state = journal.replay()
    assert state.node("gpu-a-3").in_flight is not None  # died inside the step
    assert all(state.node(n).outcome is None for n in NODES)  # the others stopped, unfinished
    journal.close()
    resumed = Journal.open(tmp_path, journal.run_id)
    report = make_executor(executor.plan, executor.spec, cluster, resumed, steps).run()
    assert report.outcome is RunOutcome.SUCCEEDED
    assert not any(n.unschedulable for n in cluster.nodes.values())
    for node in NODES:
        applied = [k for verb, n, k in log.calls if verb == "apply" and n == node and k != "*"]
        assert sorted(set(applied)) == sorted(KINDS)
        # at most the step in flight is applied twice
        assert len(applied) <= len(KINDS) + 1
    final = resumed.replay()
    assert all(final.node(n).outcome is NodeOutcome.SUCCEEDED for n in NODES)


def test_the_live_table_of_a_big_wave_lists_the_nodes_at_work_and_counts_the_rest() -> None:
    import io

    from rollout.cli.render import LiveProgress, make_console

    out = io.StringIO()
    names = [f"gpu-{i:03d}" for i in range(200)]
    progress = LiveProgress(make_console(out, color=False), dict.fromkeys(names, 1))
    with progress:
        for name in names[:150]:
            progress.node_started(1, name)
            progress.step_started(name, "drain")
        for name in names[:140]:
            progress.node_finished(name, "succeeded", "")
        progress.node_finished(names[140], "rolled-back", "gpu-140: drain: injected")
    final = out.getvalue().split("rollout apply")[-1]
    assert "140 succeeded, 50 pending, 10 shown of 200 nodes" in final
    assert "gpu-140" in final and "rolled-back" in final and "gpu-149" in final
    assert "gpu-000" not in final and "gpu-199" not in final


def test_the_kube_client_keeps_a_connection_for_every_node_thread() -> None:
    # urllib3 keeps 10 by default and logs a warning for each connection dropped past them
    from rollout.executor import MAX_PARALLEL
    from rollout.transports.kube.config import url_configuration

    assert url_configuration("http://127.0.0.1:1").connection_pool_maxsize > MAX_PARALLEL
