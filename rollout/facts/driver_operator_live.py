"""Facts gathered live for `mode: operator` plans: each node's running kernel, which the plan
shows beside the driver's from -> to (the operator's driver container builds its module for it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rollout.commands import CommandRunner
from rollout.errors import RolloutError
from rollout.facts.driver import DriverKernelFact
from rollout.facts.fact import ProbeFailed, read_fact
from rollout.facts.model import NodeFacts
from rollout.retry import retry_transient
from rollout.spec import DriverMode, DriverUpgradeChange, Spec
from rollout.transports.fanout import run_on_nodes


def with_operator_kernels(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int = 8,
) -> list[NodeFacts]:
    """The nodes with their kernel read (`driver_kernel`), where the spec upgrades the GPU
    Operator's driver; unchanged otherwise. A node that cannot be read fails the gathering."""
    change = next(iter(spec.changes_of(DriverUpgradeChange)), None)
    if change is None or change.mode is not DriverMode.OPERATOR:
        return list(nodes)
    wanted = [runners[n.name] for n in nodes if n.name in runners and n.driver_kernel is None]
    results = run_on_nodes(
        wanted,
        lambda runner: retry_transient(lambda: read_fact(runner, DriverKernelFact())),
        max_parallel=max_parallel,
    )
    failures = [f"{name}: {res}" for name, res in results.items() if isinstance(res, RolloutError)]
    if failures:
        raise ProbeFailed("could not read the nodes' kernels:\n  " + "\n  ".join(failures))
    return [
        dataclasses.replace(node, driver_kernel=found)
        if not isinstance(found := results.get(node.name), RolloutError | None)
        else node
        for node in nodes
    ]
