"""The simulated cluster (kubelet, device plugin, scheduler, operator), seen through the client."""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client, watch

from rollout.lab.controlplane import ControlPlane
from rollout.lab.simulation import FixedRuntimeProbe, LabDescription, SimulationTimings
from rollout.lab.simulation.probe import ToolkitAction, ToolkitOutcome, handlers_in_dump
from tests.lab.labapi import patch_cluster_policy, wait_for
from tests.planning import sharing_config
from tests.sampler import sampling

UUIDS = {
    "lab-node-1": [
        "GPU-838f60d9-651f-9166-ea42-f9da674a6947",
        "GPU-5f3e2b1a-0c4d-4e8f-9a7b-1c2d3e4f5a6b",
    ],
    "lab-node-2": ["GPU-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"],
}
PRODUCT = "NVIDIA A100-SXM4-40GB"
FAST = SimulationTimings(
    tick_s=0.03,
    pod_start_s=0.03,
    smoke_run_s=0.15,
    device_plugin_grace_s=0.6,
    upgrade_dwell_s=0.03,
    upgrade_resync_s=0.3,
    pod_termination_s=0.05,
    crash_backoff_s=0.1,
    crash_backoff_max_s=0.4,
)


def lab_description() -> LabDescription:
    return LabDescription.from_dict(
        {
            "api": {"host": "127.0.0.1", "port": 0},
            "nodes": [
                {
                    "name": name,
                    "address": f"127.0.1.{i + 1}",
                    "containerd": "1.7",
                    "driver_version": "535.183.01",
                    "gpus": [
                        {"index": j, "product": PRODUCT, "uuid": uuid, "memory_mib": 40960}
                        for j, uuid in enumerate(uuids)
                    ],
                }
                for i, (name, uuids) in enumerate(UUIDS.items())
            ],
        }
    )


@pytest.fixture()
def probe() -> FixedRuntimeProbe:
    return FixedRuntimeProbe.with_nvidia(UUIDS)


@pytest.fixture()
def plane(probe: FixedRuntimeProbe) -> Iterator[ControlPlane]:
    with ControlPlane.start(lab_description(), probe, port=0, timings=FAST) as started:
        yield started


@pytest.fixture()
def api_url(plane: ControlPlane) -> str:
    return plane.url


def gpus(core: client.CoreV1Api, node: str) -> tuple[str | None, str | None]:
    status = core.read_node(node).status
    return status.capacity.get("nvidia.com/gpu"), status.allocatable.get("nvidia.com/gpu")


def plugin_pod(core: client.CoreV1Api, node: str) -> Any:
    pods = core.list_namespaced_pod(
        "gpu-operator",
        label_selector="app=nvidia-device-plugin-daemonset",
        field_selector=f"spec.nodeName={node}",
    ).items
    return next((p for p in pods if p.metadata.deletion_timestamp is None), None)


def plugins_configured(core: client.CoreV1Api, name: str) -> bool:
    """Every node's device plugin runs with CONFIG_NAME=name (the operator rolled them)."""
    for node in UUIDS:
        pod = plugin_pod(core, node)
        if pod is None or not pod.status.container_statuses:
            return False
        env = {e.name: e.value for e in pod.spec.containers[0].env or []}
        if env.get("CONFIG_NAME") != name or not pod.status.container_statuses[0].ready:
            return False
    return True


def gpu_pod(name: str, count: int, **spec: Any) -> dict[str, Any]:
    container = {
        "name": "cuda",
        "image": "cuda:12.4",
        "resources": {"limits": {"nvidia.com/gpu": str(count)}},
    }
    container.update(spec.pop("container", {}))
    return {
        "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def use_time_slicing(
    api: client.ApiClient,
    core: client.CoreV1Api,
    replicas: int,
    *,
    name: str = "time-slicing",
    key: str = "a100",
    default: str = "",
) -> None:
    """Publish one time-slicing profile under `key` of ConfigMap `name`; point the policy at it."""
    core.create_namespaced_config_map(
        "gpu-operator",
        {"metadata": {"name": name}, "data": {key: sharing_config(replicas)}},
    )
    patch_cluster_policy(api, {"devicePlugin": {"config": {"name": name, "default": default}}})


# ---------------------------------------------------------------------- start


