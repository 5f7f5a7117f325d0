"""The lab's MIG manager (rollout/lab/simulation/migmanager.py) and the simulated kubelet on a
MIG node, driven tick by tick on a registry with a clock of the test's own: one node with two
GPUs, its root a temporary directory (the layout file lands there, as on a real node)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.apiserver.patches import PatchType
from rollout.lab.apiserver.registry import Registry
from rollout.lab.apiserver.resources import CLUSTERPOLICIES, CONFIGMAPS, NODES, PODS
from rollout.lab.description import LabDescription
from rollout.lab.simulation import FixedRuntimeProbe, SimulationTimings
from rollout.lab.simulation.engine import Simulation
from rollout.lab.simulation.gpuoperator import CLUSTER_POLICY_NAME, OPERATOR_NAMESPACE
from rollout.lab.simulation.miglayouts import LAYOUT_FILE, REBOOT_KNOB_FILE, read_layout
from rollout.lab.simulation.migmanager import FAILED_ANNOTATION, PAUSED
from rollout.lab.simulation.probe import NodeCommandOutcome

NODE = "n1"
CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"
PLUGIN_DEPLOY = "nvidia.com/gpu.deploy.device-plugin"
PAUSED_KEYS = (
    PLUGIN_DEPLOY,
    "nvidia.com/gpu.deploy.gpu-feature-discovery",
    "nvidia.com/gpu.deploy.dcgm-exporter",
    "nvidia.com/gpu.deploy.operator-validator",
)
TIMINGS = SimulationTimings(
    tick_s=0.1,
    pod_start_s=0.0,
    smoke_run_s=0.1,
    device_plugin_grace_s=300.0,
    pod_termination_s=0.0,
    mig_step_s=1.0,
)
TICK_S = 0.5


class RecordingProbe(FixedRuntimeProbe):
    """Runs nothing; records each command run in the node and answers like an empty node."""

    def __init__(self) -> None:
        super().__init__({NODE: {"runc", "nvidia"}})
        self.commands: list[tuple[list[str], dict[str, str]]] = []

    def run_in_node(
        self, node: str, argv: Sequence[str], env: Mapping[str, str]
    ) -> NodeCommandOutcome | None:
        self.commands.append((list(argv), dict(env)))
        return NodeCommandOutcome(0, "")


class Cluster:
    """A one-node simulated cluster stepped by hand, TICK_S a step."""

    def __init__(self, root: Path) -> None:
        self.now = 1000.0
        self.root = root
        self.registry = Registry(clock=lambda: self.now)
        gpus = [
            {
                "index": i,
                "product": "NVIDIA A100-SXM4-40GB",
                "uuid": f"GPU-{i}",
                "memory_mib": 40960,
            }
            for i in range(2)
        ]
        lab = LabDescription.from_dict(
            {
                "nodes": [
                    {
                        "name": NODE,
                        "address": "127.0.9.1",
                        "containerd": "1.7",
                        "driver_version": "550.90.07",
                        "gpus": gpus,
                        "root": str(root),
                    }
                ]
            }
        )
        self.lab = lab
        self.probe = RecordingProbe()
        self.sim = Simulation(self.registry, lab, self.probe, TIMINGS, clock=lambda: self.now)
        self.sim.seed()
        self.run_until(lambda: self.allocatable().get("nvidia.com/gpu") == "2")

    def restart(self) -> None:
        """The control plane starts again over the same objects: every controller anew (this
        harness's toolkit stand-in does not survive it: no operand pod starts again after)."""
        self.sim.stop()
        self.sim = Simulation(self.registry, self.lab, self.probe, TIMINGS, clock=lambda: self.now)

    def step(self) -> None:
        self.now += TICK_S
        self.sim.step()

    def run_until(self, done: Callable[[], bool], max_s: float = 60.0) -> None:
        start = self.now
        while not done():
            assert self.now - start < max_s, f"not reached in {max_s}s: {self.labels()}"
            self.step()

    def node(self) -> dict[str, Any]:
        return self.registry.get(NODES, None, NODE)

    def labels(self) -> dict[str, str]:
        return dict(self.node()["metadata"].get("labels") or {})

    def allocatable(self) -> dict[str, str]:
        return dict(self.node()["status"].get("allocatable") or {})

    def plugin_resources(self) -> dict[str, str]:
        return {k: v for k, v in self.allocatable().items() if k.startswith("nvidia.com/")}

    def label(self, labels: dict[str, str | None]) -> None:
        patch = {"metadata": {"labels": labels}}
        self.registry.patch(NODES, None, NODE, PatchType.MERGE, patch)

    def annotate(self, annotations: dict[str, str | None]) -> None:
        patch = {"metadata": {"annotations": annotations}}
        self.registry.patch(NODES, None, NODE, PatchType.MERGE, patch)

    def strategy(self, name: str) -> None:
        patch = {"spec": {"mig": {"strategy": name}}}
        self.registry.patch(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME, PatchType.MERGE, patch)

    def configure(self, name: str) -> str:
        """Label the node for `name`; step until its MIG manager is done: the outcome."""
        self.label({CONFIG: name})
        self.step()  # the manager takes the label up at once
        self.run_until(lambda: self.labels()[STATE] in ("success", "failed"))
        return self.labels()[STATE]

    def settle(self, resources: dict[str, str]) -> None:
        self.run_until(lambda: self.plugin_resources() == resources)


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    built = Cluster(tmp_path / NODE)
    yield built
    built.sim.stop()
    built.registry.close()


def test_lab_up_labels_the_node_and_installs_the_layouts(cluster: Cluster) -> None:
    labels = cluster.labels()
    assert labels["nvidia.com/mig.capable"] == "true"
    assert labels[CONFIG] == "all-disabled" and labels[STATE] == "success"
    assert "nvidia.com/mig.strategy" not in labels
    configmap = cluster.registry.get(CONFIGMAPS, OPERATOR_NAMESPACE, "default-mig-parted-config")
    assert "all-balanced" in configmap["data"]["config.yaml"]
    policy = cluster.registry.get(CLUSTERPOLICIES, None, CLUSTER_POLICY_NAME)
    assert policy["spec"]["mig"] == {"strategy": "single"}
    assert policy["spec"]["migManager"]["enabled"] is True
    assert not (cluster.root / LAYOUT_FILE).exists()  # MIG disabled: no layout file at all


def test_a_layout_pauses_the_operands_applies_and_restores_them(cluster: Cluster) -> None:
    cluster.label({CONFIG: "all-1g.5gb"})
    cluster.step()
    assert cluster.labels()[STATE] == "pending"
    assert all(cluster.labels()[key] == PAUSED for key in PAUSED_KEYS)
    cluster.run_until(lambda: cluster.labels()[STATE] != "pending")
    labels = cluster.labels()
    assert labels[STATE] == "success"
    assert all(labels[key] == "true" for key in PAUSED_KEYS)
    layout = read_layout(cluster.root)
    assert layout.config == "all-1g.5gb" and layout.enabled == {0, 1}
    assert len(layout.devices) == 14
    cluster.settle({"nvidia.com/gpu": "14"})
    labels = cluster.labels()
    assert labels["nvidia.com/mig.strategy"] == "single"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
    assert labels["nvidia.com/gpu.count"] == "14"


def test_the_plugin_goes_while_paused(cluster: Cluster) -> None:
    cluster.label({CONFIG: "all-7g.40gb"})
    cluster.run_until(lambda: cluster.allocatable().get("nvidia.com/gpu") == "0")
    assert cluster.labels()[STATE] == "pending"
    cluster.run_until(lambda: cluster.labels()[STATE] == "success")
    assert read_layout(cluster.root).config == "all-7g.40gb"
    cluster.settle({"nvidia.com/gpu": "2"})


def test_mixed_strategy_advertises_each_profile(cluster: Cluster) -> None:
    cluster.strategy("mixed")
    assert cluster.configure("all-balanced") == "success"
    cluster.settle(
        {"nvidia.com/mig-1g.5gb": "4", "nvidia.com/mig-2g.10gb": "2", "nvidia.com/mig-3g.20gb": "2"}
    )
    labels = cluster.labels()
    assert labels["nvidia.com/mig.strategy"] == "mixed"
    assert labels["nvidia.com/mig-1g.5gb.count"] == "4"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    # and back to whole GPUs: the MIG resources and labels go
    assert cluster.configure("all-disabled") == "success"
    cluster.settle({"nvidia.com/gpu": "2"})
    assert not [k for k in cluster.labels() if k.startswith("nvidia.com/mig-")]
    assert "nvidia.com/mig.strategy" not in cluster.labels()


def smoke_pod(name: str, resource: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "restartPolicy": "Never",
            "nodeName": NODE,
            "containers": [
                {
                    "name": "smoke",
                    "image": "nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "command": ["nvidia-smi", "-L"],
                    "resources": {"limits": {resource: "1"}},
                }
            ],
        },
    }


