"""The lab's driver upgrade controller, one test per rule of FACTS.md "Operator-managed driver
upgrades", driven tick by tick on a registry with a clock of the test's own."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.apiserver.patches import PatchType
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import (
    CLUSTERPOLICIES,
    DAEMONSETS,
    NODES,
    PODDISRUPTIONBUDGETS,
    PODS,
)
from rollout.lab.description import LabDescription
from rollout.lab.simulation import FixedRuntimeProbe, SimulationTimings
from rollout.lab.simulation.driverpods import (
    DRIVER_VERSION_FILE,
    INSTALLED_ANNOTATION,
    MODULE_VERSION_FILE,
)
from rollout.lab.simulation.engine import Simulation
from rollout.lab.simulation.gpuoperator import CLUSTER_POLICY_NAME, OPERATOR_NAMESPACE

NODE_NAMES = ("n1", "n2", "n3", "n4")
OLD, NEW = "535.183.01", "550.90.07"
STATE = "nvidia.com/gpu-driver-upgrade-state"
SKIP = "nvidia.com/gpu-driver-upgrade.skip"
REQUESTED = "nvidia.com/gpu-driver-upgrade-requested"
FAIL_KNOB = "lab.rollout/fail-upgrade"
TIMINGS = SimulationTimings(
    tick_s=0.1,
    pod_start_s=0.0,
    smoke_run_s=0.1,
    device_plugin_grace_s=1.0,
    upgrade_dwell_s=0.5,
    upgrade_resync_s=5.0,
    driver_restart_s=0.1,
    pod_termination_s=0.0,
)
TICK_S = 0.5


class Cluster:
    """A simulated cluster stepped by hand: each step advances the clock by TICK_S."""

    def __init__(
        self, roots: dict[str, Path] | None = None, timings: SimulationTimings = TIMINGS
    ) -> None:
        self.now = 1000.0
        self.registry = Registry(clock=self.clock)
        lab = LabDescription.from_dict(
            {
                "nodes": [
                    {
                        "name": name,
                        "address": f"127.0.9.{i + 1}",
                        "containerd": "1.7",
                        "driver_version": OLD,
                        "gpus": [
                            {
                                "index": 0,
                                "product": "NVIDIA A100-SXM4-40GB",
                                "uuid": f"GPU-0000000{i}-0000-0000-0000-000000000000",
                                "memory_mib": 40960,
                            }
                        ],
                    }
                    for i, name in enumerate(NODE_NAMES)
                ]
            }
        )
        if roots:
            lab = LabDescription(
                nodes=tuple(type(n)(**{**n.__dict__, "root": roots.get(n.name)}) for n in lab.nodes)
            )
        self.probe = FixedRuntimeProbe.with_nvidia(NODE_NAMES)
        self.sim = Simulation(self.registry, lab, self.probe, timings, clock=self.clock)
        self.sim.seed()
        # settle: driver pods running, every node judged once (upgrade-done)
        self.run_until(lambda: all(self.state(n) == "upgrade-done" for n in NODE_NAMES))
        for _ in range(4):  # the reconcile that those label changes trigger
            self.step()

    def clock(self) -> float:
        return self.now

    def step(self, seconds: float = TICK_S) -> None:
        self.now += seconds
        self.sim.step()

    def run_until(self, done: Callable[[], bool], max_s: float = 120.0) -> float:
        """Step until `done`; the simulated seconds it took."""
        start = self.now
        while not done():
            assert self.now - start < max_s, f"not reached in {max_s}s: {self.states()}"
            self.step()
        return self.now - start

    def node(self, name: str) -> dict[str, Any]:
        return self.registry.get(NODES, None, name)

    def state(self, name: str) -> str:
        return str((self.node(name)["metadata"].get("labels") or {}).get(STATE, ""))

    def states(self) -> dict[str, str]:
        return {n: self.state(n) for n in NODE_NAMES}

    def label(self, name: str, labels: dict[str, str | None]) -> None:
        self.registry.patch(NODES, None, name, PatchType.MERGE, {"metadata": {"labels": labels}})

    def annotate(self, name: str, annotations: dict[str, str | None]) -> None:
        self.registry.patch(
            NODES, None, name, PatchType.MERGE, {"metadata": {"annotations": annotations}}
        )

    def cordon(self, name: str) -> None:
        self.registry.patch(NODES, None, name, PatchType.MERGE, {"spec": {"unschedulable": True}})

    def policy(self, driver: dict[str, Any]) -> None:
        self.registry.patch(
            CLUSTERPOLICIES,
            None,
            CLUSTER_POLICY_NAME,
            PatchType.MERGE,
            {"spec": {"driver": driver}},
        )

    def upgrade_policy(self, **values: Any) -> None:
        self.policy({"upgradePolicy": values})

    def driver_pods(self) -> dict[str, dict[str, Any]]:
        return {
            p["spec"]["nodeName"]: p
            for p in self.registry.list_objects(PODS, OPERATOR_NAMESPACE)
            if p["metadata"]["name"].startswith("nvidia-driver-daemonset")
            and p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
        }

    def upgraded(self, name: str) -> bool:
        """Done, on a driver pod of the new version that has installed itself."""
        pod = self.driver_pods().get(name)
        installed = ((pod or {}).get("metadata", {}).get("annotations") or {}).get(
            INSTALLED_ANNOTATION
        )
        return self.state(name) == "upgrade-done" and installed == NEW

    def in_progress(self) -> int:
        idle = ("", "upgrade-done", "upgrade-required")
        return sum(1 for s in self.states().values() if s not in idle)


@pytest.fixture()
def cluster() -> Iterator[Cluster]:
    built = Cluster()
    yield built
    built.registry.close()


def skip_all(cluster: Cluster, but: tuple[str, ...] = ()) -> None:
    for name in NODE_NAMES:
        if name not in but:
            cluster.label(name, {SKIP: "true"})


def test_version_change_restarts_nothing_by_itself(cluster: Cluster) -> None:
    """OnDelete: skipped nodes go to upgrade-required and keep their old driver pod."""
    before = {n: p["metadata"]["uid"] for n, p in cluster.driver_pods().items()}
    skip_all(cluster)
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: all(s == "upgrade-required" for s in cluster.states().values()))
    for _ in range(40):
        cluster.step()
    assert all(s == "upgrade-required" for s in cluster.states().values())
    assert {n: p["metadata"]["uid"] for n, p in cluster.driver_pods().items()} == before
    daemonset = cluster.registry.get(DAEMONSETS, OPERATOR_NAMESPACE, "nvidia-driver-daemonset")
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}


def test_out_of_date_is_judged_by_the_controller_revision(cluster: Cluster) -> None:
    """A template change other than the version makes pods out of date too."""
    skip_all(cluster)

    def add_env(ds: dict[str, Any]) -> None:
        ds["spec"]["template"]["spec"]["containers"][0]["env"].append(
            {"name": "LAB_EXTRA", "value": "1"}
        )

    cluster.registry.mutate(DAEMONSETS, OPERATOR_NAMESPACE, "nvidia-driver-daemonset", add_env)
    cluster.run_until(lambda: all(s == "upgrade-required" for s in cluster.states().values()))


def test_skip_label_is_read_only_when_a_node_leaves_upgrade_required(cluster: Cluster) -> None:
    skip_all(cluster, but=("n1",))
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: cluster.state("n1") == "wait-for-jobs-required")
    cluster.label("n1", {SKIP: "true"})  # too late: n1 has left upgrade-required
    cluster.run_until(lambda: cluster.upgraded("n1"))
    assert {cluster.state(n) for n in ("n2", "n3", "n4")} == {"upgrade-required"}
    cluster.label("n2", {SKIP: None})
    cluster.run_until(lambda: cluster.upgraded("n2"))
    assert not cluster.node("n2")["spec"].get("unschedulable")


def test_annotation_changes_wait_for_the_resync_label_changes_do_not(cluster: Cluster) -> None:
    cluster.annotate("n1", {REQUESTED: "true"})
    for _ in range(int((TIMINGS.upgrade_resync_s - 2) / TICK_S)):
        cluster.step()
        assert cluster.state("n1") == "upgrade-done"  # annotations are not watched
    cluster.run_until(lambda: cluster.state("n1") == "upgrade-required")
    # each label change is watched: the next state follows within a reconcile
    took = cluster.run_until(lambda: cluster.state("n1") == "cordon-required")
    assert took < TIMINGS.upgrade_resync_s
    assert REQUESTED not in (cluster.node("n1")["metadata"].get("annotations") or {})
    cluster.run_until(lambda: cluster.state("n1") == "upgrade-done")


def test_one_reconcile_takes_at_most_max_unavailable_rounded_up(cluster: Cluster) -> None:
    """maxParallelUpgrades 0 is unlimited, capped by maxUnavailable: 30% of 4 rounds up to 2."""
    cluster.upgrade_policy(maxParallelUpgrades=0, maxUnavailable="30%")
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: any(s == "cordon-required" for s in cluster.states().values()))
    assert sorted(cluster.states().values()) == [
        "cordon-required",
        "cordon-required",
        "upgrade-required",
        "upgrade-required",
    ]
    # the API's list order decides who goes first
    assert cluster.state("n1") == cluster.state("n2") == "cordon-required"


def test_max_parallel_upgrades_one_at_a_time(cluster: Cluster) -> None:
    cluster.upgrade_policy(maxParallelUpgrades=1, maxUnavailable="100%")
    cluster.policy({"version": NEW})
    peak = 0
    while not all(s == "upgrade-done" for s in cluster.states().values()) or peak == 0:
        cluster.step()
        peak = max(peak, cluster.in_progress())
        assert cluster.now < 1300
    assert peak == 1


def test_a_cordoned_node_counts_as_unavailable_yet_proceeds(cluster: Cluster) -> None:
    """maxUnavailable 1 is used up by n2, cordoned by someone: only n2 may start, and it
    stays cordoned afterwards (it was cordoned before)."""
    cluster.upgrade_policy(maxParallelUpgrades=0, maxUnavailable=1)
    cluster.cordon("n2")
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: cluster.upgraded("n2"))
    assert cluster.node("n2")["spec"].get("unschedulable") is True
    assert all(cluster.state(n) == "upgrade-required" for n in ("n1", "n3", "n4"))
    cluster.registry.patch(NODES, None, "n2", PatchType.MERGE, {"spec": {"unschedulable": None}})
    cluster.run_until(lambda: all(cluster.upgraded(n) for n in NODE_NAMES))


def test_failed_driver_install_fails_the_node_and_heals_once_the_pod_is_ready(
    cluster: Cluster,
) -> None:
    skip_all(cluster, but=("n3",))
    cluster.annotate("n3", {FAIL_KNOB: "true"})
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: cluster.state("n3") == "upgrade-failed")
    pod = cluster.driver_pods()["n3"]
    restarts = pod["status"]["containerStatuses"][0]["restartCount"]
    assert restarts > 10
    assert cluster.node("n3")["spec"].get("unschedulable") is True
    log = cluster.registry.read_log(
        OPERATOR_NAMESPACE, pod["metadata"]["name"], "nvidia-driver-ctr", None
    )
    assert "failed to build" in log
    for _ in range(10):
        cluster.step()
    assert cluster.state("n3") == "upgrade-failed"
    cluster.annotate("n3", {FAIL_KNOB: None})
    cluster.run_until(lambda: cluster.upgraded("n3"))
    assert not cluster.node("n3")["spec"].get("unschedulable")


def test_pod_deletion_evicts_and_a_budget_holds_it(cluster: Cluster) -> None:
    skip_all(cluster, but=("n1",))
    cluster.registry.create(
        PODS,
        "default",
        {
            "metadata": {
                "name": "train",
                "labels": {"app": "train"},
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": "train",
                        "uid": "j1",
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        },
    )
    cluster.registry.create(
        PODDISRUPTIONBUDGETS,
        "default",
        {
            "metadata": {"name": "train"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
        },
    )
    cluster.registry.create(
        PODS,
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
        },
    )
    cluster.run_until(
        lambda: cluster.registry.get(PODS, "default", "train")["status"].get("phase") == "Running"
    )
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: cluster.state("n1") == "pod-deletion-required")
    for _ in range(30):
        cluster.step()
    assert cluster.state("n1") == "pod-deletion-required"
    assert cluster.registry.find(PODS, "default", "train") is not None
    cluster.registry.delete(PODDISRUPTIONBUDGETS, "default", "train")
    cluster.run_until(lambda: cluster.upgraded("n1"))
    assert cluster.registry.find(PODS, "default", "train") is None
    # pod deletion takes only pods using GPUs; drain (disabled) would take the rest
    assert cluster.registry.find(PODS, "default", "web") is not None


def test_pod_deletion_gives_up_after_its_timeout(cluster: Cluster) -> None:
    skip_all(cluster, but=("n1",))
    cluster.upgrade_policy(podDeletion={"timeoutSeconds": 10})
    cluster.registry.create(
        PODS,
        "default",
        {
            "metadata": {"name": "bare"},
            "spec": {
                "nodeName": "n1",
                "containers": [
                    {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
                ],
            },
        },
    )
    cluster.policy({"version": NEW})
    # a pod no controller manages needs podDeletion.force: refused, the node fails
    cluster.run_until(lambda: cluster.state("n1") == "upgrade-failed")
    assert cluster.registry.find(PODS, "default", "bare") is not None


def test_auto_upgrade_off_strips_every_state_label(cluster: Cluster) -> None:
    skip_all(cluster)
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: cluster.state("n1") == "upgrade-required")
    cluster.upgrade_policy(autoUpgrade=False)
    cluster.run_until(lambda: all(s == "" for s in cluster.states().values()))


def test_driver_pod_restart_changes_the_nodes_driver_state(tmp_path: Path) -> None:
    roots = {name: tmp_path / name for name in NODE_NAMES}
    cluster = Cluster(roots)
    try:
        for root in roots.values():
            assert (root / DRIVER_VERSION_FILE).read_text() == OLD + "\n"
        skip_all(cluster, but=("n1",))
        cluster.policy({"version": NEW})
        cluster.run_until(lambda: cluster.upgraded("n1"))
        assert (roots["n1"] / DRIVER_VERSION_FILE).read_text() == NEW + "\n"
        assert (roots["n1"] / MODULE_VERSION_FILE).read_text() == NEW + "\n"
        assert (roots["n2"] / DRIVER_VERSION_FILE).read_text() == OLD + "\n"
        pod = cluster.driver_pods()["n1"]
        assert pod["metadata"]["annotations"][INSTALLED_ANNOTATION] == NEW
    finally:
        cluster.registry.close()


def test_no_driver_container_installs_while_the_driver_is_host_installed(tmp_path: Path) -> None:
    roots = {name: tmp_path / name for name in NODE_NAMES}
    cluster = Cluster(roots)
    try:
        (roots["n1"] / DRIVER_VERSION_FILE).write_text(NEW + "\n")  # apt put 550 there
        cluster.policy({"enabled": False, "version": OLD})
        old = cluster.driver_pods()["n1"]
        cluster.registry.delete(PODS, OPERATOR_NAMESPACE, old["metadata"]["name"])
        cluster.run_until(
            lambda: (
                (cluster.driver_pods().get("n1") or {}).get("status", {}).get("phase") == "Running"
            )
        )
        for _ in range(4):
            cluster.step()
        assert (roots["n1"] / DRIVER_VERSION_FILE).read_text() == NEW + "\n"
    finally:
        cluster.registry.close()


def test_drain_takes_the_other_pods_but_not_daemonsets_or_drain_skipped(cluster: Cluster) -> None:
    skip_all(cluster, but=("n1",))
    cluster.upgrade_policy(drain={"enable": True, "force": True})
    for name, labels in (
        ("web", {}),
        ("keep", {"nvidia.com/gpu-driver-upgrade-drain.skip": "true"}),
    ):
        cluster.registry.create(
            PODS,
            "default",
            {
                "metadata": {"name": name, "labels": labels},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]},
            },
        )
    plugin_pods = {
        p["metadata"]["uid"]
        for p in cluster.registry.list_objects(PODS, OPERATOR_NAMESPACE)
        if p["spec"].get("nodeName") == "n1" and "driver" not in p["metadata"]["name"]
    }
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: cluster.state("n1") == "drain-required")
    cluster.run_until(lambda: cluster.upgraded("n1"))
    assert cluster.registry.find(PODS, "default", "web") is None
    assert cluster.registry.find(PODS, "default", "keep") is not None
    still = {
        p["metadata"]["uid"]
        for p in cluster.registry.list_objects(PODS, OPERATOR_NAMESPACE)
        if p["spec"].get("nodeName") == "n1"
    }
    assert plugin_pods <= still  # drain ignores DaemonSet pods


def test_validation_times_out_to_upgrade_failed_which_then_clears_itself() -> None:
    """No Ready validator pod within the validation timeout fails the node; the driver pod
    is in sync and Ready, so the next reconcile clears upgrade-failed (FACTS.md)."""
    cluster = Cluster(timings=dataclasses.replace(TIMINGS, validation_timeout_s=8.0))
    try:
        skip_all(cluster, but=("n1",))
        cluster.probe.set_handlers("n1", {"runc"})  # operand pods cannot start any more
        for pod in cluster.registry.list_objects(PODS, OPERATOR_NAMESPACE):
            if pod["spec"].get("nodeName") == "n1" and "validator" in pod["metadata"]["name"]:
                cluster.registry.delete(PODS, OPERATOR_NAMESPACE, pod["metadata"]["name"])
        cluster.policy({"version": NEW})
        cluster.run_until(lambda: cluster.state("n1") == "validation-required")
        waited = cluster.run_until(lambda: cluster.state("n1") == "upgrade-failed")
        assert waited >= 8.0 - TIMINGS.upgrade_resync_s
        cluster.run_until(lambda: cluster.state("n1") != "upgrade-failed")
        assert cluster.state("n1") in ("uncordon-required", "upgrade-done")
    finally:
        cluster.registry.close()


def test_a_skipped_node_takes_no_slot_but_counts_as_unavailable(cluster: Cluster) -> None:
    cluster.upgrade_policy(maxParallelUpgrades=0, maxUnavailable=1)
    cluster.label("n2", {SKIP: "true"})
    cluster.cordon("n2")  # skipped, and cordoned by someone: uses up maxUnavailable 1
    skip_all(cluster, but=("n1", "n2"))
    cluster.policy({"version": NEW})
    cluster.run_until(lambda: cluster.state("n1") == "upgrade-required")
    for _ in range(int(2 * TIMINGS.upgrade_resync_s / TICK_S)):
        cluster.step()
    assert cluster.state("n1") == cluster.state("n2") == "upgrade-required"
    cluster.registry.patch(NODES, None, "n2", PatchType.MERGE, {"spec": {"unschedulable": None}})
    cluster.run_until(lambda: cluster.upgraded("n1"))
    assert cluster.state("n2") == "upgrade-required"  # skipped: never takes a slot
