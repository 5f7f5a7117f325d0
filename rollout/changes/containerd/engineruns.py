"""One plan's containerd engine runs: one per distinct node configuration, by content.

A real fleet is a few node configurations repeated many times; the planning context keeps one
ContainerdPlans per plan (rollout.changes.containerd), and every node of a configuration
reads the one result.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from rollout.changes.containerd.writes import ContainerdChanges, plan_node_containerd
from rollout.facts import NodeFacts
from rollout.memo import BoundedCache
from rollout.spec import Spec


class ContainerdPlans:
    """plan_node_containerd's results by content: one engine run per distinct node configuration.

    A real fleet is a few node configurations repeated many times (the toolkit writes
    byte-identical drop-ins across a node pool), and the result depends only on the
    containerd version, the node's files and what the plan asks: the key is exactly
    those. Errors are never kept, so each failing node reports itself by name. One plan
    keeps one (in its planning context): two plans share nothing.
    """

    def __init__(self, entries: int = 256, *, deduplicate: bool = True) -> None:
        self._results: BoundedCache[InputKey, ContainerdChanges] = BoundedCache(entries)
        self._lock = threading.Lock()
        # False: every node computed afresh (the reference the memo is tested against)
        self.deduplicate = deduplicate
        self.runs = 0  # engine runs (the misses), for tests and the benchmark
        # the spec's part of the key, kept for the spec being planned (its repr is costly)
        self._spec: tuple[Spec, str] | None = None

    def plan(self, spec: Spec, node: NodeFacts) -> ContainerdChanges:
        """The node's containerd changes, computed once per distinct input."""
        if not self.deduplicate:
            return self._run(spec, node)
        with self._lock:
            if self._spec is None or self._spec[0] is not spec:
                self._spec = (spec, repr(spec.changes))
            asked = self._spec[1]
        return self._results.get_or_compute(
            input_key(spec, node, asked), lambda: self._run(spec, node)
        )

    def plan_distinct(self, spec: Spec, nodes: Sequence[NodeFacts], max_parallel: int) -> None:
        """Compute the distinct configurations of `nodes` ahead, up to max_parallel at once.

        An engine run mostly waits for the real `containerd config dump` (a process of its
        own), so the runs of a fleet's few configurations overlap. Nothing is raised here:
        errors are not kept, and each node's own plan raises its error again, by name.
        """
        if not self.deduplicate:
            return
        asked = repr(spec.changes)
        firsts: dict[InputKey, NodeFacts] = {}
        for node in nodes:
            firsts.setdefault(input_key(spec, node, asked), node)
        if len(firsts) < 2:
            return  # nothing to overlap: the plan computes it in turn

        def plan_one(node: NodeFacts) -> None:
            with contextlib.suppress(Exception):  # raised again, named, by the node's plan
                self.plan(spec, node)

        with ThreadPoolExecutor(max_workers=min(max_parallel, len(firsts))) as pool:
            list(pool.map(plan_one, firsts.values()))

    def _run(self, spec: Spec, node: NodeFacts) -> ContainerdChanges:
        result = plan_node_containerd(spec, node)
        with self._lock:
            self.runs += 1
        return result


# everything plan_node_containerd reads: the version, the main file, the files, the changes
InputKey = tuple[str, str, tuple[tuple[str, str], ...], str]


def input_key(spec: Spec, node: NodeFacts, asked: str | None = None) -> InputKey:
    """Everything plan_node_containerd reads: the version, the files, the changes.

    The version's raw `--version` text is in the key, so a note quoting it stays exact; the
    spec's changes are keyed by their repr (every field, in the plan's order), which is
    what they ask whichever line of which plan file states them (`asked`, when known). The
    files are compared whole, in their order: a string keeps its hash, and recorded nodes
    share one string per distinct text, so a repeated configuration costs identity checks.
    """
    return (
        repr(node.containerd),
        node.config_files.main_path,
        tuple(node.config_files.files.items()),
        repr(spec.changes) if asked is None else asked,
    )