def test_start_creates_gpu_nodes_operands_and_policy(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    node = core.read_node("lab-node-1")
    labels = node.metadata.labels
    assert labels["kubernetes.io/hostname"] == "lab-node-1"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "none"
    assert wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    operands = core.list_namespaced_pod(
        "gpu-operator", field_selector="spec.nodeName=lab-node-2"
    ).items
    names = sorted(re.sub(r"-[a-z0-9]{5}$", "", p.metadata.name) for p in operands)
    assert names == [
        "nvidia-container-toolkit-daemonset",
        "nvidia-device-plugin-daemonset",
        "nvidia-driver-daemonset",
        "nvidia-mig-manager",  # the lab's GPUs are MIG-capable A100s
        "nvidia-operator-validator",
    ]
    assert all(p.metadata.owner_references[0].kind == "DaemonSet" for p in operands)
    validator = core.list_namespaced_pod(
        "gpu-operator", label_selector="app=nvidia-operator-validator"
    ).items
    assert len(validator) == 2
    daemonset = client.AppsV1Api(api).read_namespaced_daemon_set(
        "nvidia-device-plugin-daemonset", "gpu-operator"
    )
    assert wait_for(
        lambda: (
            client.AppsV1Api(api)
            .read_namespaced_daemon_set("nvidia-device-plugin-daemonset", "gpu-operator")
            .status.number_ready
            == 2
        )
    )
    assert daemonset.status.desired_number_scheduled == 2
    policy = client.CustomObjectsApi(api).get_cluster_custom_object(
        "nvidia.com", "v1", "clusterpolicies", "cluster-policy"
    )
    assert policy["spec"]["devicePlugin"]["config"] == {"name": "", "default": ""}
    assert policy["spec"]["driver"]["version"] == "535.183.01"


# --------------------------------------------------------------- time-slicing


def test_time_slicing_follows_the_label_not_a_configmap_edit(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    use_time_slicing(api, core, replicas=4)
    core.patch_node(
        "lab-node-1", {"metadata": {"labels": {"nvidia.com/device-plugin.config": "a100"}}}
    )
    wait_for(lambda: gpus(core, "lab-node-1") == ("8", "8"))
    # The operator rolls the toolkit, then the plugins (their config env): let that finish.
    wait_for(lambda: plugins_configured(core, "time-slicing"))
    labels = core.read_node("lab-node-1").metadata.labels
    assert labels["nvidia.com/gpu.replicas"] == "4"
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB-SHARED"
    assert labels["nvidia.com/gpu.sharing-strategy"] == "time-slicing"
    assert labels["nvidia.com/gpu.count"] == "2"
    before = plugin_pod(core, "lab-node-1").metadata.name

    core.patch_namespaced_config_map(
        "time-slicing", "gpu-operator", {"data": {"a100": sharing_config(8)}}
    )
    time.sleep(0.4)  # many ticks: an edit alone reloads nothing (gpu-operator issue 1144)
    assert gpus(core, "lab-node-1") == ("8", "8")

    core.delete_namespaced_pod(before, "gpu-operator")
    wait_for(lambda: gpus(core, "lab-node-1") == ("16", "16"))
    assert plugin_pod(core, "lab-node-1").metadata.name != before
    assert core.read_node("lab-node-1").metadata.labels["nvidia.com/gpu.replicas"] == "8"


def test_default_profile_applies_after_the_operator_restarts_plugins(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    use_time_slicing(api, core, replicas=2, name="ts", key="two", default="two")
    wait_for(
        lambda: gpus(core, "lab-node-2") == ("2", "2") and gpus(core, "lab-node-1") == ("4", "4")
    )


# -------------------------------------------------------------- runtime handler


def lose_the_handler(core: client.CoreV1Api, probe: FixedRuntimeProbe) -> Any:
    """lab-node-1's containerd loses the nvidia handler once the node advertises its GPUs;
    returns the device plugin pod that ran then."""
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    running = plugin_pod(core, "lab-node-1")
    probe.set_handlers("lab-node-1", {"runc"})
    return running


def restore_the_handler(core: client.CoreV1Api, probe: FixedRuntimeProbe) -> None:
    """The handler comes back, and with it lab-node-1's GPUs."""
    probe.set_handlers("lab-node-1", {"runc", "nvidia"})
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))


def test_a_running_device_plugin_survives_losing_the_handler_until_its_pod_restarts(
    core: client.CoreV1Api, probe: FixedRuntimeProbe
) -> None:
    """KillMode=process: the handler's loss shows when the plugin's pod next starts."""
    running = lose_the_handler(core, probe)
    time.sleep(0.5)  # many ticks
    assert gpus(core, "lab-node-1") == ("2", "2")
    assert plugin_pod(core, "lab-node-1").metadata.uid == running.metadata.uid
    assert plugin_pod(core, "lab-node-1").status.phase == "Running"

    core.delete_namespaced_pod(running.metadata.name, "gpu-operator")
    lost_at = time.monotonic()
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "0"), timeout_s=0.5)
    # before the grace period: capacity unchanged
    assert time.monotonic() - lost_at < FAST.device_plugin_grace_s

    def sandbox_refused() -> Any:
        pod = plugin_pod(core, "lab-node-1")
        if pod is None or pod.metadata.uid == running.metadata.uid:
            return None
        events = core.list_namespaced_event(
            "gpu-operator",
            field_selector=f"involvedObject.name={pod.metadata.name},reason=FailedCreatePodSandBox",
        ).items
        return pod if events else None

    pod = wait_for(sandbox_refused)
    assert pod.status.phase == "Pending"
    wait_for(lambda: gpus(core, "lab-node-1") == (None, None))
    assert time.monotonic() - lost_at >= FAST.device_plugin_grace_s
    assert gpus(core, "lab-node-2") == ("1", "1")
    restore_the_handler(core, probe)


