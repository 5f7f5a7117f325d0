"""Fan-out: one call per node, at most N at once, every node's result or error gathered."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from rollout.commands import CommandRunner
from rollout.errors import RolloutError

R = TypeVar("R", bound=CommandRunner)
T = TypeVar("T")


class Closable(Protocol):
    """A runner that holds a connection."""

    def close(self) -> None: ...


def run_on_nodes(
    runners: Sequence[R],
    fn: Callable[[R], T],
    max_parallel: int = 10,
    on_done: Callable[[str, T | RolloutError], None] | None = None,
) -> dict[str, T | RolloutError]:
    """Call fn(runner) for every runner, at most max_parallel at once; gather every outcome.

    The result maps each runner's node (runner.host), in the order given, to what fn
    returned or the RolloutError it raised, so one unreachable node does not hide the
    others. Any other exception is a bug: it is raised once every node has finished.
    on_done(node, outcome) is called as each node finishes, from that node's thread.
    """
    if max_parallel < 1:
        raise ValueError("max_parallel must be at least 1")
    names = [r.host for r in runners]
    if len(set(names)) != len(names):
        raise ValueError(f"a node appears twice among the runners: {names}")
    outcomes: dict[str, T | RolloutError] = {}
    if not runners:
        return outcomes
    bugs: list[BaseException] = []

    def call(runner: R) -> T | RolloutError:
        outcome: T | RolloutError
        try:
            outcome = fn(runner)
        except RolloutError as error:
            outcome = error
        if on_done is not None:
            on_done(runner.host, outcome)
        return outcome

    with ThreadPoolExecutor(
        max_workers=min(max_parallel, len(runners)), thread_name_prefix="rollout-node"
    ) as pool:
        futures = [(r.host, pool.submit(call, r)) for r in runners]
        for name, future in futures:
            try:
                outcomes[name] = future.result()
            except Exception as exc:
                bugs.append(exc)
    if bugs:
        raise bugs[0]
    return outcomes


def close_runners(runners: Mapping[str, Closable] | Sequence[Closable]) -> None:
    """Close every runner's connection."""
    for runner in runners.values() if isinstance(runners, Mapping) else runners:
        runner.close()
