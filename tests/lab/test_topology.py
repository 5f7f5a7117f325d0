"""Topology groups in the lab: six nodes in three NVLink cliques (labelled through the API as
the GPU Operator's feature discovery labels them, `nvidia.com/gpu.clique=<cluster>.<n>`),
the registry-mirror plan with `waves: [1, "50%"]`, `group_by: nvidia.com/gpu.clique` and
`max_unavailable_per_group: 1`, watched through the API from the side while it applies: no
clique is ever split across waves, and no clique has more than one node down at once.

The cliques cross the name order (lab-node-1 and lab-node-4 are one clique), so the plain
waves of `[1, "50%"]` (1, then 3, then 2 nodes in name order) would split two of them.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.run import list_runs, read_run
from rollout.transports.kube import KubeClient
from tests.examples import PLAN
from tests.lab.converged import assert_converged
from tests.lab.labapi import apply_args, watching
from tests.lab.test_cluster_shared import own_lab

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

CLIQUE = "nvidia.com/gpu.clique"
CLIQUES = {
    "lab-node-1": "gb200.1",
    "lab-node-4": "gb200.1",
    "lab-node-2": "gb200.2",
    "lab-node-5": "gb200.2",
    "lab-node-3": "gb200.3",
    "lab-node-6": "gb200.3",
}


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("topology") / "lab", ("1.7", "2.1") * 3, 1) as built:
        yield built


def test_no_clique_is_split_across_waves_and_the_group_budget_holds(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    assert sorted(n.name for n in lab.nodes) == sorted(CLIQUES)
    for name, clique in CLIQUES.items():
        kube.patch_node_labels(name, {CLIQUE: clique})
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        PLAN.read_text().replace(
            "max_unavailable: 1",
            f"max_unavailable: 2\n  group_by: {CLIQUE}\n  max_unavailable_per_group: 1",
        )
    )

    def sample(side: KubeClient) -> list[tuple[float, frozenset[str]]]:
        # the API's view, from the side: which nodes are cordoned, over time
        return [(time.monotonic(), frozenset(n.name for n in side.list_nodes() if n.unschedulable))]

    with watching(lab, sample, interval_s=0.05) as seen:
        assert main(apply_args(lab, plan, tmp_path / "state")) == 0
    (run,) = list_runs(tmp_path / "state")
    assert read_run(tmp_path / "state", run.run_id).outcome is not None
    assert_converged(lab, kube)

    assert len(seen) > 20, "the watch saw the run"
    cordoned = [down for _, down in seen if down]
    # each node was seen cordoned (its change took it down), every clique in turn
    assert set().union(*cordoned) == set(CLIQUES)
    order: list[str] = []  # the cliques in the order their nodes were first seen down
    for down in cordoned:
        cliques = {CLIQUES[name] for name in down}
        assert len(cliques) == 1, f"nodes of two cliques down at once: {sorted(down)}"
        assert len(down) == 1, f"max_unavailable_per_group 1 exceeded: {sorted(down)}"
        (clique,) = cliques
        if not order or order[-1] != clique:
            order.append(clique)
    # a clique's nodes are all done before the next clique's first node is taken down: the
    # cliques come once each, in the plan's order (by each clique's first node name)
    assert order == ["gb200.1", "gb200.2", "gb200.3"], order
