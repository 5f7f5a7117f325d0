"""driver.pin, driver.release and driver.confirm against an in-memory cluster: the pin comes
before the version, someone else's skip label is left alone, the budget and upgrade-failed
hold a release, resume derives progress from the labels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

import pytest

from rollout.budget import RunBudget
from rollout.changes.base import PlanningContext
from rollout.changes.driver.operator import DriverConfirmStep, DriverPinStep, DriverReleaseStep
from rollout.changes.driver.operatorplan import PINNED_BY_ANNOTATION, REVISION_BEFORE_ANNOTATION
from rollout.facts import ClusterFacts, FleetFacts, GpuFacts
from rollout.plan import NodePlan
from rollout.run import Journal
from rollout.spec import Spec, parse_spec
from rollout.steps.base import StepContext, StepFailed, StepResultKind
from rollout.transports.kube import KubeClient, Node, OwnerRef, Pod
from tests.fakes import InMemoryKube, ScriptedRunner
from tests.node_facts import containerd_node

OLD, NEW = "535.183.01", "550.90.07"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
STATE = "nvidia.com/gpu-driver-upgrade-state"
SERVED = {"nvidia.com/gpu.deploy.driver": "true"}
SPEC_TEXT = f"""\
apiVersion: rollout/v1
kind: Plan
metadata: {{name: unit}}
targets: {{nodes: [n1, n2]}}
changes:
  - driver-upgrade: {{version: "{NEW}", mode: operator, upgrade_timeout_s: 60}}