def run_pod(cluster: Cluster, manifest: dict[str, Any]) -> dict[str, Any]:
    cluster.registry.ensure_namespace("default")
    cluster.registry.create(PODS, "default", manifest)
    name = manifest["metadata"]["name"]

    def ended() -> bool:
        pod = cluster.registry.get(PODS, "default", name)
        return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

    cluster.run_until(ended)
    return cluster.registry.get(PODS, "default", name)


@pytest.mark.parametrize(
    ("strategy", "resource"), [("mixed", "nvidia.com/mig-1g.5gb"), ("single", "nvidia.com/gpu")]
)
def test_a_pod_gets_one_mig_device(cluster: Cluster, strategy: str, resource: str) -> None:
    cluster.strategy(strategy)
    assert cluster.configure("all-1g.5gb") == "success"
    cluster.run_until(lambda: cluster.allocatable().get(resource) == "14")
    pod = run_pod(cluster, smoke_pod("smoke", resource))
    assert pod["status"]["phase"] == "Succeeded"
    argv, env = cluster.probe.commands[-1]
    assert argv == ["nvidia-smi", "-L"]
    uuids = {d.uuid for d in read_layout(cluster.root).devices}
    assert env["NVIDIA_VISIBLE_DEVICES"] in uuids


def test_an_unknown_layout_fails_and_changes_nothing(cluster: Cluster) -> None:
    cluster.label({CONFIG: "all-9g.80gb"})
    cluster.step()
    labels = cluster.labels()
    assert labels[STATE] == "failed"
    assert labels[PLUGIN_DEPLOY] == "true"
    assert not (cluster.root / LAYOUT_FILE).exists()
    cluster.label({CONFIG: "all-disabled"})
    cluster.step()
    assert cluster.labels()[STATE] == "success"


