"""`rollout apply FILE`, before each node: the node's facts again, compared with those its
saved plan was made from; the node's real file texts, its credentials carried over.

A node this run has started (a resume) is not compared again: its own steps changed its
facts, and they check what they find themselves. The cluster's objects and the labels a run
moves are compared only until this run's first cluster-wide change (its own).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollout.executor import NodeRefused
from rollout.facts import ClusterFacts, NodeFacts
from rollout.facts.live import gather_fleet_facts
from rollout.plan import NodePlan
from rollout.savedplan.credentials import CredentialsNotCarried, carry_over
from rollout.savedplan.digests import cluster_digests, compare_digests, node_digests
from rollout.savedplan.document import JOURNAL_KEY
from rollout.steps import step_traits
from rollout.steps.traits import cluster_wide_kinds

if TYPE_CHECKING:
    from rollout.commands import CommandRunner
    from rollout.run import Journal
    from rollout.spec import Spec
    from rollout.transports.kube import KubeClient


class FactsMoved(NodeRefused):
    """A node whose facts changed since its plan was saved: not touched; the run halts."""


@dataclass(frozen=True)
class SavedPlanGate:
    """The digests a saved plan was made from, and the check each node passes before it starts."""

    facts: Mapping[str, Mapping[str, str]]
    cluster: Mapping[str, str]
    files: Mapping[str, Mapping[str, Mapping[str, str | None]]]

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> SavedPlanGate:
        """From SavedPlan.digests_to_data (as a run journals it)."""
        return cls(facts=data["facts"], cluster=data["cluster"], files=data["files"])

    def admit(
        self,
        node: NodePlan,
        facts: NodeFacts,
        cluster: ClusterFacts,
        *,
        started: bool,
        cluster_changed: bool,
    ) -> NodePlan:
        """The node's plan to run, its real texts filled in; FactsMoved when a fact it was
        made from changed (the message names the node, the fact and both digests)."""
        if not started:
            saved = self.facts.get(node.name, {})
            changed = compare_digests(saved, node_digests(facts), moving_too=not cluster_changed)
            if not cluster_changed:
                changed += compare_digests(self.cluster, cluster_digests(cluster))
            if changed:
                raise FactsMoved(
                    f"{node.name}: "
                    + "; ".join(c.describe() for c in changed)
                    + f"; plan again ({node.name} was not touched)"
                )
        try:
            return carry_over(node, facts, self.files.get(node.name, {}))
        except CredentialsNotCarried as exc:
            raise FactsMoved(
                f"{node.name}: {exc}; plan again ({node.name} was not touched)"
            ) from None


def saved_plan_gate(plan_json: str) -> SavedPlanGate | None:
    """The gate of a run started from a saved plan (its journalled plan keeps the digests
    under JOURNAL_KEY); None for a run planned as it started."""
    data = json.loads(plan_json)
    saved = data.get(JOURNAL_KEY) if isinstance(data, dict) else None
    return None if saved is None else SavedPlanGate.from_data(saved)


def admit_node(
    gate: SavedPlanGate,
    node: NodePlan,
    spec: Spec,
    runner: CommandRunner,
    kube: KubeClient,
    journal: Journal,
) -> tuple[NodePlan, NodeFacts]:
    """Read the node's facts again and pass it through the gate: the plan to run and the
    fresh facts; FactsMoved when the node must not be touched."""
    fresh = gather_fleet_facts(spec, {node.name: runner}, kube, source="apply")
    facts = fresh.by_name(node.name)
    if facts is None:
        raise FactsMoved(f"{node.name}: not found when read again ({node.name} was not touched)")
    state = journal.replay()
    mine = state.node(node.name)
    started = bool(mine.completed) or mine.in_flight is not None or mine.outcome is not None
    cluster_changed = state.first_acted(cluster_wide_kinds(step_traits())) is not None
    admitted = gate.admit(
        node, facts, fresh.cluster, started=started, cluster_changed=cluster_changed
    )
    return admitted, facts