policy: {{max_unavailable: 1}}
"""
SPEC = parse_spec(SPEC_TEXT, "unit.yaml")


class FakeCluster(InMemoryKube):
    """Nodes, driver pods and the ClusterPolicy; records every write in order."""

    def __init__(self, names: tuple[str, ...] = ("n1", "n2", "n3")) -> None:
        ready = {"Ready": "True"}
        super().__init__(
            *(
                Node(name=n, uid=n, resource_version="1", labels=dict(SERVED), conditions=ready)
                for n in names
            )
        )
        self.pods = {n: self.driver_pod(n, "rev-old") for n in names}  # node -> its driver pod
        self.policy: dict[str, Any] = {
            "metadata": {"name": "cluster-policy"},
            "spec": {"driver": {"version": OLD, "upgradePolicy": {"autoUpgrade": True}}},
        }
        self.writes: list[str] = []
        self.on_read: dict[str, list[Mapping[str, str]]] = {}  # node -> labels per get_node

    @staticmethod
    def driver_pod(node: str, revision: str, ready: bool = True) -> Pod:
        return Pod(
            namespace="gpu-operator",
            name=f"nvidia-driver-daemonset-{node}-{revision}",
            uid=f"{node}-{revision}",
            resource_version="1",
            node_name=node,
            phase="Running",
            labels={"app": "nvidia-driver-daemonset", "controller-revision-hash": revision},
            owners=(OwnerRef("DaemonSet", "nvidia-driver-daemonset", True),),
            containers=("nvidia-driver-ctr",),
            ready=ready,
        )

    def get_node(self, name: str) -> Node:
        script = self.on_read.get(name)
        if script:
            labels = {**self.nodes[name].labels, **script.pop(0)}
            self.nodes[name] = replace(self.nodes[name], labels=labels)
            self.pods[name] = self.driver_pod(name, "rev-new")
        return self.nodes[name]

    def list_nodes(self, label_selector: str | None = None) -> list[Node]:
        return list(self.nodes.values())

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> Node:
        self.writes.append(f"label {name} {dict(labels)}")
        return super().patch_node_labels(name, labels)

    def set_unschedulable(self, name: str, unschedulable: bool) -> Node:
        self.writes.append(f"unschedulable {name} {unschedulable}")
        return super().set_unschedulable(name, unschedulable)

    def read_pod_log(self, namespace: str, name: str, container: str | None = None) -> str:
        return "ERROR: the kernel module failed to build\n" * 3

    def list_cluster_policies(self) -> list[dict[str, Any]]:
        return [self.policy]

    def patch_cluster_policy(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        version = patch["spec"]["driver"]["version"]
        self.writes.append(f"version {version}")
        self.policy["spec"]["driver"]["version"] = version
        return self.policy


@pytest.fixture
def cluster() -> FakeCluster:
    return FakeCluster()


def context(
    cluster: FakeCluster, journal: Journal, node: str, smi: str = NEW, spec: Spec = SPEC
) -> StepContext:
    runner = ScriptedRunner(name=node).on(["nvidia-smi"], f"GPU-1, NVIDIA A100, {smi}\n")
    facts = replace(containerd_node(node), gpus=GpuFacts(count=1, driver_version=OLD))
    # the run's budget as the executor builds it: max_unavailable of the 3 nodes, the targets
    budget = RunBudget(spec.policy.max_unavailable_count(3), frozenset({"n1", "n2"}))
    return StepContext(
        node=node,
        node_plan=NodePlan(name=node, containerd_version="1.7.24", steps=()),
        facts=facts,
        spec=spec,
        runner=runner,
        kube=cast(KubeClient, cluster),
        journal=journal,
        progress=lambda _: None,
        sleep=lambda _: None,
        budget=budget,
    )


def test_pin_labels_every_served_node_before_the_version_and_leaves_others_alone(
    cluster: FakeCluster, journal: Journal
) -> None:
    cluster.patch_node_labels("n3", {SKIP: "true"})  # someone else's, before the run
    cluster.writes.clear()
    result = DriverPinStep().apply(context(cluster, journal, "n1"))
    assert result.kind is StepResultKind.DONE
    assert cluster.writes == [
        f"label n1 {{'{SKIP}': 'true'}}",
        f"label n2 {{'{SKIP}': 'true'}}",
        f"version {NEW}",
    ]
    assert "left alone (skip label set before): n3" in result.detail
    assert PINNED_BY_ANNOTATION not in cluster.nodes["n3"].annotations
    assert cluster.nodes["n1"].annotations[REVISION_BEFORE_ANNOTATION] == "rev-old"
    # the next node finds it made
    again = DriverPinStep().apply(context(cluster, journal, "n2"))
    assert again.kind is StepResultKind.NOOP


def test_pin_refuses_when_auto_upgrade_is_off(cluster: FakeCluster, journal: Journal) -> None:
    cluster.policy["spec"]["driver"]["upgradePolicy"]["autoUpgrade"] = False
    with pytest.raises(StepFailed, match="autoUpgrade is off"):
        DriverPinStep().apply(context(cluster, journal, "n1"))
    assert cluster.writes == []


def test_release_watches_until_done_on_a_new_driver_pod(
    cluster: FakeCluster, journal: Journal
) -> None:
    DriverPinStep().apply(context(cluster, journal, "n1"))
    cluster.on_read["n1"] = [
        {},
        {STATE: "cordon-required"},
        {STATE: "pod-restart-required"},
        {STATE: "upgrade-done"},
    ]
    result = DriverReleaseStep().apply(context(cluster, journal, "n1"))
    assert SKIP not in cluster.nodes["n1"].labels
    assert cluster.nodes["n2"].labels[SKIP] == "true"
    assert "cordon-required -> pod-restart-required -> upgrade-done" in result.detail
    confirmed = DriverConfirmStep().apply(context(cluster, journal, "n1"))
    assert f"nvidia-smi reports {NEW}" in confirmed.detail


def test_release_fails_on_upgrade_failed_naming_the_driver_pod(
    cluster: FakeCluster, journal: Journal
) -> None:
    DriverPinStep().apply(context(cluster, journal, "n1"))
    cluster.on_read["n1"] = [{}, {STATE: "upgrade-failed"}]
    with pytest.raises(StepFailed) as failed:
        DriverReleaseStep().apply(context(cluster, journal, "n1"))
    message = str(failed.value)
    assert "upgrade-failed" in message and "kernel module failed to build" in message
    assert message.count("kernel module failed to build") == 1  # repeated lines once


def test_no_release_while_a_served_node_is_upgrade_failed(
    cluster: FakeCluster, journal: Journal
) -> None:
    DriverPinStep().apply(context(cluster, journal, "n1"))
    cluster.patch_node_labels("n3", {STATE: "upgrade-failed"})
    with pytest.raises(StepFailed, match=r"n3 nvidia\.com/gpu-driver-upgrade-state=upgrade-failed"):
        DriverReleaseStep().apply(context(cluster, journal, "n2"))
    assert cluster.nodes["n2"].labels[SKIP] == "true"


RETRY = parse_spec(
    SPEC_TEXT.replace("upgrade_timeout_s: 60", "upgrade_timeout_s: 60, retry_failed: true")
    # the failed nodes are down already: each counts against the budget
    .replace("max_unavailable: 1", "max_unavailable: 2"),
    "retry.yaml",
)


def test_retry_relabels_a_failed_target_and_watches_it_to_done(
    cluster: FakeCluster, journal: Journal
) -> None:
    """The documented fix: upgrade-failed -> upgrade-required; a failed target of the same
    plan (n2) does not hold the release, a failed node outside it (n3) does."""
    cluster.policy["spec"]["driver"]["version"] = NEW
    cluster.patch_node_labels("n1", {STATE: "upgrade-failed"})
    cluster.patch_node_labels("n2", {STATE: "upgrade-failed"})
    cluster.nodes["n1"] = replace(cluster.nodes["n1"], unschedulable=True)  # the failure's
    ctx = context(cluster, journal, "n1", spec=RETRY)
    facts = replace(ctx.facts, labels=dict(cluster.nodes["n1"].labels))
    planned = DriverReleaseStep().plan(
        PlanningContext(RETRY, FleetFacts((facts,), ClusterFacts(), "test")), facts
    )
    assert (planned.action or "").startswith(f"relabel {STATE} upgrade-failed -> upgrade-required")
    cluster.writes.clear()
    cluster.on_read["n1"] = [
        {},
        {STATE: "upgrade-required"},
        {STATE: "pod-restart-required"},
        {STATE: "upgrade-done"},
    ]
    result = DriverReleaseStep().apply(ctx)
    assert cluster.writes[0] == f"label n1 {{'{STATE}': 'upgrade-required'}}"
    assert "upgrade-required -> pod-restart-required -> upgrade-done" in result.detail
    # the operator keeps a node cordoned at the start cordoned: rollout takes its cordon off
    assert not cluster.nodes["n1"].unschedulable and "uncordoned" in result.detail
    cluster.patch_node_labels("n3", {STATE: "upgrade-failed"})
    with pytest.raises(StepFailed, match=r"n3 nvidia\.com/gpu-driver-upgrade-state=upgrade-failed"):
        DriverReleaseStep().apply(context(cluster, journal, "n2", spec=RETRY))


def test_release_waits_for_max_unavailable(cluster: FakeCluster, journal: Journal) -> None:
    DriverPinStep().apply(context(cluster, journal, "n1"))
    cluster.nodes["n3"] = replace(cluster.nodes["n3"], unschedulable=True)
    with pytest.raises(StepFailed, match="max_unavailable 1 still taken by n3"):
        DriverReleaseStep().apply(context(cluster, journal, "n2"))
    assert cluster.nodes["n2"].labels[SKIP] == "true"


def test_resume_watches_a_node_already_released(cluster: FakeCluster, journal: Journal) -> None:
    DriverPinStep().apply(context(cluster, journal, "n1"))
    cluster.patch_node_labels("n1", {SKIP: None, STATE: "upgrade-done"})
    cluster.pods["n1"] = cluster.driver_pod("n1", "rev-new")
    cluster.writes.clear()
    result = DriverReleaseStep().apply(context(cluster, journal, "n1"))
    assert result.kind is StepResultKind.DONE and cluster.writes == []


def test_a_skip_label_someone_else_set_is_not_released(
    cluster: FakeCluster, journal: Journal
) -> None:
    cluster.patch_node_labels("n1", {SKIP: "true"})
    cluster.writes.clear()
    result = DriverReleaseStep().apply(context(cluster, journal, "n1"))
    assert result.kind is StepResultKind.NOOP and cluster.writes == []


def test_confirm_fails_on_the_old_pod_or_version(cluster: FakeCluster, journal: Journal) -> None:
    DriverPinStep().apply(context(cluster, journal, "n1"))
    with pytest.raises(StepFailed) as failed:
        DriverConfirmStep().apply(context(cluster, journal, "n1", smi=OLD))
    assert "revision from before the change (rev-old)" in str(failed.value)
    assert f"nvidia-smi on the node reports driver {OLD}" in str(failed.value)
