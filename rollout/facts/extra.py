"""Extra per-node facts some plans need, read on every node at once and set on its
NodeFacts; a node that cannot be read fails the gathering, named.

Which fact a plan needs is decided here once: a registry change whose config_path lies outside
/etc/containerd has its hosts.toml read with the node's files (the files fact reads only that
directory by itself: `hosts_files_outside` names them for the probe); a driver change, by its
mode: `host` reads the apt and module facts of
the packages (rollout.driver.host), `operator` the running kernel the operator's driver
container builds its module for (DriverKernelFact).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rollout.changes.containerd.registrymodel import RegistryChange, is_under
from rollout.changes.driver.model import DriverMode, DriverUpgradeChange
from rollout.commands import CommandRunner
from rollout.containerd import hosts_toml_path
from rollout.containerd.files import CONTAINERD_DIR
from rollout.driver.host import read_driver_host
from rollout.driver.status import DriverKernelFact
from rollout.errors import RolloutError
from rollout.fact import ProbeFailed, read_fact
from rollout.facts.containerd import ConfigFilesFact
from rollout.facts.model import NodeFacts
from rollout.retry import retry_transient
from rollout.spec import Spec
from rollout.transports.fanout import run_on_nodes


def with_plan_facts(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int = 8,
) -> list[NodeFacts]:
    """The nodes with the extra facts the plan's driver change needs: host driver facts for a
    `mode: host` driver upgrade, the running kernel for `mode: operator`; unchanged otherwise.
    (The hosts.toml files outside /etc/containerd are read with the node's files, in its one
    probe: `hosts_files_outside`.)"""
    change = spec.change_of(DriverUpgradeChange)
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
    found = read_on_nodes(wanted, read, what, max_parallel)
    return [
        dataclasses.replace(node, **dict[str, Any]({field: found[node.name]}))
        if node.name in found
        else node
        for node in nodes
    ]


def read_on_nodes(
    runners: Sequence[CommandRunner],
    read: Callable[[CommandRunner], Any],
    what: str,
    max_parallel: int,
) -> dict[str, Any]:
    """`read(runner)` of each runner, in parallel, by node; any failure fails them all, named."""
    results = run_on_nodes(
        runners, lambda runner: retry_transient(lambda: read(runner)), max_parallel=max_parallel
    )
    failures = [f"{name}: {res}" for name, res in results.items() if isinstance(res, RolloutError)]
    if failures:
        raise ProbeFailed(f"could not read {what}:\n  " + "\n  ".join(failures))
    return {name: res for name, res in results.items() if res is not None}


def hosts_files_outside(spec: Spec) -> tuple[str, ...]:
    """The hosts.toml files the plan's registry changes write outside /etc/containerd."""
    paths = (
        hosts_toml_path(c.config_path, c.host)
        for c in spec.changes
        if isinstance(c, RegistryChange)
    )
    return tuple(sorted({p for p in paths if not is_under(p, CONTAINERD_DIR)}))


def with_hosts_files(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int,
) -> list[NodeFacts]:
    """Each node with its files read again together with the plan's hosts.toml files outside
    /etc/containerd (as the write step's drift check reads them), so that the plan's `before`
    of such a file is the node's, not "a new file"; unchanged when there are none. Only for
    files read without the plan (`facts record --plan`): a plan's own gathering reads them in
    its one probe of the node."""
    also = hosts_files_outside(spec)
    if not also:
        return list(nodes)
    mains = {n.name: n.config_files.main_path for n in nodes}
    found = read_on_nodes(
        [runners[n.name] for n in nodes if n.name in runners],
        lambda runner: read_fact(runner, ConfigFilesFact(mains[runner.host], also=also)),
        "the containerd files with the plan's hosts.toml files",
        max_parallel,
    )
    # the files read without them (the first gathering's) are replaced, whole
    return [
        dataclasses.replace(n, config_files=found[n.name]) if n.name in found else n for n in nodes
    ]