def test_a_reboot_restarts_operands_and_a_lost_handler_fails_the_plugin(
    core: client.CoreV1Api, probe: FixedRuntimeProbe
) -> None:
    before = lose_the_handler(core, probe)
    probe.set_state("lab-node-1", alive=False)
    wait_for(lambda: node_ready(core, "lab-node-1") == "Unknown")
    probe.set_state("lab-node-1", alive=True)

    def creating() -> bool:
        pod = plugin_pod(core, "lab-node-1")
        state = pod.status.container_statuses[0].state
        return state.waiting is not None and state.waiting.reason == "ContainerCreating"

    wait_for(creating)
    assert plugin_pod(core, "lab-node-1").metadata.uid == before.metadata.uid
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "0"))
    assert node_ready(core, "lab-node-1") == "True"
    assert ("lab-node-1", "start") in probe.toolkit_calls[2:]  # the toolkit pod ran again
    restore_the_handler(core, probe)
    restarted = plugin_pod(core, "lab-node-1").status.container_statuses[0]
    assert restarted.restart_count == 1 and restarted.ready


def node_ready(core: client.CoreV1Api, node: str) -> str | None:
    for condition in core.read_node(node).status.conditions or []:
        if condition.type == "Ready":
            return str(condition.status)
    return None


def test_ready_follows_the_node_and_its_containerd(
    core: client.CoreV1Api, probe: FixedRuntimeProbe
) -> None:
    wait_for(lambda: node_ready(core, "lab-node-2") == "True")
    wait_for(lambda: gpus(core, "lab-node-2") == ("1", "1"))
    probe.set_state("lab-node-2", containerd_active=False)
    wait_for(lambda: node_ready(core, "lab-node-2") == "False")
    ready = next(c for c in core.read_node("lab-node-2").status.conditions if c.type == "Ready")
    assert ready.message == "container runtime is down"
    assert gpus(core, "lab-node-2") == ("1", "1"), "running containers outlive containerd"
    probe.set_state("lab-node-2")
    wait_for(lambda: node_ready(core, "lab-node-2") == "True")
    probe.set_state("lab-node-2", alive=False)
    wait_for(lambda: node_ready(core, "lab-node-2") == "Unknown")
    ready = next(c for c in core.read_node("lab-node-2").status.conditions if c.type == "Ready")
    assert ready.reason == "NodeStatusUnknown"
    taints = {t.key for t in core.read_node("lab-node-2").spec.taints or []}
    assert "node.kubernetes.io/not-ready" in taints


