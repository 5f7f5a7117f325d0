"""Extra per-node facts some plans need (a driver upgrade's), read on every node at once and
set on its NodeFacts; a node that cannot be read fails the gathering, named."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rollout.commands import CommandRunner
from rollout.errors import RolloutError
from rollout.facts.fact import ProbeFailed
from rollout.facts.model import NodeFacts
from rollout.retry import retry_transient
from rollout.transports.fanout import run_on_nodes


def with_node_fact(
    nodes: Sequence[NodeFacts],
    runners: Mapping[str, CommandRunner],
    field: str,
    read: Callable[[CommandRunner], Any],
    what: str,
    max_parallel: int,
) -> list[NodeFacts]:
    """Each node whose `field` is still None, with `read(runner)` set there, in parallel."""
    wanted = [runners[n.name] for n in nodes if n.name in runners and getattr(n, field) is None]
    results = run_on_nodes(
        wanted, lambda runner: retry_transient(lambda: read(runner)), max_parallel=max_parallel
    )
    failures = [f"{name}: {res}" for name, res in results.items() if isinstance(res, RolloutError)]
    if failures:
        raise ProbeFailed(f"could not read {what}:\n  " + "\n  ".join(failures))
    return [
        dataclasses.replace(node, **dict[str, Any]({field: found}))
        if not isinstance(found := results.get(node.name), RolloutError | None)
        else node
        for node in nodes
    ]
