"""KubeClient against the API emulator served in-process (no lab, no root needed).

The same emulator the lab runs, started on a free port with an empty registry per test,
driven through KubeClient and therefore through the official client over HTTP.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.apiserver.resources import (
    CLUSTERPOLICIES,
    DAEMONSETS,
    EVENTS,
    NODES,
    NVIDIADRIVERS,
    PODS,
    RUNTIMECLASSES,
)
from rollout.lab.simulation.gpuoperator import to_nvidia_driver
from rollout.transports.errors import (
    Conflict,
    EvictionBlocked,
    Invalid,
    KubeConfigError,
    KubeUnreachable,
    NotFound,
)
from rollout.transports.kube import (
    ConfigMap,
    ContainerStatus,
    EventType,
    EvictionOutcome,
    KubeClient,
    Lease,
    Pod,
    RuntimeClass,
    Toleration,
)
from tests.kubeconfigs import write_kubeconfig
from tests.podbudgets import create_pod_budget


@pytest.fixture()
def registry() -> Registry:
    registry = Registry()
    registry.ensure_namespace("default")
    registry.ensure_namespace("kube-system")
    for index in (1, 2):
        registry.create(NODES, None, node_json(f"n{index}", {"gpu": "true"} if index == 1 else {}))
    return registry


@pytest.fixture()
def server(registry: Registry) -> Iterator[ApiServer]:
    with ApiServer.start(registry) as started:
        yield started


@pytest.fixture()
def kube(server: ApiServer) -> Iterator[KubeClient]:
    with KubeClient.from_url(server.url) as kube:
        yield kube


def node_json(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": {"cpu": "8", "nvidia.com/gpu": "4"},
            "allocatable": {"cpu": "7", "nvidia.com/gpu": "4"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "nodeInfo": {"containerRuntimeVersion": "containerd://1.7.24"},
        },
    }


def pod_manifest(name: str, node: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox:1.36"}]},
    }


def run_pod(registry: Registry, name: str) -> None:
    """Play kubelet: the pod runs and is Ready."""

    def change(pod: dict[str, Any]) -> None:
        pod["status"] = {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "ready": True, "state": {"running": {}}}],
        }

    registry.mutate(PODS, "default", name, change)


# ------------------------------------------------------------------ configuration


def test_from_kubeconfig_reads_a_path_and_a_context(server: ApiServer, tmp_path: Path) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", server.url)
    with KubeClient.from_kubeconfig(str(path), context="lab") as kube:
        assert kube.server == server.url
        assert [n.name for n in kube.list_nodes()] == ["n1", "n2"]


def test_from_kubeconfig_follows_the_kubeconfig_variable(
    server: ApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_kubeconfig(tmp_path / "kubeconfig", server.url)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{path}")
    with KubeClient.from_kubeconfig() as kube:
        assert kube.get_node("n1").name == "n1"


def test_a_missing_kubeconfig_or_context_is_bad_input(server: ApiServer, tmp_path: Path) -> None:
    with pytest.raises(KubeConfigError) as missing:
        KubeClient.from_kubeconfig(str(tmp_path / "nope"))
    assert missing.value.exit_code == 2
    assert "nope" in str(missing.value) and "hint:" in str(missing.value)
    path = write_kubeconfig(tmp_path / "kubeconfig", server.url)
    with pytest.raises(KubeConfigError) as context:
        KubeClient.from_kubeconfig(str(path), context="prod")
    assert "prod" in str(context.value)


def test_an_unreachable_server_is_transient_and_quick() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        KubeClient.from_url(f"http://127.0.0.1:{port}") as kube,
        pytest.raises(KubeUnreachable) as raised,
    ):
        kube.get_node("n1")
    assert str(raised.value).startswith("get node n1: API server unreachable")


# ------------------------------------------------------------------ nodes


def test_nodes_come_back_as_plain_data(kube: KubeClient) -> None:
    node = kube.get_node("n1")
    assert node.ready and not node.unschedulable
    assert node.labels["gpu"] == "true"
    assert node.capacity["nvidia.com/gpu"] == "4"
    assert kube.node_allocatable("n1")["cpu"] == "7"
    assert kube.node_capacity("n1")["cpu"] == "8"
    assert node.container_runtime_version == "containerd://1.7.24"
    assert [n.name for n in kube.list_nodes("gpu=true")] == ["n1"]
    with pytest.raises(TypeError):
        node.labels["x"] = "y"  # type: ignore[index]


def test_patch_labels_sets_and_removes(kube: KubeClient) -> None:
    kube.patch_node_labels("n1", {"rollout/state": "draining"})
    assert kube.get_node("n1").labels["rollout/state"] == "draining"
    node = kube.patch_node_labels("n1", {"rollout/state": None})
    assert "rollout/state" not in node.labels
    assert node.labels["gpu"] == "true"


def test_patch_annotations(kube: KubeClient) -> None:
    node = kube.patch_node_annotations("n2", {"rollout/run": "r1"})
    assert node.annotations["rollout/run"] == "r1"
    assert "rollout/run" not in kube.patch_node_annotations("n2", {"rollout/run": None}).annotations


def test_cordon_and_uncordon(kube: KubeClient) -> None:
    assert kube.set_unschedulable("n1", True).unschedulable
    assert kube.get_node("n1").unschedulable
    assert not kube.set_unschedulable("n1", False).unschedulable


def test_a_missing_node_is_not_found(kube: KubeClient) -> None:
    with pytest.raises(NotFound) as raised:
        kube.patch_node_labels("n9", {"a": "b"})
    assert str(raised.value).startswith("patch node n9: 404")
    assert "n9" in raised.value.message


# ------------------------------------------------------------------ pods


def test_pods_create_list_get_delete(kube: KubeClient, registry: Registry) -> None:
    created = kube.create_pod("default", pod_manifest("p1", "n1", {"app": "web"}))
    assert (created.namespace, created.name, created.node_name) == ("default", "p1", "n1")
    kube.create_pod("default", pod_manifest("p2", "n2"))
    run_pod(registry, "p1")
    pod = kube.get_pod("default", "p1")
    assert pod.phase == "Running" and pod.ready and pod.containers == ("main",)
    assert [p.name for p in kube.list_pods("default", label_selector="app=web")] == ["p1"]
    on_n2 = kube.list_pods(None, field_selector="spec.nodeName=n2")
    assert [p.name for p in on_n2] == ["p2"]
    assert kube.delete_pod("default", "p2", grace_period_s=0)
    assert kube.delete_pod("default", "p2", missing_ok=True) is False
    with pytest.raises(NotFound):
        kube.delete_pod("default", "p2")


def test_pod_gpu_request_reads_limits_then_requests(kube: KubeClient) -> None:
    manifest = pod_manifest("gpu", "n1")
    manifest["spec"]["containers"] = [
        {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}},
        {"name": "b", "image": "x", "resources": {"requests": {"nvidia.com/gpu": "1"}}},
        {"name": "c", "image": "x"},
    ]
    # The API refuses a GPU request without its limit, with kube-apiserver's words...
    with pytest.raises(Invalid) as refused:
        kube.create_pod("default", manifest)
    assert (
        "spec.containers[1].resources.limits: Required value: Limit must be set for non "
        "overcommitable resources"
    ) in str(refused.value)
    # ...and takes the request once it equals the limit.
    manifest["spec"]["containers"][1]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    kube.create_pod("default", manifest)
    assert kube.get_pod("default", "gpu").gpu_request == 3
    kube.create_pod("default", pod_manifest("cpu", "n1"))
    assert kube.get_pod("default", "cpu").gpu_request == 0


def test_pod_spec_for_diagnose(kube: KubeClient, registry: Registry) -> None:
    """Requests and limits of every resource, RuntimeClass, where it may run, init statuses."""
    registry.create(
        RUNTIMECLASSES,
        None,
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
        },
    )
    manifest = pod_manifest("train", "")
    del manifest["spec"]["nodeName"]
    manifest["spec"].update(
        {
            "runtimeClassName": "nvidia",
            "nodeSelector": {"gpu": "true"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"operator": "Exists", "tolerationSeconds": 30},
            ],
            "initContainers": [{"name": "wait-driver", "image": "busybox:1.36"}],
        }
    )
    manifest["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "500m", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "1", "nvidia.com/gpu": "1"},
    }
    kube.create_pod("default", manifest)

    def stuck(pod: dict[str, Any]) -> None:
        pod["status"] = {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                }
            ],
            "initContainerStatuses": [
                {
                    "name": "wait-driver",
                    "ready": False,
                    "restartCount": 4,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                }
            ],
        }

    registry.mutate(PODS, "default", "train", stuck)
    (pod,) = kube.list_pods("default")
    assert pod.runtime_class_name == "nvidia"
    assert dict(pod.node_selector) == {"gpu": "true"}
    # after ours, DefaultTolerationSeconds' not-ready and unreachable ones, as a real server
    assert pod.tolerations[:2] == (
        Toleration("nvidia.com/gpu", "Exists", "", "NoSchedule"),
        Toleration("", "Exists", toleration_seconds=30),
    )
    (main,) = pod.resources
    assert (main.name, dict(main.requests), dict(main.limits)) == (
        "main",
        {"cpu": "500m", "nvidia.com/gpu": "1"},
        {"cpu": "1", "nvidia.com/gpu": "1"},
    )
    assert pod.gpu_request == 1
    assert pod.stuck_init_container == ContainerStatus(
        "wait-driver", state="waiting", reason="CrashLoopBackOff", restart_count=4
    )
    assert pod.container_reasons == ("Init:CrashLoopBackOff",)
    assert pod.scheduling_message.startswith("0/2 nodes are available")


def test_runtime_classes(kube: KubeClient, registry: Registry) -> None:
    assert kube.list_runtime_classes() == []
    for name in ("nvidia", "nvidia-cdi"):
        registry.create(
            RUNTIMECLASSES,
            None,
            {
                "apiVersion": "node.k8s.io/v1",
                "kind": "RuntimeClass",
                "metadata": {"name": name},
                "handler": name,
            },
        )
    assert kube.list_runtime_classes() == [
        RuntimeClass("nvidia", "nvidia"),
        RuntimeClass("nvidia-cdi", "nvidia-cdi"),
    ]


def test_events_of_a_pod(kube: KubeClient, registry: Registry) -> None:
    def event(name: str, pod: str, reason: str, last: str, count: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod,
                "namespace": "default",
            },
            "reason": reason,
            "message": f"{reason} of {pod}",
            "type": "Warning",
            "count": count,
            "firstTimestamp": last,
            "lastTimestamp": last,
        }

    registry.create(
        EVENTS, "default", event("e2", "train", "FailedScheduling", "2026-11-30T10:05:00Z", 3)
    )
    registry.create(
        EVENTS, "default", event("e1", "train", "FailedCreate", "2026-11-30T10:00:00Z", 1)
    )
    registry.create(EVENTS, "default", event("e3", "other", "BackOff", "2026-11-30T10:01:00Z", 1))
    kube.create_event("default", "n1", "RolloutCordoned", "cordoned")
    found = kube.list_events(
        "default", field_selector="involvedObject.kind=Pod,involvedObject.name=train"
    )
    assert [(e.reason, e.count, e.event_type, e.involved_name) for e in found] == [
        ("FailedCreate", 1, "Warning", "train"),
        ("FailedScheduling", 3, "Warning", "train"),
    ]
    assert found[1].last_seen == datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
    assert len(kube.list_events(None)) == 4


def test_daemonsets_desired_and_ready(kube: KubeClient, registry: Registry) -> None:
    registry.ensure_namespace("gpu-operator")
    for name in ("nvidia-device-plugin-daemonset", "nvidia-driver-daemonset"):
        registry.create(
            DAEMONSETS,
            "gpu-operator",
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name, "labels": {"app": name}},
                "spec": {
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "main", "image": "x"}]},
                    },
                },
            },
        )

    def report(pod: dict[str, Any]) -> None:
        pod["status"].update(
            {
                "desiredNumberScheduled": 2,
                "currentNumberScheduled": 2,
                "numberReady": 1,
                "numberAvailable": 1,
                "updatedNumberScheduled": 2,
            }
        )

    registry.mutate(DAEMONSETS, "gpu-operator", "nvidia-driver-daemonset", report)
    (driver,) = kube.list_daemonsets("gpu-operator", label_selector="app=nvidia-driver-daemonset")
    assert (driver.name, driver.desired, driver.current, driver.ready, driver.available) == (
        "nvidia-driver-daemonset",
        2,
        2,
        1,
        1,
    )
    assert dict(driver.match_labels) == {"app": "nvidia-driver-daemonset"}
    assert {d.name: d.desired for d in kube.list_daemonsets(None)} == {
        "nvidia-device-plugin-daemonset": 0,
        "nvidia-driver-daemonset": 2,
    }
    assert kube.list_daemonsets("default") == []


def test_pod_from_json_tolerates_partial_statuses() -> None:
    """Init containers done, one starting after it, one never reported: only a fault counts."""
    pod = Pod.from_json(
        {
            "metadata": {"name": "p"},
            "status": {
                "initContainerStatuses": [
                    {"name": "a", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}},
                    {"name": "b", "state": {"waiting": {"reason": "PodInitializing"}}},
                    {"name": "c"},
                ]
            },
        }
    )
    assert pod.container_reasons == ()
    assert pod.stuck_init_container is not None and pod.stuck_init_container.name == "b"
    failed = Pod.from_json(
        {
            "metadata": {"name": "p"},
            "status": {
                "initContainerStatuses": [
                    {"name": "a", "state": {"terminated": {"reason": "Error", "exitCode": 1}}}
                ]
            },
        }
    )
    assert failed.container_reasons == ("Init:Error",)
    assert failed.runtime_class_name is None and failed.resources == ()


def test_an_invalid_pod_is_invalid(kube: KubeClient) -> None:
    with pytest.raises(Invalid) as raised:
        kube.create_pod("default", {"metadata": {"name": "bad"}, "spec": {"containers": []}})
    assert raised.value.status == 422


def test_pod_log(kube: KubeClient, registry: Registry) -> None:
    kube.create_pod("default", pod_manifest("smoke", "n1"))
    run_pod(registry, "smoke")
    registry.write_log("default", "smoke", "main", "GPU 0: NVIDIA A100\nGPU 1: NVIDIA A100\n")
    assert kube.read_pod_log("default", "smoke") == "GPU 0: NVIDIA A100\nGPU 1: NVIDIA A100\n"
    assert kube.read_pod_log("default", "smoke", tail_lines=1) == "GPU 1: NVIDIA A100\n"


def test_eviction_allowed_then_blocked_by_a_budget(kube: KubeClient, registry: Registry) -> None:

    for name in ("web-1", "web-2"):
        kube.create_pod("default", pod_manifest(name, "n1", {"app": "web"}))
        run_pod(registry, name)
    create_pod_budget(kube, "default", "web-pdb", "web")
    (budget,) = kube.list_pdbs("default")
    assert (budget.name, budget.disruptions_allowed, budget.match_labels["app"]) == (
        "web-pdb",
        1,
        "web",
    )
    assert kube.evict_pod("default", "web-1", grace_period_s=0) is EvictionOutcome.EVICTED
    with pytest.raises(EvictionBlocked) as blocked:
        kube.evict_pod("default", "web-2")
    assert blocked.value.pdb == "web-pdb"
    assert "evict pod default/web-2: 429" in str(blocked.value)
    assert kube.evict_pod("default", "never-was") is EvictionOutcome.GONE
    assert [b.name for b in kube.list_pdbs()] == ["web-pdb"]


# ------------------------------------------------------------------ configmaps, policy, events


def test_configmaps_are_optimistic(kube: KubeClient) -> None:
    created = kube.create_configmap(
        ConfigMap("default", "time-slicing", {"any": "version: v1\n"}, labels={"app": "rollout"})
    )
    assert created.resource_version
    with pytest.raises(Conflict):
        kube.create_configmap(ConfigMap("default", "time-slicing"))
    updated = kube.replace_configmap(created.with_data({"any": "version: v1\nsharing: {}\n"}))
    assert kube.get_configmap("default", "time-slicing").data == updated.data
    with pytest.raises(Conflict):
        kube.replace_configmap(created.with_data({"stale": "yes"}))


def test_cluster_policy_get_and_patch(kube: KubeClient, registry: Registry) -> None:
    registry.create(
        CLUSTERPOLICIES,
        None,
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy"},
            "spec": {"devicePlugin": {"config": {"name": "", "default": ""}}},
        },
    )
    assert [p["metadata"]["name"] for p in kube.list_cluster_policies()] == ["cluster-policy"]
    patched = kube.patch_cluster_policy(
        "cluster-policy", {"spec": {"devicePlugin": {"config": {"name": "time-slicing"}}}}
    )
    assert patched["spec"]["devicePlugin"]["config"] == {"name": "time-slicing", "default": ""}
    assert kube.get_cluster_policy("cluster-policy")["spec"] == patched["spec"]
    with pytest.raises(NotFound):
        kube.get_cluster_policy("other")


def test_nvidia_driver_list_get_and_patch(kube: KubeClient, registry: Registry) -> None:
    registry.create(NVIDIADRIVERS, None, to_nvidia_driver("pool-a", "535.183.01", {"p": "a"}))
    assert [d["metadata"]["name"] for d in kube.list_nvidia_drivers()] == ["pool-a"]
    patched = kube.patch_nvidia_driver("pool-a", {"spec": {"version": "550.90.07"}})
    assert patched["spec"]["version"] == "550.90.07"
    assert patched["spec"]["nodeSelector"] == {"p": "a"}
    assert kube.get_nvidia_driver("pool-a")["spec"] == patched["spec"]
    with pytest.raises(NotFound):
        kube.get_nvidia_driver("pool-b")


def test_events_on_a_node(kube: KubeClient) -> None:
    from kubernetes import client

    name = kube.create_event(
        "default", "n1", "RolloutCordoned", "cordoned by run r1", EventType.WARNING
    )
    assert name.startswith("n1.")
    core = client.CoreV1Api(client.ApiClient(client.Configuration(host=kube.server)))
    (event,) = core.list_namespaced_event("default", field_selector="involvedObject.name=n1").items
    assert (event.reason, event.type, event.involved_object.kind) == (
        "RolloutCordoned",
        "Warning",
        "Node",
    )


# ------------------------------------------------------------------ leases


def test_lease_create_renew_and_conflict(kube: KubeClient) -> None:
    now = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    lease = kube.create_lease(
        Lease(
            "kube-system",
            "rollout",
            holder_identity="run-1",
            lease_duration_s=30,
            acquire_time=now,
            renew_time=now,
        )
    )
    assert lease.resource_version and lease.renew_time == now and lease.holder_identity == "run-1"
    with pytest.raises(Conflict):
        kube.create_lease(Lease("kube-system", "rollout", holder_identity="run-2"))
    mine = kube.get_lease("kube-system", "rollout")
    theirs = kube.get_lease("kube-system", "rollout")
    from dataclasses import replace

    renewed = kube.replace_lease(replace(mine, renew_time=datetime.now(UTC)))
    assert renewed.resource_version != mine.resource_version
    with pytest.raises(Conflict) as stale:
        kube.replace_lease(replace(theirs, holder_identity="run-2", lease_transitions=1))
    assert "replace lease kube-system/rollout: 409" in str(stale.value)
    with pytest.raises(NotFound):
        kube.get_lease("kube-system", "absent")


def test_a_body_the_clients_models_reject_is_invalid(kube: KubeClient) -> None:
    manifest = pod_manifest("gpu", "n1")
    manifest["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    with pytest.raises(Invalid) as raised:
        kube.create_pod("default", manifest)
    assert "create pod default/gpu: rejected by the client" in str(raised.value)
    assert "resources.limits.nvidia.com/gpu" in str(raised.value)
