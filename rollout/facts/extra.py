"""Extra per-node facts some plans need (a driver upgrade's), read on every node at once and
set on its NodeFacts; a node that cannot be read fails the gathering, named.

Which fact a plan needs is decided here once, by the driver change's mode: `host` reads the
apt and module facts of the packages (rollout.facts.driver_host), `operator` the running
kernel the operator's driver container builds its module for (DriverKernelFact).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rollout.commands import CommandRunner
from rollout.errors import RolloutError
from rollout.facts.driver import DriverKernelFact
from rollout.facts.driver_host import read_driver_host
from rollout.facts.fact import ProbeFailed, read_fact
from rollout.facts.model import NodeFacts
from rollout.retry import retry_transient
from rollout.spec import DriverMode, Spec
from rollout.transports.fanout import run_on_nodes


def with_plan_facts(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int = 8,
) -> list[NodeFacts]:
    """The nodes with the extra facts the plan's changes need: host driver facts for a
    `mode: host` driver upgrade, the running kernel for `mode: operator`; unchanged otherwise."""
    change = spec.driver_upgrade
    if change is None:
        return list(nodes)
    match change.mode:
        case DriverMode.HOST:
            packages, version = change.apt_packages, change.version
            return with_node_fact(
                nodes,
                runners,
                "driver_host",
                lambda runner: read_driver_host(runner, packages, version),
                "the host driver facts",
                max_parallel,
            )
        case DriverMode.OPERATOR:
            return with_node_fact(
                nodes,
                runners,
                "driver_kernel",
                lambda runner: read_fact(runner, DriverKernelFact()),
                "the nodes' kernels",
                max_parallel,
            )


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
