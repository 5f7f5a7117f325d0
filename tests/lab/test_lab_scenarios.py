"""`rollout lab break` and `heal` on the shared lab: each scenario's breakage is observable
on the node or through the API, and `heal` puts back exactly what was there (the bytes and
modes of /etc/containerd, labels, annotations, pods, RuntimeClasses, ConfigMaps, the
ClusterPolicy) with the node advertising its GPUs again."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lab.nodes import RUNNING_RECORD, NodeSpec
from rollout.lab.scenarios import (
    KERNEL_LOG,
    MISSING_PROFILE,
    MISSING_RUNTIME_CLASS,
    MODULE_VERSION_FILE,
    NVML_MISMATCH,
    POD_NAMESPACE,
    POD_PREFIX,
    RECORD_FILE,
    REGISTRY_DROP_IN,
    ROW_REMAP_FILE,
    SCENARIOS,
    UNHEALTHY_GPU,
    XID,
)
from rollout.lab.simulation.gpuoperator import (
    CLUSTER_POLICY_NAME,
    DEVICE_PLUGIN,
    OPERATOR_NAMESPACE,
    UPGRADE_STATE_LABEL,
    VALIDATOR,
)
from rollout.lab.simulation.kernellog import bus_of_gpu, parse_critical_xids
from rollout.lab.simulation.probe import handlers_in_dump
from rollout.lab.simulation.profiles import CONFIG_LABEL
from rollout.transports.kube import KubeClient
from tests.lab.labapi import Waiting, api_lab
from tests.lab.test_cluster_shared import TEST_GPUS, ssh_run

GPU = "nvidia.com/gpu"
settle = Waiting(timeout_s=60.0, interval_s=0.5)
# Which node each scenario breaks in the tests: 1.6, 1.7, 2.1 and the second 1.7 node.
NODE_OF = {
    "shadowing": "lab-node-4",
    "toolkit-dropin-removed": "lab-node-3",
    "containerd-bad-import": "lab-node-1",
    "profile-label-missing-key": "lab-node-2",
    "upgrade-failed": "lab-node-1",
    "slots-used": "lab-node-2",
    "requests-without-limits": "lab-node-3",
    "runtimeclass-missing": "lab-node-4",
    "not-ready": "lab-node-1",
    "plugin-crash-loop": "lab-node-2",
    "unhealthy-device": "lab-node-3",
    "driver-library-mismatch": "lab-node-4",
    "validator-stuck": "lab-node-3",
    "row-remap-pending": "lab-node-1",
}


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Lab:
    return api_lab(request)


def lab_cli(lab: Lab, *words: str) -> int:
    return main(["lab", *words, "--lab-dir", str(lab.lab_dir)])


def node_sh(lab: Lab, node: NodeSpec, script: str) -> tuple[int, str]:
    result = ssh_run(lab, node, ["sh", "-c", script])
    return result.exit_code, result.stdout + result.stderr


def handlers(lab: Lab, node: NodeSpec) -> set[str]:
    code, text = node_sh(lab, node, f"cat {RUNNING_RECORD}")
    return handlers_in_dump(tomllib.loads(text)) if code == 0 else set()


def allocatable(kube: KubeClient, node: str) -> str | None:
    return kube.node_allocatable(node).get(GPU)


def plugin_pod(kube: KubeClient, node: str) -> Any:
    pods = kube.list_pods(OPERATOR_NAMESPACE, field_selector=f"spec.nodeName={node}")
    return next((p for p in pods if p.name.startswith(DEVICE_PLUGIN.name)), None)


def plugin_log(kube: KubeClient, node: str) -> str:
    pod = plugin_pod(kube, node)
    return "" if pod is None else kube.read_pod_log(OPERATOR_NAMESPACE, pod.name)


def validator_pod(kube: KubeClient, node: str) -> Any:
    pods = kube.list_pods(OPERATOR_NAMESPACE, field_selector=f"spec.nodeName={node}")
    return next((p for p in pods if p.name.startswith(VALIDATOR.name) and not p.deleting), None)


def validators_ready(lab: Lab, kube: KubeClient) -> bool:
    """Every node's validator pod is Ready (one left waiting by a scenario is a finding)."""
    return all((pod := validator_pod(kube, n.name)) is not None and pod.ready for n in lab.nodes)


def crash_looping(kube: KubeClient, node: str) -> bool:
    pod = plugin_pod(kube, node)
    return pod is not None and "CrashLoopBackOff" in pod.container_reasons