def test_the_toolkit_pod_drives_the_toolkit_unit(
    core: client.CoreV1Api, probe: FixedRuntimeProbe
) -> None:
    wait_for(lambda: gpus(core, "lab-node-2") == ("1", "1"))
    assert probe.toolkit_calls.count(("lab-node-2", "start")) == 1
    plugin = plugin_pod(core, "lab-node-2")
    toolkit = core.list_namespaced_pod(
        "gpu-operator",
        label_selector="app=nvidia-container-toolkit-daemonset",
        field_selector="spec.nodeName=lab-node-2",
    ).items[0]
    core.delete_namespaced_pod(toolkit.metadata.name, "gpu-operator")
    wait_for(lambda: probe.toolkit_calls.count(("lab-node-2", "start")) == 2)
    calls = [action for node, action in probe.toolkit_calls if node == "lab-node-2"]
    assert calls == ["start", "stop", "start"]
    assert plugin_pod(core, "lab-node-2").metadata.uid == plugin.metadata.uid
    core.patch_node(
        "lab-node-2", {"metadata": {"labels": {"nvidia.com/gpu.deploy.container-toolkit": "false"}}}
    )
    wait_for(lambda: probe.toolkit_calls[-1] == ("lab-node-2", "stop"))
    assert gpus(core, "lab-node-2") == ("1", "1"), "a running plugin outlives the toolkit"


def test_a_crash_looping_plugin_backs_off_longer_each_time(
    core: client.CoreV1Api, plane: ControlPlane
) -> None:
    wait_for(lambda: gpus(core, "lab-node-2") == ("1", "1"))
    core.patch_node(
        "lab-node-2",
        {"metadata": {"annotations": {"lab.rollout/device-plugin-crash": "nvml: crashed"}}},
    )
    wait_for(lambda: gpus(core, "lab-node-2") == ("1", "0"))

    def restarts() -> int:
        return int(plugin_pod(core, "lab-node-2").status.container_statuses[0].restart_count)

    wait_for(lambda: restarts() >= 3, timeout_s=3)
    message = plugin_pod(core, "lab-node-2").status.container_statuses[0].state.waiting.message
    assert message.startswith("back-off 0.4s restarting failed container=")
    core.patch_node(
        "lab-node-2", {"metadata": {"annotations": {"lab.rollout/device-plugin-crash": None}}}
    )
    wait_for(lambda: gpus(core, "lab-node-2") == ("1", "1"))


def test_unhealthy_gpus_are_not_allocatable(core: client.CoreV1Api) -> None:
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    core.patch_node(
        "lab-node-1", {"metadata": {"annotations": {"lab.rollout/unhealthy-gpus": "0"}}}
    )
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "1"))
    core.create_namespaced_pod(
        "default", gpu_pod("two", 2, nodeSelector={"kubernetes.io/hostname": "lab-node-1"})
    )
    wait_for(
        lambda: (
            "1 Insufficient nvidia.com/gpu"
            in (
                core.read_namespaced_pod("two", "default").status.conditions
                or [client.V1PodCondition(type="x", status="x", message="")]
            )[0].message
        )
    )


# ------------------------------------------------------------------ scheduling


def test_gpu_pod_too_big_stays_pending_with_failed_scheduling(core: client.CoreV1Api) -> None:
    wait_for(lambda: gpus(core, "lab-node-2") == ("1", "1"))
    core.create_namespaced_pod("default", gpu_pod("big", 3))

    def unschedulable() -> Any:
        pod = core.read_namespaced_pod("big", "default")
        return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)

    condition = wait_for(unschedulable)
    assert (condition.status, condition.reason) == ("False", "Unschedulable")
    assert condition.message.startswith("0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    assert core.read_namespaced_pod("big", "default").status.phase == "Pending"
    events = wait_for(
        lambda: (
            core.list_namespaced_event(
                "default", field_selector="involvedObject.name=big,reason=FailedScheduling"
            ).items
        )
    )
    assert events[0].type == "Warning"
    assert events[0].message == condition.message
    assert events[0].source.component == "default-scheduler"


def test_cordoned_nodes_and_free_slots_decide_placement(core: client.CoreV1Api) -> None:
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    core.patch_node("lab-node-1", {"spec": {"unschedulable": True}})
    wait_for(
        lambda: any(
            t.key == "node.kubernetes.io/unschedulable"
            for t in core.read_node("lab-node-1").spec.taints or []
        )
    )
    core.create_namespaced_pod(
        "default", gpu_pod("first", 1, container={"command": ["sleep", "inf"]})
    )
    first = wait_for(lambda: core.read_namespaced_pod("first", "default").spec.node_name)
    assert first == "lab-node-2"
    wait_for(lambda: core.read_namespaced_pod("first", "default").status.phase == "Running")
    core.create_namespaced_pod("default", gpu_pod("second", 1))
    message = wait_for(
        lambda: next(
            (
                c.message
                for c in core.read_namespaced_pod("second", "default").status.conditions or []
                if c.reason == "Unschedulable"
            ),
            None,
        )
    )
    assert "1 Insufficient nvidia.com/gpu" in message
    assert "1 node(s) were unschedulable" in message
    core.patch_node("lab-node-1", {"spec": {"unschedulable": None}})
    assert wait_for(lambda: core.read_namespaced_pod("second", "default").spec.node_name) == (
        "lab-node-1"
    )


# ------------------------------------------------------------------ smoke pods


def test_smoke_pod_prints_nvidia_smi_list_of_its_gpus(core: client.CoreV1Api) -> None:
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))
    core.create_namespaced_pod(
        "default",
        gpu_pod(
            "smoke",
            2,
            runtimeClassName="nvidia",
            container={"command": ["nvidia-smi", "-L"]},
        ),
    )
    wait_for(lambda: core.read_namespaced_pod("smoke", "default").status.phase == "Succeeded")
    pod = core.read_namespaced_pod("smoke", "default")
    assert pod.spec.node_name == "lab-node-1"
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0
    log = core.read_namespaced_pod_log("smoke", "default")
    assert log == "".join(
        f"GPU {i}: {PRODUCT} (UUID: {uuid})\n" for i, uuid in enumerate(UUIDS["lab-node-1"])
    )
    assert re.fullmatch(r"(GPU \d+: .+ \(UUID: GPU-[0-9a-f-]{36}\)\n)+", log)


