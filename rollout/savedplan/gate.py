"""`rollout apply FILE`, before each node: the node's facts again, compared with those its
saved plan was made from; the node's real file texts, its credentials carried over.

A node this run has started (a resume) is not compared again: its own steps changed its
facts, and they check what they find themselves. The cluster's objects and the labels a run
moves are compared only until this run's first cluster-wide change (its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.executor import NodeRefused
from rollout.facts import ClusterFacts, NodeFacts
from rollout.plan import NodePlan
from rollout.savedplan.credentials import CredentialsNotCarried, carry_over
from rollout.savedplan.digests import cluster_digests, compare_digests, node_digests


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
                    + f" ({node.name} was not touched)"
                )
        try:
            return carry_over(node, facts, self.files.get(node.name, {}))
        except CredentialsNotCarried as exc:
            raise FactsMoved(
                f"{node.name}: {exc}; plan again ({node.name} was not touched)"
            ) from None
