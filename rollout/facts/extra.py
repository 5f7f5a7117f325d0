"""Extra per-node facts some plans need, read on every node at once and set on its
NodeFacts; a node that cannot be read fails the gathering, named.

Which facts a plan needs its change kinds say (rollout.changes: each kind's `node_reads`,
a driver change's packages or running kernel, and `node_files`, the files a change writes
outside /etc/containerd, which the files fact reads only with the node's one probe).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout.changes import node_files, node_reads
from rollout.commands import CommandRunner
from rollout.errors import RolloutError
from rollout.fact import ProbeFailed, read_fact
from rollout.facts.containerd import ConfigFilesFact
from rollout.facts.model import NodeFacts
from rollout.retry import retry_transient
from rollout.spec import Spec
from rollout.transports.fanout import run_on_nodes


@dataclass(frozen=True)
class NodeRead:
    """One extra fact a change kind needs of every node: `read(runner)`, set on the node's
    NodeFacts `field` (where still None); `what` names it when a node cannot be read."""

    field: str
    read: Callable[[CommandRunner], Any]
    what: str


def with_plan_facts(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int = 8,
    planners: Mapping[str, Any] | None = None,
) -> list[NodeFacts]:
    """The nodes with the extra facts the plan's change kinds read (their `node_reads`: host
    driver facts for a `mode: host` driver upgrade, the running kernel for `mode: operator`);
    unchanged otherwise. (The files a change writes outside /etc/containerd are read with the
    node's files, in its one probe: `node_files`.)"""
    found = list(nodes)
    for read in node_reads(spec.changes, planners):
        fact: NodeRead = read
        found = with_node_fact(found, runners, fact.field, fact.read, fact.what, max_parallel)
    return found


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


def with_hosts_files(
    spec: Spec,
    runners: Mapping[str, CommandRunner],
    nodes: Sequence[NodeFacts],
    max_parallel: int,
    planners: Mapping[str, Any] | None = None,
) -> list[NodeFacts]:
    """Each node with its files read again together with the plan's hosts.toml files outside
    /etc/containerd (as the write step's drift check reads them), so that the plan's `before`
    of such a file is the node's, not "a new file"; unchanged when there are none. Only for
    files read without the plan (`facts record --plan`): a plan's own gathering reads them in
    its one probe of the node."""
    also = node_files(spec.changes, planners)
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