def test_smoke_pod_without_the_handler_cannot_start(
    core: client.CoreV1Api, probe: FixedRuntimeProbe
) -> None:
    probe.set_handlers("lab-node-2", {"runc"})
    core.create_namespaced_pod(
        "default",
        {
            "metadata": {"name": "smoke"},
            "spec": {
                "nodeName": "lab-node-2",
                "runtimeClassName": "nvidia",
                "restartPolicy": "Never",
                "containers": [
                    {"name": "c", "image": "cuda:12.4", "command": ["nvidia-smi", "-L"]}
                ],
            },
        },
    )
    events = wait_for(
        lambda: (
            core.list_namespaced_event(
                "default", field_selector="involvedObject.name=smoke,reason=FailedCreatePodSandBox"
            ).items
        )
    )
    assert 'no runtime for "nvidia" is configured' in events[0].message
    pod = core.read_namespaced_pod("smoke", "default")
    assert pod.status.phase == "Pending"
    assert pod.status.container_statuses[0].state.waiting.reason == "ContainerCreating"


# --------------------------------------------------------------------- upgrade


def upgrade_states(
    core: client.CoreV1Api, until: Callable[[dict[str, list[str]]], bool]
) -> dict[str, list[str]]:
    """Each node's sequence of upgrade-state labels, from a watch, until `until` holds."""
    seen: dict[str, list[str]] = {}
    stream = watch.Watch()
    for event in stream.stream(core.list_node, timeout_seconds=10):
        node = event["object"]
        state = (node.metadata.labels or {}).get("nvidia.com/gpu-driver-upgrade-state")
        history = seen.setdefault(node.metadata.name, [])
        if state and (not history or history[-1] != state):
            history.append(state)
        if until(seen):
            stream.stop()
    return seen


def upgraded(history: list[str]) -> bool:
    """Done again after the node was judged out of date."""
    return "upgrade-required" in history and history[-1] == "upgrade-done"


def set_driver_version(api: client.ApiClient, version: str) -> None:
    patch_cluster_policy(api, {"driver": {"version": version}})