def test_the_broken_manager_fails_a_change_and_leaves_the_gpus(cluster: Cluster) -> None:
    assert cluster.configure("all-1g.5gb") == "success"
    before = read_layout(cluster.root)
    cluster.annotate({FAILED_ANNOTATION: "mig-parted: failed to create GPU instance"})
    cluster.label({CONFIG: "all-3g.20gb"})
    cluster.step()
    assert cluster.labels()[STATE] == "pending"
    cluster.run_until(lambda: cluster.labels()[STATE] != "pending")
    labels = cluster.labels()
    assert labels[STATE] == "failed"
    assert all(labels[key] == "true" for key in PAUSED_KEYS)
    assert read_layout(cluster.root) == before
    # back to the layout the GPUs have: nothing to change, success even while broken
    cluster.label({CONFIG: "all-1g.5gb"})
    cluster.step()
    assert cluster.labels()[STATE] == "success"
    assert read_layout(cluster.root) == before
    cluster.settle({"nvidia.com/gpu": "14"})


def test_a_mode_change_on_a_reboot_node_reboots_it_first(cluster: Cluster) -> None:
    knob = cluster.root / REBOOT_KNOB_FILE
    knob.parent.mkdir(parents=True, exist_ok=True)
    knob.write_text("")
    cluster.label({CONFIG: "all-2g.10gb"})
    cluster.run_until(lambda: cluster.labels()[STATE] == "rebooting")
    cluster.run_until(lambda: (["systemctl", "reboot"], {}) in cluster.probe.commands)
    for _ in range(10):  # the node has not rebooted yet: the manager waits
        cluster.step()
    assert cluster.labels()[STATE] == "rebooting"
    switched = read_layout(cluster.root)  # the mode is switched, the devices come after
    assert switched.enabled == {0, 1} and switched.devices == ()
    assert switched.config == "all-disabled"
    cluster.probe.set_state(NODE, alive=False)
    cluster.step()
    cluster.probe.set_state(NODE, alive=True)
    cluster.run_until(lambda: cluster.labels()[STATE] == "success")
    assert read_layout(cluster.root).config == "all-2g.10gb"
    cluster.settle({"nvidia.com/gpu": "6"})
    # a change that keeps MIG mode needs no reboot
    reboots = cluster.probe.commands.count((["systemctl", "reboot"], {}))
    assert cluster.configure("all-3g.20gb") == "success"
    assert read_layout(cluster.root).config == "all-3g.20gb"
    assert cluster.probe.commands.count((["systemctl", "reboot"], {})) == reboots


def test_a_restarted_manager_finishes_a_change_cut_short(cluster: Cluster) -> None:
    cluster.label({CONFIG: "all-1g.5gb"})
    cluster.step()
    assert all(cluster.labels()[key] == PAUSED for key in PAUSED_KEYS)
    cluster.restart()
    assert cluster.configure("all-1g.5gb") == "success"
    assert all(cluster.labels()[key] == "true" for key in PAUSED_KEYS)
    assert read_layout(cluster.root).config == "all-1g.5gb"


def test_a_manager_restarted_during_the_reboot_does_not_reboot_again(cluster: Cluster) -> None:
    knob = cluster.root / REBOOT_KNOB_FILE
    knob.parent.mkdir(parents=True, exist_ok=True)
    knob.write_text("")
    cluster.label({CONFIG: "all-7g.40gb"})
    cluster.run_until(lambda: cluster.labels()[STATE] == "rebooting")
    cluster.run_until(lambda: (["systemctl", "reboot"], {}) in cluster.probe.commands)
    cluster.probe.set_state(NODE, alive=False)
    cluster.restart()
    cluster.step()
    cluster.probe.set_state(NODE, alive=True)
    assert cluster.configure("all-7g.40gb") == "success"
    assert cluster.probe.commands.count((["systemctl", "reboot"], {})) == 1
    assert read_layout(cluster.root).config == "all-7g.40gb"
