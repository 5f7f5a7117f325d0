"""Live fact gathering: the cluster's reads overlap the nodes' probes; errors read as before.

`gather_fleet_facts` probes every node over SSH (each node's API reads in its thread) and
reads the cluster (ClusterPolicy, budgets, ConfigMaps) meanwhile, in a thread of its own. A
node that cannot be probed is still reported before any error of the cluster's reads.
"""

from __future__ import annotations

import gc
import json
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from rollout.cli import main
from rollout.cli import plan as cli_plan
from rollout.containerd import ConfigFiles, ContainerdVersion
from rollout.fact import ProbeFailed
from rollout.facts import live, load_recorded_facts
from rollout.facts.gpu import GpuFacts
from rollout.facts.live import NodeProbe, gather_fleet_facts
from rollout.spec.plan import parse_spec
from rollout.transports.errors import KubeError
from rollout.transports.kube import Node, Pod
from tests.examples import FACTS, PLAN

WAIT_S = 10.0


class Runner:
    def __init__(self, host: str) -> None:
        self.host = host


class Kube:
    """The reads gathering makes; the cluster's first read says when it starts."""

    def __init__(self, cluster_error: KubeError | None = None) -> None:
        self.cluster_started = threading.Event()
        self.cluster_error = cluster_error

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        self.cluster_started.set()
        if self.cluster_error is not None:
            raise self.cluster_error
        return [{"spec": {"driver": {"version": "550"}}}]

    def list_pdbs(self, namespace: str | None) -> Sequence[Any]:
        return []

    def get_configmap(self, namespace: str, name: str) -> Any:
        raise AssertionError("the example plan names no time-slicing ConfigMap")

    def list_pods(self, namespace: str | None, field_selector: str = "") -> list[Pod]:
        return []

    def get_node(self, name: str) -> Node:
        return Node(name=name, uid="u", resource_version="1")


def probe_waiting_for(kube: Kube, failing: str = "") -> Any:
    def probe_node(runner: Runner, main_path: str = "", also: tuple[str, ...] = ()) -> NodeProbe:
        # a node answers only once the cluster's reads have started: gathered one after the
        # other, this would wait in vain
        assert kube.cluster_started.wait(WAIT_S), "the cluster was read only after the nodes"
        if runner.host == failing:
            raise ProbeFailed(f"{runner.host}: containerd --version exited 127")
        main = "/etc/containerd/config.toml"
        return NodeProbe(
            containerd=ContainerdVersion(1, 7, 24),
            config_files=ConfigFiles(main_path=main, files={main: "version = 2\n"}),
            gpus=GpuFacts(count=0),
            service=None,  # type: ignore[arg-type]
            effective_config={},
        )

    return probe_node


def test_the_cluster_is_read_while_the_nodes_are_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = Kube()
    monkeypatch.setattr(live, "probe_node", probe_waiting_for(kube))
    spec = parse_spec(PLAN.read_text(), str(PLAN))
    runners = {name: Runner(name) for name in ("n2", "n1")}
    fleet = gather_fleet_facts(spec, runners, kube)  # type: ignore[arg-type]
    assert [n.name for n in fleet.nodes] == ["n1", "n2"]
    assert fleet.cluster.cluster_policy == {"driver": {"version": "550"}}


def test_a_node_that_fails_is_reported_before_the_clusters_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = Kube(cluster_error=KubeError("list", "clusterpolicies", status=403, message="forbidden"))
    monkeypatch.setattr(live, "probe_node", probe_waiting_for(kube, failing="n1"))
    spec = parse_spec(PLAN.read_text(), str(PLAN))
    runners = {name: Runner(name) for name in ("n1", "n2")}
    with pytest.raises(ProbeFailed, match="n1: containerd --version exited 127"):
        gather_fleet_facts(spec, runners, kube)  # type: ignore[arg-type]
    monkeypatch.setattr(live, "probe_node", probe_waiting_for(kube))
    with pytest.raises(KubeError, match="clusterpolicies"):
        gather_fleet_facts(spec, runners, kube)  # type: ignore[arg-type]


def test_plan_gathers_live_facts_with_the_collector_paused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Importing the SSH and Kubernetes libraries makes objects that live on: no collection."""
    seen: list[bool] = []

    def gather(spec: Any, args: Any) -> Any:
        seen.append(gc.isenabled())
        return load_recorded_facts(FACTS), {}

    monkeypatch.setattr(cli_plan, "gather_live_facts", gather)
    assert gc.isenabled()
    assert main(["plan", str(PLAN), "-i", "inventory.yaml", "-o", "json"]) == 0
    assert seen == [False]
    assert gc.isenabled()
    assert json.loads(capsys.readouterr().out)["waves"]


class HangingKube(Kube):
    """A cluster whose first read does not answer until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        self.cluster_started.set()
        self.release.wait(WAIT_S)
        return []


def test_a_failed_node_is_reported_without_waiting_for_the_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kube = HangingKube()

    def probe_node(runner: Runner, main_path: str = "", also: tuple[str, ...] = ()) -> NodeProbe:
        raise ProbeFailed(f"{runner.host}: host key changed")

    monkeypatch.setattr(live, "probe_node", probe_node)
    spec = parse_spec(PLAN.read_text(), str(PLAN))
    try:
        started = time.monotonic()
        with pytest.raises(ProbeFailed, match="n1: host key changed"):
            gather_fleet_facts(spec, {"n1": Runner("n1")}, kube)  # type: ignore[arg-type,dict-item]
        assert time.monotonic() - started < WAIT_S / 2
    finally:
        kube.release.set()
