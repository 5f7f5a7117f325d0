"""Host driver facts gathered live, for plans that install a driver with apt (`mode: host`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rollout.commands import CommandRunner
from rollout.facts.driver_host import read_driver_host
from rollout.facts.extra import with_node_fact
from rollout.facts.model import NodeFacts
from rollout.spec import DriverMode, Spec


def with_driver_hosts(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int = 8,
) -> list[NodeFacts]:
    """The nodes with their host driver facts, where the spec installs a driver on the host;
    unchanged otherwise. A node whose facts cannot be read fails the gathering, named."""
    change = spec.driver_upgrade
    if change is None or change.mode is not DriverMode.HOST:
        return list(nodes)
    packages, version = change.apt_packages, change.version
    return with_node_fact(
        nodes,
        runners,
        "driver_host",
        lambda runner: read_driver_host(runner, packages, version),
        "the host driver facts",
        max_parallel,
    )