@dataclass(frozen=True)
class LabState:
    """Everything a scenario may touch, as heal must leave it."""

    containerd_trees: tuple[str, ...]
    stand_ins: tuple[str, ...]
    nodes: tuple[tuple[str, tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]], ...]
    pods: frozenset[str]
    runtime_classes: frozenset[str]
    configmaps: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    device_plugin_config: str


TREE = (
    "cd / && find etc/containerd -printf '%p %y %m %U\\n' | sort"
    " && find etc/containerd -type f -print0 | sort -z | xargs -0 sha256sum"
)
STAND_INS = (
    f"for f in {KERNEL_LOG} {MODULE_VERSION_FILE} {ROW_REMAP_FILE}; do echo $f; cat $f 2>&1; done"
)


def capture_state(lab: Lab, kube: KubeClient) -> LabState:
    nodes = []
    for spec in lab.nodes:
        node = kube.get_node(spec.name)
        volatile = ("rollout.dev/",)
        annotations = tuple(
            sorted((k, v) for k, v in node.annotations.items() if not k.startswith(volatile))
        )
        nodes.append((spec.name, tuple(sorted(node.labels.items())), annotations))
    policy = kube.get_cluster_policy(CLUSTER_POLICY_NAME)
    return LabState(
        containerd_trees=tuple(node_sh(lab, n, TREE)[1] for n in lab.nodes),
        stand_ins=tuple(node_sh(lab, n, STAND_INS)[1] for n in lab.nodes),
        nodes=tuple(nodes),
        # Operand pods are the DaemonSets' to replace (a ClusterPolicy change restarts them).
        pods=frozenset(
            f"{p.namespace}/{p.name}" for p in kube.list_pods() if p.namespace != OPERATOR_NAMESPACE
        ),
        runtime_classes=frozenset(runtime_classes(lab)),
        configmaps=tuple(
            (c["metadata"]["name"], tuple(sorted((c.get("data") or {}).items())))
            for c in api_get(lab, f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/configmaps")["items"]
        ),
        device_plugin_config=repr((policy.get("spec") or {}).get("devicePlugin")),
    )


def api_get(lab: Lab, path: str) -> Any:
    import json
    import urllib.request

    with urllib.request.urlopen(lab.api_url + path, timeout=30) as response:
        return json.loads(response.read())


def runtime_classes(lab: Lab) -> list[str]:
    items = api_get(lab, "/apis/node.k8s.io/v1/runtimeclasses")["items"]
    return [i["metadata"]["name"] for i in items]


def all_advertise(lab: Lab, kube: KubeClient) -> bool:
    return all(
        allocatable(kube, n.name) == str(TEST_GPUS)
        and kube.node_capacity(n.name).get(GPU) == str(TEST_GPUS)
        for n in lab.nodes
    )


# ------------------------------------------------------------- observations


def observe_shadowing(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    assert node_sh(lab, node, f"cat {REGISTRY_DROP_IN}")[0] == 0
    assert "nvidia" not in handlers(lab, node)
    settle("the node to stop advertising GPUs", lambda: allocatable(kube, node.name) in (None, "0"))


def observe_toolkit_removed(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    assert node_sh(lab, node, "test -e /etc/containerd/conf.d/99-nvidia.toml")[0] != 0
    assert "nvidia" not in handlers(lab, node)
    settle("the node to stop advertising GPUs", lambda: allocatable(kube, node.name) in (None, "0"))


def observe_bad_import(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    _, state = node_sh(lab, node, "systemctl is-active containerd")
    assert state.strip() in ("failed", "activating"), state
    _, journal = node_sh(lab, node, "journalctl -u containerd --no-pager -n 50")
    assert "rollout-lab-missing.toml" in journal, journal[-2000:]
    # the kubelet reports the runtime down: the node goes NotReady (its running pods, the
    # device plugin's among them, keep running without containerd)
    settle("the node to go NotReady", lambda: not kube.get_node(node.name).ready)


def observe_profile(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    assert kube.get_node(node.name).labels.get(CONFIG_LABEL) == MISSING_PROFILE
    policy = kube.get_cluster_policy(CLUSTER_POLICY_NAME)
    name = policy["spec"]["devicePlugin"]["config"]["name"]
    assert MISSING_PROFILE not in kube.get_configmap(OPERATOR_NAMESPACE, name).data


def observe_upgrade_failed(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    import time

    # the label stays while the node's driver container keeps failing to install: the
    # upgrade controller clears upgrade-failed only once the driver pod is in sync and Ready
    time.sleep(2)
    assert kube.get_node(node.name).labels.get(UPGRADE_STATE_LABEL) == "upgrade-failed"


def observe_slots_used(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    pods = [
        p
        for p in kube.list_pods(POD_NAMESPACE, field_selector=f"spec.nodeName={node.name}")
        if p.name.startswith(f"{POD_PREFIX}-slots-") and p.phase == "Running"
    ]
    assert len(pods) == TEST_GPUS
    assert allocatable(kube, node.name) == str(TEST_GPUS)


def settle_scheduled(kube: KubeClient, name: str) -> None:
    """Diagnose reads the pod per node: wait until the scheduler has bound it."""
    settle(f"pod {name} to be bound", lambda: bool(kube.get_pod(POD_NAMESPACE, name).node_name))


def observe_no_limits(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    owner = f"{POD_PREFIX}-no-limits-{node.name}"
    # the API refused the pod: none exists, the controller's event carries the API's words
    assert not any(p.name.startswith(owner) for p in kube.list_pods(POD_NAMESPACE))
    (event,) = [
        e
        for e in kube.list_events(POD_NAMESPACE, field_selector="reason=FailedCreate")
        if e.involved_name == owner
    ]
    assert event.involved_kind == "ReplicaSet" and event.event_type == "Warning"
    assert (
        "is invalid: spec.containers[0].resources.limits: Required value: Limit must be set "
        "for non overcommitable resources"
    ) in event.message


def observe_runtimeclass(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    assert MISSING_RUNTIME_CLASS not in runtime_classes(lab)
    name = f"{POD_PREFIX}-runtimeclass-{node.name}"
    settle_scheduled(kube, name)
    pod = kube.get_pod(POD_NAMESPACE, name)
    assert pod.phase == "Pending"
    raw = api_get(lab, f"/api/v1/namespaces/{POD_NAMESPACE}/pods/{name}")
    assert raw["spec"]["runtimeClassName"] == MISSING_RUNTIME_CLASS


def observe_not_ready(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    settle("the node to be NotReady", lambda: not kube.get_node(node.name).ready)


def observe_crash_loop(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    settle("the device plugin to crash-loop", lambda: crash_looping(kube, node.name))
    settle("the node to stop advertising GPUs", lambda: allocatable(kube, node.name) in (None, "0"))
    # The log line (PLUGIN_CRASH_MESSAGE) is written, but the API emulator refuses logs of a
    # container waiting in CrashLoopBackOff, where a real server serves the last attempt's.


def observe_unhealthy(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    code, text = node_sh(lab, node, "dmesg")
    assert code == 0 and f"NVRM: Xid (PCI:{bus_of_gpu(UNHEALTHY_GPU)}): {XID}," in text
    settle(
        "capacity > allocatable",
        lambda: (
            kube.node_capacity(node.name).get(GPU) == str(TEST_GPUS)
            and allocatable(kube, node.name) == str(TEST_GPUS - 1)
        ),
    )
    uuid = node.gpus[UNHEALTHY_GPU].uuid
    assert f"XidCriticalError: Xid={XID} on Device={uuid}" in plugin_log(kube, node.name)


def observe_mismatch(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    code, text = node_sh(lab, node, "nvidia-smi -L")
    assert code == 18 and text.startswith(NVML_MISMATCH + "\n"), (code, text)
    settle("the device plugin to crash-loop", lambda: crash_looping(kube, node.name))
    settle("the node to stop advertising GPUs", lambda: allocatable(kube, node.name) in (None, "0"))


def observe_validator_stuck(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    def waiting() -> bool:
        pod = validator_pod(kube, node.name)
        return pod is not None and not pod.ready and "PodInitializing" in pod.container_reasons

    settle("the validator's replacement to wait, never Ready", waiting)
    assert allocatable(kube, node.name) == str(TEST_GPUS)  # the GPUs stay advertised


REMAP_QUERY = (
    "nvidia-smi --query-remapped-rows=gpu_bus_id,remapped_rows.pending,remapped_rows.failure"
    " --format=csv"
)


def observe_row_remap(lab: Lab, kube: KubeClient, node: NodeSpec) -> None:
    code, text = node_sh(lab, node, REMAP_QUERY)
    bus = bus_of_gpu(UNHEALTHY_GPU)
    assert code == 0 and f"{bus}.0, 1, 0" in text, (code, text)
    assert f"{bus_of_gpu(0)}.0, 0, 0" in text, text
    assert allocatable(kube, node.name) == str(TEST_GPUS)  # the plugin still advertises it


OBSERVE: dict[str, Callable[[Lab, KubeClient, NodeSpec], None]] = {
    "shadowing": observe_shadowing,
    "toolkit-dropin-removed": observe_toolkit_removed,
    "containerd-bad-import": observe_bad_import,
    "profile-label-missing-key": observe_profile,
    "upgrade-failed": observe_upgrade_failed,
    "slots-used": observe_slots_used,
    "requests-without-limits": observe_no_limits,
    "runtimeclass-missing": observe_runtimeclass,
    "not-ready": observe_not_ready,
    "plugin-crash-loop": observe_crash_loop,
    "unhealthy-device": observe_unhealthy,
    "driver-library-mismatch": observe_mismatch,
    "validator-stuck": observe_validator_stuck,
    "row-remap-pending": observe_row_remap,
}


# Scenarios the health gates read (a validator that never becomes Ready, row remaps DCGM's
# diagnostics fail on): observed here too, and their gate failures in
# tests/lab/test_gates_health.py on a lab of its own.
GATE_SCENARIOS = frozenset({"validator-stuck", "row-remap-pending"})
# Scenarios only a MIG reconfiguration shows: broken, read and healed by tests/lab/test_lab_mig.py.
MIG_SCENARIOS = frozenset({"mig-mode-needs-reboot", "mig-manager-failed"})
OBSERVED = [s.name for s in SCENARIOS if s.name not in MIG_SCENARIOS]


def test_every_scenario_is_covered() -> None:
    assert set(OBSERVE) == set(OBSERVED) == set(NODE_OF)
    assert set(OBSERVED) >= GATE_SCENARIOS
    assert {s.name for s in SCENARIOS} >= GATE_SCENARIOS | MIG_SCENARIOS
    gate_tests = Path(__file__).with_name("test_gates_health.py").read_text()
    assert all(f'"{name}"' in gate_tests for name in GATE_SCENARIOS)
    mig_tests = Path(__file__).with_name("test_lab_mig.py").read_text()
    assert all(f'"{name}"' in mig_tests for name in MIG_SCENARIOS)


def test_critical_xids_are_read_by_bus_and_ignored_ones_skipped() -> None:
    text = (
        f"[1.0] NVRM: Xid (PCI:{bus_of_gpu(1)}): 79, pid=0, name=x, GPU has fallen off the bus.\n"
        f"[2.0] NVRM: Xid (PCI:{bus_of_gpu(0)}): 13, pid=7, name=app, Graphics Exception\n"
        "[3.0] NVRM: Xid (PCI:0000:99:00): 48, pid=0, DBE\n"
    )
    assert parse_critical_xids(text, [0, 1]) == {1: 79}


@pytest.mark.lab
@pytest.mark.parametrize("scenario", OBSERVED)
def test_break_is_observable_and_heal_restores_the_lab(
    lab: Lab, kube: KubeClient, scenario: str
) -> None:
    node = lab.find_node(NODE_OF[scenario])
    settle("every node to advertise its GPUs", lambda: all_advertise(lab, kube))
    before = capture_state(lab, kube)
    try:
        assert lab_cli(lab, "break", scenario, node.name) == 0
        assert (lab.lab_dir / RECORD_FILE).stat().st_mode & 0o077 == 0
        OBSERVE[scenario](lab, kube, node)
        assert lab_cli(lab, "break", scenario, node.name) == 2  # already broken
    finally:
        assert lab_cli(lab, "heal", node.name) == 0
    assert not (lab.lab_dir / RECORD_FILE).exists()
    settle("every node to advertise its GPUs again", lambda: all_advertise(lab, kube))
    settle("every validator to be Ready again", lambda: validators_ready(lab, kube))
    settle(
        "the scenario's pods to be gone",
        lambda: not any(p.name.startswith(POD_PREFIX) for p in kube.list_pods(POD_NAMESPACE)),
    )
    after = capture_state(lab, kube)
    assert after == before
    assert all("nvidia" in handlers(lab, n) for n in lab.nodes)


@pytest.mark.lab
def test_break_refuses_a_2x_node_for_a_1x_scenario_and_unknown_names(lab: Lab) -> None:
    assert lab_cli(lab, "break", "shadowing", "lab-node-3") == 2
    assert lab_cli(lab, "break", "no-such-scenario") == 2
    assert lab_cli(lab, "break", "not-ready", "lab-node-99") == 2
    assert not (lab.lab_dir / RECORD_FILE).exists()
    assert lab_cli(lab, "heal") == 0


def test_break_and_heal_without_a_lab_say_so(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    lab_dir = str(tmp_path / "none")
    assert main(["lab", "break", "no-such-scenario", "--lab-dir", lab_dir]) == 2
    assert "unknown scenario 'no-such-scenario'; known: shadowing," in capsys.readouterr().err
    assert main(["lab", "heal", "--lab-dir", lab_dir]) == 1
    assert "no lab at" in capsys.readouterr().err
