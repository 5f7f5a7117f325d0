"""Host driver facts gathered live, for plans that install a driver with apt (`mode: host`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from rollout.commands import CommandRunner
from rollout.errors import RolloutError
from rollout.facts.driver_host import read_driver_host
from rollout.facts.fact import ProbeFailed
from rollout.facts.model import NodeFacts
from rollout.retry import retry_transient
from rollout.spec import DriverMode, DriverUpgradeChange, Spec
from rollout.transports.fanout import run_on_nodes


def with_driver_hosts(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int = 8,
) -> list[NodeFacts]:
    """The nodes with their host driver facts, where the spec installs a driver on the host;
    unchanged otherwise. A node whose facts cannot be read fails the gathering, named."""
    change = next(iter(spec.changes_of(DriverUpgradeChange)), None)
    if change is None or change.mode is not DriverMode.HOST:
        return list(nodes)
    packages, version = change.apt_packages, change.version
    wanted = [runners[n.name] for n in nodes if n.name in runners]
    results = run_on_nodes(
        wanted,
        lambda runner: retry_transient(lambda: read_driver_host(runner, packages, version)),
        max_parallel=max_parallel,
    )
    failures = [f"{name}: {res}" for name, res in results.items() if isinstance(res, RolloutError)]
    if failures:
        raise ProbeFailed("could not read the host driver facts:\n  " + "\n  ".join(failures))
    return [
        dataclasses.replace(node, driver_host=found)
        if not isinstance(found := results.get(node.name), RolloutError | None)
        else node
        for node in nodes
    ]