def test_driver_upgrade_walks_every_node_through_the_states(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    wait_for(lambda: gpus(core, "lab-node-1") == ("2", "2"))

    def in_progress() -> list[int]:
        states = [
            (n.metadata.labels or {}).get("nvidia.com/gpu-driver-upgrade-state", "")
            for n in core.list_node().items
        ]
        return [sum(1 for s in states if s not in ("", "upgrade-done", "upgrade-required"))]

    with sampling(in_progress, 0.01) as at_once:
        set_driver_version(api, "550.90.07")
        seen = upgrade_states(core, lambda s: all(upgraded(s.get(n) or []) for n in UUIDS))
    expected = [
        "upgrade-required",
        "cordon-required",
        "wait-for-jobs-required",
        "pod-deletion-required",
        # no drain-required: drain.enable is false in the lab's policy
        "pod-restart-required",
        "validation-required",
        "uncordon-required",
        "upgrade-done",
    ]
    for node in UUIDS:
        # judged in sync first (upgrade-done), then out of date once the version moved
        assert seen[node] == ["upgrade-done", *expected]
        assert not core.read_node(node).spec.unschedulable
        assert core.read_node(node).metadata.labels["nvidia.com/cuda.driver-version.full"] == (
            "550.90.07"
        )
    assert max(at_once) == 1  # maxParallelUpgrades 1
    drivers = core.list_namespaced_pod("gpu-operator", label_selector="app=nvidia-driver-daemonset")
    assert {p.spec.containers[0].image for p in drivers.items} == {
        "nvidia/driver:550.90.07-ubuntu22.04"
    }


def test_failing_upgrade_leaves_the_node_failed_and_cordoned(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    core.patch_node(
        "lab-node-1", {"metadata": {"annotations": {"lab.rollout/fail-upgrade": "true"}}}
    )
    core.patch_node(
        "lab-node-2", {"metadata": {"labels": {"nvidia.com/gpu-driver-upgrade.skip": "true"}}}
    )
    set_driver_version(api, "550.90.07")
    seen = upgrade_states(core, lambda s: (s.get("lab-node-1") or [""])[-1] == "upgrade-failed")
    # the driver container restarted more than 10 times without becoming ready
    assert seen["lab-node-1"][-2:] == ["pod-restart-required", "upgrade-failed"]
    assert core.read_node("lab-node-1").spec.unschedulable is True
    time.sleep(0.2)
    # the skip label holds a node in upgrade-required (read only when it would leave it)
    labels = core.read_node("lab-node-2").metadata.labels
    assert labels["nvidia.com/gpu-driver-upgrade-state"] == "upgrade-required"


def test_upgrade_requested_by_annotation_keeps_a_precordoned_node_cordoned(
    core: client.CoreV1Api,
) -> None:
    core.patch_node(
        "lab-node-2",
        {
            "metadata": {"annotations": {"nvidia.com/gpu-driver-upgrade-requested": "true"}},
            "spec": {"unschedulable": True},
        },
    )
    seen = upgrade_states(core, lambda s: upgraded(s.get("lab-node-2") or []))
    assert seen["lab-node-2"][:2] == ["upgrade-done", "upgrade-required"]
    node = core.read_node("lab-node-2")
    assert node.spec.unschedulable is True
    assert "nvidia.com/gpu-driver-upgrade-requested" not in (node.metadata.annotations or {})
    assert seen.get("lab-node-1", []) in ([], ["upgrade-done"])


# ----------------------------------------------------------------------- probe


def test_running_config_dumps_of_both_layouts_name_their_handlers() -> None:
    v2 = {
        "plugins": {
            "io.containerd.grpc.v1.cri": {"containerd": {"runtimes": {"runc": {}, "nvidia": {}}}}
        }
    }
    v3 = {
        "plugins": {
            "io.containerd.cri.v1.runtime": {
                "containerd": {"runtimes": {"runc": {}, "nvidia-cdi": {}}}
            }
        }
    }
    registry_only = {"plugins": {"io.containerd.grpc.v1.cri": {"registry": {"config_path": "x"}}}}
    assert handlers_in_dump(v2) == {"runc", "nvidia"}
    assert handlers_in_dump(v3) == {"runc", "nvidia-cdi"}
    assert handlers_in_dump(registry_only) == set()


class StuckToolkitProbe(FixedRuntimeProbe):
    """A node whose toolkit unit never starts: the lab cannot settle."""

    def run_toolkit(self, node: str, action: ToolkitAction) -> ToolkitOutcome:
        return ToolkitOutcome(False, "Job for nvidia-container-toolkit.service failed")


def test_a_start_that_does_not_settle_says_which_nodes(caplog: pytest.LogCaptureFixture) -> None:
    """`lab up` returns unsettled when settle_s runs out; the toolkit would restart containerd
    later, under whatever runs next: the control plane's log says so, naming the nodes."""
    probe = StuckToolkitProbe.with_nvidia(UUIDS)
    timings = dataclasses.replace(FAST, settle_s=0.3)
    with (
        caplog.at_level(logging.WARNING, logger="rollout.lab.simulation"),
        ControlPlane.start(lab_description(), probe, port=0, timings=timings),
    ):
        pass
    said = [r.getMessage() for r in caplog.records if "not settled within" in r.getMessage()]
    assert said == ["not settled within 0.3s (toolkit or device plugin still starting): "
                    "lab-node-1, lab-node-2"]  # fmt: skip
