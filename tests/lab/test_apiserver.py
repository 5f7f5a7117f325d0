"""The API emulator, driven through the official kubernetes client over HTTP."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client import ApiException

from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.apiserver.authentication import Authenticator
from rollout.lab.apiserver.faults import ApiFaultInjector
from rollout.lab.apiserver.rbac import ANONYMOUS, UserInfo
from rollout.lab.apiserver.resources import LEASES, NODES, PODS, ROLES, ResourceKind
from rollout.lab.apiserver.tables import format_age, to_table
from rollout.lab.faults import parse_fault_spec, read_fault_log, write_settings

CONFLICT_MESSAGE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


@pytest.fixture()
def registry() -> Registry:
    return Registry()


@pytest.fixture()
def api_url(registry: Registry) -> Iterator[str]:
    with ApiServer.start(registry) as server:
        yield server.url


def status_of(error: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(error.body)
    return body


def failure(
    code: int, reason: str, message: str, *, details: dict[str, str] | None = None
) -> dict[str, Any]:
    """The Status body of a failed request, every field as kube-apiserver writes it."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        status["details"] = details
    return status


def make_node(core: client.CoreV1Api, name: str, labels: dict[str, str] | None = None) -> Any:
    return core.create_node(
        {
            "metadata": {"name": name, "labels": labels or {}},
            "status": {
                "capacity": {"cpu": "8", "nvidia.com/gpu": "4"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
    )


def make_pod(
    core: client.CoreV1Api,
    name: str,
    labels: dict[str, str] | None = None,
    node: str | None = None,
    namespace: str = "default",
) -> Any:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox:1.36"}]}
    if node:
        spec["nodeName"] = node
    return core.create_namespaced_pod(
        namespace, {"metadata": {"name": name, "labels": labels or {}}, "spec": spec}
    )


def run_pod(core: client.CoreV1Api, name: str, namespace: str = "default") -> None:
    """Play kubelet: mark a pod Running and Ready through the status subresource."""
    core.patch_namespaced_pod_status(
        name,
        namespace,
        {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}},
    )


# ------------------------------------------------------------------ discovery


def test_discovery_and_version_answer_like_a_cluster(api: client.ApiClient) -> None:
    assert client.VersionApi(api).get_code().git_version.startswith("v1.")
    groups = {g.name for g in client.ApisApi(api).get_api_versions().groups}
    assert {"apps", "policy", "coordination.k8s.io", "nvidia.com"} <= groups
    resources = {r.name for r in client.CoreV1Api(api).get_api_resources().resources}
    assert {"nodes", "nodes/status", "pods", "pods/log", "pods/eviction"} <= resources


# ---------------------------------------------------------------------- nodes


def test_node_get_and_list_by_label_and_name(core: client.CoreV1Api) -> None:
    make_node(core, "gpu-1", {"pool": "a100"})
    make_node(core, "cpu-1", {"pool": "cpu"})
    assert core.read_node("gpu-1").metadata.labels == {"pool": "a100"}
    assert [n.metadata.name for n in core.list_node(label_selector="pool=a100").items] == ["gpu-1"]
    assert [
        n.metadata.name for n in core.list_node(field_selector="metadata.name=cpu-1").items
    ] == ["cpu-1"]
    listed = core.list_node()
    assert int(listed.metadata.resource_version) >= int(
        core.read_node("cpu-1").metadata.resource_version
    )


def test_strategic_merge_patch_changes_labels_annotations_and_cordon(
    core: client.CoreV1Api,
) -> None:
    make_node(core, "n1", {"keep": "yes", "drop": "me"})
    before = core.read_node("n1").metadata.resource_version
    patched = core.patch_node(
        "n1",
        {
            "metadata": {"labels": {"new": "1", "drop": None}, "annotations": {"a/b": "c"}},
            "spec": {"unschedulable": True},
        },
    )
    assert patched.metadata.labels == {"keep": "yes", "new": "1"}
    assert patched.metadata.annotations == {"a/b": "c"}
    assert patched.spec.unschedulable is True
    assert int(patched.metadata.resource_version) > int(before)


def test_json_patch_and_merge_patch_on_nodes(core: client.CoreV1Api) -> None:
    make_node(core, "n1", {"a": "1"})
    patched = core.patch_node(
        "n1",
        [
            {"op": "test", "path": "/metadata/labels/a", "value": "1"},
            {
                "op": "add",
                "path": "/metadata/labels/nvidia.com~1gpu.deploy.driver",
                "value": "false",
            },
            {"op": "remove", "path": "/metadata/labels/a"},
        ],
    )
    assert patched.metadata.labels == {"nvidia.com/gpu.deploy.driver": "false"}
    with pytest.raises(ApiException) as failed:
        core.patch_node("n1", [{"op": "test", "path": "/metadata/labels/x", "value": "1"}])
    assert failed.value.status == 422
    merged = core.patch_node(
        "n1",
        {"spec": {"unschedulable": True}},
        _content_type="application/merge-patch+json",
    )
    assert merged.spec.unschedulable is True


def test_taints_are_replaced_whole_by_strategic_merge(core: client.CoreV1Api) -> None:
    make_node(core, "n1")
    core.patch_node("n1", {"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]}})
    patched = core.patch_node("n1", {"spec": {"taints": [{"key": "b", "effect": "NoExecute"}]}})
    assert [(t.key, t.effect) for t in patched.spec.taints] == [("b", "NoExecute")]


def test_status_subresource_is_isolated_from_the_main_resource(core: client.CoreV1Api) -> None:
    make_node(core, "n1")
    main = core.patch_node(
        "n1", {"spec": {"unschedulable": True}, "status": {"capacity": {"nvidia.com/gpu": "0"}}}
    )
    assert main.status.capacity["nvidia.com/gpu"] == "4"
    assert main.spec.unschedulable is True
    status = core.patch_node_status(
        "n1",
        {
            "spec": {"unschedulable": False},
            "status": {"conditions": [{"type": "DiskPressure", "status": "False"}]},
        },
    )
    assert status.spec.unschedulable is True
    # status.conditions merges by type: Ready survives next to the new condition.
    assert {c.type for c in status.status.conditions} == {"Ready", "DiskPressure"}
    node = core.read_node("n1")
    node.status.capacity["nvidia.com/gpu"] = "8"
    node.spec.unschedulable = False
    replaced = core.replace_node_status("n1", node)
    assert replaced.status.capacity["nvidia.com/gpu"] == "8"
    assert replaced.spec.unschedulable is True


def test_stale_put_on_a_node_is_a_conflict(core: client.CoreV1Api) -> None:
    make_node(core, "n1")
    stale = core.read_node("n1")
    core.patch_node("n1", {"metadata": {"labels": {"moved": "on"}}})
    stale.metadata.labels = {"mine": "x"}
    with pytest.raises(ApiException) as conflict:
        core.replace_node("n1", stale)
    assert conflict.value.status == 409
    body = status_of(conflict.value)
    assert body["reason"] == "Conflict"
    assert body["message"] == f'Operation cannot be fulfilled on nodes "n1": {CONFLICT_MESSAGE}'
    assert body["details"] == {"name": "n1", "kind": "nodes"}
    fresh = core.read_node("n1")
    fresh.metadata.labels["mine"] = "x"
    assert core.replace_node("n1", fresh).metadata.labels == {"moved": "on", "mine": "x"}


def test_patch_carrying_an_old_resource_version_is_a_conflict(core: client.CoreV1Api) -> None:
    old = make_node(core, "n1").metadata.resource_version
    core.patch_node("n1", {"metadata": {"labels": {"x": "1"}}})
    with pytest.raises(ApiException) as conflict:
        core.patch_node("n1", {"metadata": {"resourceVersion": old, "labels": {"y": "2"}}})
    assert conflict.value.status == 409


def test_noop_update_keeps_the_resource_version(core: client.CoreV1Api) -> None:
    node = make_node(core, "n1", {"a": "1"})
    again = core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    assert again.metadata.resource_version == node.metadata.resource_version


# --------------------------------------------------------------------- errors


def test_not_found_is_a_status_body(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("nope", "default")
    assert missing.value.status == 404
    assert status_of(missing.value) == failure(
        404, "NotFound", 'pods "nope" not found', details={"name": "nope", "kind": "pods"}
    )


def test_create_twice_is_already_exists(core: client.CoreV1Api) -> None:
    make_node(core, "n1")
    with pytest.raises(ApiException) as exists:
        make_node(core, "n1")
    assert exists.value.status == 409
    body = status_of(exists.value)
    assert (body["reason"], body["message"]) == ("AlreadyExists", 'nodes "n1" already exists')


def test_invalid_bodies_are_422_with_causes(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as invalid:
        core.create_node({"metadata": {"name": "n1", "labels": {"ok": "not valid!"}}})
    body = status_of(invalid.value)
    assert invalid.value.status == 422
    assert body["reason"] == "Invalid"
    assert body["message"].startswith('Node "n1" is invalid: metadata.labels: Invalid value: ')
    assert body["details"]["causes"][0]["field"] == "metadata.labels"
    with pytest.raises(ApiException) as unnamed:
        core.create_namespaced_config_map("default", {"metadata": {}, "data": {"a": "b"}})
    assert unnamed.value.status == 422
    assert "metadata.name: Required value" in status_of(unnamed.value)["message"]
    with pytest.raises(ApiException) as no_containers:
        core.create_namespaced_pod(
            "default", {"metadata": {"name": "p"}, "spec": {"containers": []}}
        )
    assert status_of(no_containers.value)["details"]["causes"][0]["field"] == "spec.containers"


def test_bad_selectors_and_unknown_namespaces(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as bad_field:
        core.list_node(field_selector="status.phase=Running")
    assert bad_field.value.status == 400
    assert status_of(bad_field.value)["message"] == "field label not supported: status.phase"
    with pytest.raises(ApiException) as bad_label:
        core.list_node(label_selector="a in ()")
    assert bad_label.value.status == 400
    with pytest.raises(ApiException) as no_namespace:
        make_pod(core, "p", namespace="missing")
    assert no_namespace.value.status == 404
    assert status_of(no_namespace.value)["message"] == 'namespaces "missing" not found'
    assert {"default", "kube-system"} <= {n.metadata.name for n in core.list_namespace().items}


# ----------------------------------------------------------------------- pods


def test_pod_create_defaults_and_field_selectors(core: client.CoreV1Api) -> None:
    core.create_namespace({"metadata": {"name": "gpu-operator"}})
    created = make_pod(core, "a", node="n1")
    make_pod(core, "b", node="n2")
    make_pod(core, "c", node="n1", namespace="gpu-operator")
    make_pod(core, "d")
    run_pod(core, "b")
    assert created.status.phase == "Pending"
    assert created.metadata.uid and created.metadata.creation_timestamp
    on_n1 = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items
    assert sorted(p.metadata.name for p in on_n1) == ["a", "c"]
    not_n1 = core.list_namespaced_pod("default", field_selector="spec.nodeName!=n1").items
    assert sorted(p.metadata.name for p in not_n1) == ["b", "d"]
    unbound = core.list_namespaced_pod("default", field_selector="spec.nodeName=").items
    assert [p.metadata.name for p in unbound] == ["d"]
    running = core.list_pod_for_all_namespaces(field_selector="status.phase=Running").items
    assert [p.metadata.name for p in running] == ["b"]
    both = core.list_pod_for_all_namespaces(
        field_selector="metadata.namespace=gpu-operator,metadata.name=c"
    ).items
    assert [p.metadata.name for p in both] == ["c"]


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=web", ["w1", "w2"]),
        ("app==web", ["w1", "w2"]),
        ("app!=web", ["db", "plain"]),
        ("tier in (front,back)", ["db", "w1"]),
        ("tier notin (front)", ["db", "plain", "w2"]),
        ("tier", ["db", "w1"]),
        ("!tier", ["plain", "w2"]),
        ("app=web,!tier", ["w2"]),
        ("app in (web, db), tier notin (back)", ["w1", "w2"]),
    ],
)
def test_pod_label_selectors(core: client.CoreV1Api, selector: str, expected: list[str]) -> None:
    make_pod(core, "w1", {"app": "web", "tier": "front"})
    make_pod(core, "w2", {"app": "web"})
    make_pod(core, "db", {"app": "db", "tier": "back"})
    make_pod(core, "plain")
    found = core.list_namespaced_pod("default", label_selector=selector).items
    assert sorted(p.metadata.name for p in found) == expected


def test_pod_delete_returns_the_pod_and_removes_it(core: client.CoreV1Api) -> None:
    make_pod(core, "p", node="n1")
    deleted = core.delete_namespaced_pod("p", "default", grace_period_seconds=0)
    assert deleted.metadata.name == "p"
    with pytest.raises(ApiException) as gone:
        core.read_namespaced_pod("p", "default")
    assert gone.value.status == 404


def test_graceful_pod_deletion_passes_through_terminating() -> None:
    registry = Registry(pod_termination_s=0.3)
    with (
        ApiServer.start(registry) as server,
        client.ApiClient(client.Configuration(host=server.url)) as api_client,
    ):
        core = client.CoreV1Api(api_client)
        make_pod(core, "p", node="n1")
        run_pod(core, "p")
        deleted = core.delete_namespaced_pod("p", "default")
        assert deleted.metadata.deletion_timestamp is not None
        assert core.read_namespaced_pod("p", "default").metadata.deletion_grace_period_seconds
        time.sleep(0.6)
        with pytest.raises(ApiException) as gone:
            core.read_namespaced_pod("p", "default")
        assert gone.value.status == 404


def test_pod_log_is_plain_text(core: client.CoreV1Api, registry: Registry) -> None:
    make_pod(core, "p", node="n1")
    with pytest.raises(ApiException) as waiting:
        core.read_namespaced_pod_log("p", "default")
    assert waiting.value.status == 400
    assert "is waiting to start" in status_of(waiting.value)["message"]
    registry.mutate(
        PODS,
        "default",
        "p",
        lambda pod: pod["status"].update(
            phase="Running",
            containerStatuses=[
                {
                    "name": "main",
                    "image": "busybox:1.36",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {}},
                }
            ],
        ),
    )
    registry.write_log("default", "p", "main", "line one\nline two\n")
    assert core.read_namespaced_pod_log("p", "default") == "line one\nline two\n"
    assert core.read_namespaced_pod_log("p", "default", tail_lines=1) == "line two\n"


# ------------------------------------------------------------------- eviction


def evict(core: client.CoreV1Api, name: str) -> Any:
    return core.create_namespaced_pod_eviction(
        name,
        "default",
        client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace="default")),
    )


def make_budget(api: client.ApiClient, name: str, **spec: Any) -> None:
    client.PolicyV1Api(api).create_namespaced_pod_disruption_budget(
        "default",
        {"metadata": {"name": name}, "spec": {"selector": {"matchLabels": {"app": "web"}}, **spec}},
    )


def test_eviction_without_budget_deletes_the_pod(core: client.CoreV1Api) -> None:
    make_pod(core, "p", {"app": "web"}, node="n1")
    run_pod(core, "p")
    evict(core, "p")
    assert core.list_namespaced_pod("default").items == []


@pytest.mark.parametrize(
    ("budget", "running", "evictable"),
    [
        ({"minAvailable": 2}, 2, False),
        ({"minAvailable": 1}, 2, True),
        ({"minAvailable": "100%"}, 2, False),
        ({"minAvailable": "50%"}, 2, True),
        ({"maxUnavailable": 0}, 2, False),
        ({"maxUnavailable": 1}, 2, True),
        ({"maxUnavailable": "0%"}, 3, False),
        ({"maxUnavailable": "34%"}, 3, True),
    ],
)
def test_eviction_honours_the_disruption_budget(
    api: client.ApiClient,
    core: client.CoreV1Api,
    budget: dict[str, Any],
    running: int,
    evictable: bool,
) -> None:
    for i in range(running):
        make_pod(core, f"web-{i}", {"app": "web"}, node="n1")
        run_pod(core, f"web-{i}")
    make_budget(api, "web-pdb", **budget)
    if evictable:
        evict(core, "web-0")
        assert len(core.list_namespaced_pod("default").items) == running - 1
        return
    with pytest.raises(ApiException) as refused:
        evict(core, "web-0")
    assert refused.value.status == 429
    body = status_of(refused.value)
    assert body["reason"] == "TooManyRequests"
    assert body["message"] == "Cannot evict pod as it would violate the pod's disruption budget."
    cause = body["details"]["causes"][0]
    assert cause["reason"] == "DisruptionBudget"
    assert "web-pdb" in cause["message"]
    assert len(core.list_namespaced_pod("default").items) == running


def test_budget_status_is_computed_from_pods(api: client.ApiClient, core: client.CoreV1Api) -> None:
    for i in range(3):
        make_pod(core, f"web-{i}", {"app": "web"}, node="n1")
    run_pod(core, "web-0")
    run_pod(core, "web-1")
    make_budget(api, "web-pdb", minAvailable=1)
    status = (
        client.PolicyV1Api(api).read_namespaced_pod_disruption_budget("web-pdb", "default").status
    )
    assert (status.expected_pods, status.current_healthy, status.desired_healthy) == (3, 2, 1)
    assert status.disruptions_allowed == 1


# --------------------------------------------------------------------- leases


def test_lease_lock_create_renew_and_conflict(api: client.ApiClient) -> None:
    leases = client.CoordinationV1Api(api)
    lease = leases.create_namespaced_lease(
        "kube-system",
        {
            "metadata": {"name": "rollout"},
            "spec": {"holderIdentity": "run-1", "leaseDurationSeconds": 30},
        },
    )
    assert lease.spec.holder_identity == "run-1"
    with pytest.raises(ApiException) as taken:
        leases.create_namespaced_lease("kube-system", {"metadata": {"name": "rollout"}})
    assert taken.value.status == 409
    mine = leases.read_namespaced_lease("rollout", "kube-system")
    theirs = leases.read_namespaced_lease("rollout", "kube-system")
    mine.spec.renew_time = "2026-01-01T00:00:00.000000Z"
    renewed = leases.replace_namespaced_lease("rollout", "kube-system", mine)
    assert int(renewed.metadata.resource_version) > int(theirs.metadata.resource_version)
    theirs.spec.holder_identity = "run-2"
    with pytest.raises(ApiException) as conflict:
        leases.replace_namespaced_lease("rollout", "kube-system", theirs)
    assert conflict.value.status == 409
    assert status_of(conflict.value)["message"] == (
        f'Operation cannot be fulfilled on leases.coordination.k8s.io "rollout": {CONFLICT_MESSAGE}'
    )
    assert leases.read_namespaced_lease("rollout", "kube-system").spec.holder_identity == "run-1"


# ------------------------------------------------- configmaps, events, policy


def test_configmap_crud(core: client.CoreV1Api) -> None:
    core.create_namespaced_config_map(
        "default", {"metadata": {"name": "ts"}, "data": {"any": "version: v1\n"}}
    )
    patched = core.patch_namespaced_config_map("ts", "default", {"data": {"a100": "x"}})
    assert patched.data == {"any": "version: v1\n", "a100": "x"}
    deleted = core.delete_namespaced_config_map("ts", "default")
    assert deleted["status"] == "Success"
    assert core.list_namespaced_config_map("default").items == []


def test_events_list_by_involved_object(core: client.CoreV1Api) -> None:
    for name, pod in (("e1", "p1"), ("e2", "p2")):
        core.create_namespaced_event(
            "default",
            {
                "metadata": {"name": name},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": "default"},
                "reason": "FailedScheduling",
                "message": "0/1 nodes are available",
                "type": "Warning",
            },
        )
    found = core.list_namespaced_event("default", field_selector="involvedObject.name=p2").items
    assert [(e.metadata.name, e.reason) for e in found] == [("e2", "FailedScheduling")]


def test_cluster_policy_through_custom_objects_api(api: client.ApiClient) -> None:
    custom = client.CustomObjectsApi(api)
    args = ("nvidia.com", "v1", "clusterpolicies")
    custom.create_cluster_custom_object(
        *args,
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": "cluster-policy"},
            "spec": {"devicePlugin": {"config": {"name": "", "default": ""}}},
        },
    )
    patched = custom.patch_cluster_custom_object(
        *args, "cluster-policy", {"spec": {"devicePlugin": {"config": {"name": "time-slicing"}}}}
    )
    assert patched["spec"]["devicePlugin"]["config"] == {"name": "time-slicing", "default": ""}
    assert patched["metadata"]["generation"] == 2
    with pytest.raises(ApiException) as strategic:
        custom.patch_cluster_custom_object(
            *args,
            "cluster-policy",
            {"spec": {}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert strategic.value.status == 415
    listed = custom.list_cluster_custom_object(*args)
    assert [i["metadata"]["name"] for i in listed["items"]] == ["cluster-policy"]
    with pytest.raises(ApiException) as missing:
        custom.get_cluster_custom_object(*args, "other")
    assert status_of(missing.value)["message"] == ('clusterpolicies.nvidia.com "other" not found')


def test_daemonset_status_is_its_own_subresource(api: client.ApiClient) -> None:
    apps = client.AppsV1Api(api)
    template = {
        "metadata": {"labels": {"app": "x"}},
        "spec": {"containers": [{"name": "c", "image": "i:1"}]},
    }
    created = apps.create_namespaced_daemon_set(
        "default",
        {
            "metadata": {"name": "x"},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template},
        },
    )
    assert created.status.number_ready == 0
    apps.patch_namespaced_daemon_set_status("x", "default", {"status": {"numberReady": 2}})
    assert apps.read_namespaced_daemon_set("x", "default").status.number_ready == 2


# ---------------------------------------------------------------------- watch


def test_watch_streams_node_changes(core: client.CoreV1Api) -> None:
    make_node(core, "n1")
    seen: list[tuple[str, str]] = []

    def follow() -> None:
        stream = watch.Watch()
        for event in stream.stream(core.list_node, timeout_seconds=3):
            labels = event["object"].metadata.labels or {}
            seen.append((event["type"], labels.get("step", "")))
            if labels.get("step") == "2":
                stream.stop()

    follower = threading.Thread(target=follow)
    follower.start()
    time.sleep(0.3)
    core.patch_node("n1", {"metadata": {"labels": {"step": "1"}}})
    core.patch_node("n1", {"metadata": {"labels": {"step": "2"}}})
    follower.join(timeout=5)
    assert seen == [("ADDED", ""), ("MODIFIED", "1"), ("MODIFIED", "2")]


def test_a_watch_cut_by_the_labs_faults_ends_mid_stream_and_is_logged(
    registry: Registry, tmp_path: Path
) -> None:
    """`rollout lab faults kinds=watch-cut`: the official client's watch sees its stream end
    without the server's closing chunk, as when a connection drops; faults.log says so."""
    write_settings(tmp_path, parse_fault_spec("api-read=1,kinds=watch-cut", seed=1))
    with ApiServer.start(registry) as server:
        server.inject_faults(ApiFaultInjector(tmp_path))
        with client.ApiClient(client.Configuration(host=server.url)) as api:
            core = client.CoreV1Api(api)
            server.inject_faults(None)
            make_node(core, "n1")
            server.inject_faults(ApiFaultInjector(tmp_path))
            seen: list[str] = []
            started = time.monotonic()
            with pytest.raises(Exception) as cut:  # urllib3's ProtocolError, under any name
                for event in watch.Watch().stream(core.list_node, timeout_seconds=10):
                    seen.append(event["type"])
            assert time.monotonic() - started < 8, "the stream was cut, not timed out"
            assert seen == ["ADDED"]  # cut after the first events
    assert "ended" in str(cut.value).lower() or "incomplete" in str(cut.value).lower(), cut
    faults = read_fault_log(tmp_path)
    assert [f.fault for f in faults] == ["watch-cut"], faults
    assert "watch" in faults[0].request


# ------------------------------------------------------- tables, access reviews

TABLE_ACCEPT = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def get_raw(api_url: str, path: str, accept: str = "application/json") -> Any:
    request = urllib.request.Request(api_url + path, headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_a_table_is_served_when_kubectl_asks_for_one(api_url: str, core: client.CoreV1Api) -> None:
    make_node(core, "n1")
    core.patch_node("n1", {"spec": {"unschedulable": True}})
    listed = get_raw(api_url, "/api/v1/nodes", TABLE_ACCEPT)
    assert (listed["kind"], listed["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    names = [c["name"] for c in listed["columnDefinitions"]]
    assert names[:5] == ["Name", "Status", "Roles", "Age", "Version"]
    assert {c["name"] for c in listed["columnDefinitions"] if c["priority"] == 1} >= {
        "Internal-IP",
        "OS-Image",
        "Kernel-Version",
        "Container-Runtime",
    }
    row = listed["rows"][0]
    assert row["cells"][:3] == ["n1", "Ready,SchedulingDisabled", "<none>"]
    assert row["object"]["kind"] == "PartialObjectMetadata"
    assert row["object"]["metadata"]["name"] == "n1"
    assert listed["metadata"]["resourceVersion"].isdigit()
    one = get_raw(api_url, "/api/v1/nodes/n1?includeObject=Object", TABLE_ACCEPT)
    assert one["rows"][0]["object"]["status"]["capacity"]["nvidia.com/gpu"] == "4"
    assert get_raw(api_url, "/api/v1/nodes")["kind"] == "NodeList"


@pytest.mark.parametrize(
    ("seconds", "age"),
    [
        (-5, "<invalid>"),
        (-1, "0s"),
        (59, "59s"),
        (119, "119s"),
        (120, "2m"),
        (200, "3m20s"),
        (3599, "59m"),
        (3 * 3600 + 60, "3h1m"),
        (9 * 3600, "9h"),
        (50 * 3600, "2d2h"),
        (30 * 86400, "30d"),
        (3 * 365 * 86400 + 86400, "3y1d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_ages_read_as_kubectl_prints_them(seconds: int, age: str) -> None:
    assert format_age(seconds) == age


def cells_of(kind: ResourceKind, obj: dict[str, Any]) -> dict[str, Any]:
    table = to_table(kind, [obj], now_s=0)
    names = [c["name"] for c in table["columnDefinitions"]]
    return dict(zip(names, table["rows"][0]["cells"], strict=True))


def test_cells_print_a_field_or_what_kubectl_prints_for_an_empty_one() -> None:
    stamp = "2026-01-01T00:00:00Z"
    pod = cells_of(PODS, {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": {}})
    assert (pod["Node"], pod["IP"], pod["Nominated Node"]) == ("n1", "<none>", "<none>")
    node = cells_of(NODES, {"metadata": {"name": "n1"}, "status": {"nodeInfo": {"osImage": "x"}}})
    assert (node["OS-Image"], node["Kernel-Version"], node["Version"]) == ("x", "<unknown>", "")
    lease = cells_of(LEASES, {"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}})
    assert lease["Holder"] == "me"
    role = cells_of(ROLES, {"metadata": {"name": "r", "creationTimestamp": stamp}})
    assert role["Created At"] == stamp


def test_self_subject_access_review_is_answered_not_stored(
    api: client.ApiClient, api_url: str
) -> None:
    auth = client.AuthorizationV1Api(api)
    review = auth.create_self_subject_access_review(
        {"spec": {"resourceAttributes": {"verb": "patch", "resource": "nodes"}}}
    )
    assert review.status.allowed is True
    assert review.spec.resource_attributes.verb == "patch"
    with pytest.raises(ApiException) as invalid:
        auth.create_self_subject_access_review({"spec": {}})
    assert invalid.value.status == 422
    assert "exactly one of nonResourceAttributes or resourceAttributes" in invalid.value.body
    with pytest.raises(urllib.error.HTTPError) as listed:
        get_raw(api_url, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
    assert listed.value.code == 405


# --------------------------------------------------------------- RuntimeClass


def test_a_pod_naming_a_missing_runtime_class_is_refused_at_admission(
    api: client.ApiClient, core: client.CoreV1Api
) -> None:
    node_api = client.NodeV1Api(api)
    spec = {"runtimeClassName": "nvidia", "containers": [{"name": "c", "image": "cuda:12.4"}]}
    with pytest.raises(ApiException) as refused:
        core.create_namespaced_pod("default", {"metadata": {"name": "smoke"}, "spec": spec})
    assert refused.value.status == 403
    assert status_of(refused.value) == failure(
        403,
        "Forbidden",
        'pods "smoke" is forbidden: pod rejected: RuntimeClass "nvidia" not found',
        details={"name": "smoke", "kind": "pods"},
    )
    with pytest.raises(ApiException) as generated:
        core.create_namespaced_pod(
            "default", {"metadata": {"generateName": "smoke-"}, "spec": spec}
        )
    assert status_of(generated.value)["message"] == (
        'pods is forbidden: pod rejected: RuntimeClass "nvidia" not found'
    )
    node_api.create_runtime_class(
        {
            "metadata": {"name": "nvidia"},
            "handler": "nvidia",
            "overhead": {"podFixed": {"cpu": "10m"}},
        }
    )
    created = core.create_namespaced_pod("default", {"metadata": {"name": "smoke"}, "spec": spec})
    assert created.spec.overhead == {"cpu": "10m"}
    assert [rc.handler for rc in node_api.list_runtime_class().items] == ["nvidia"]


def test_runtime_class_handler_is_a_dns_label_and_immutable(api: client.ApiClient) -> None:
    node_api = client.NodeV1Api(api)
    with pytest.raises(ApiException) as invalid:
        node_api.create_runtime_class({"metadata": {"name": "bad"}, "handler": "Not_A_Label"})
    assert invalid.value.status == 422
    assert status_of(invalid.value)["message"].startswith(
        'RuntimeClass.node.k8s.io "bad" is invalid: handler: Invalid value: "Not_A_Label": '
        "a lowercase RFC 1123 label"
    )
    node_api.create_runtime_class({"metadata": {"name": "nvidia"}, "handler": "nvidia"})
    with pytest.raises(ApiException) as changed:
        node_api.patch_runtime_class("nvidia", {"handler": "nvidia-cdi"})
    assert status_of(changed.value)["message"] == (
        'RuntimeClass.node.k8s.io "nvidia" is invalid: handler: Invalid value: "nvidia-cdi": '
        "field is immutable"
    )


# ------------------------------------------------------- authentication, RBAC

RBAC_GROUP = "rbac.authorization.k8s.io"


def client_with_token(url: str, token: str) -> client.ApiClient:
    configuration = client.Configuration(host=url)
    configuration.api_key = {"authorization": token}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(configuration)


def bind(api: client.ApiClient, kind: str, role: str, rules: list[dict[str, Any]]) -> None:
    """Grant the ServiceAccount default/rollout `rules` through a Role or a ClusterRole."""
    rbac = client.RbacAuthorizationV1Api(api)
    subject = {"kind": "ServiceAccount", "name": "rollout", "namespace": "default"}
    ref = {"apiGroup": RBAC_GROUP, "kind": kind, "name": role}
    if kind == "ClusterRole":
        rbac.create_cluster_role({"metadata": {"name": role}, "rules": rules})
        rbac.create_cluster_role_binding(
            {"metadata": {"name": role}, "roleRef": ref, "subjects": [subject]}
        )
    else:
        rbac.create_namespaced_role("default", {"metadata": {"name": role}, "rules": rules})
        rbac.create_namespaced_role_binding(
            "default", {"metadata": {"name": role}, "roleRef": ref, "subjects": [subject]}
        )


def test_the_bootstrap_policy_is_served(api: client.ApiClient) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    admin = rbac.read_cluster_role("cluster-admin")
    assert admin.rules[0].verbs == ["*"] and admin.rules[1].non_resource_urls == ["*"]
    binding = rbac.read_cluster_role_binding("cluster-admin")
    assert [(s.kind, s.name) for s in binding.subjects] == [("Group", "system:masters")]


def test_an_unknown_token_is_401(api_url: str) -> None:
    with (
        client_with_token(api_url, "not-a-token") as stranger,
        pytest.raises(ApiException) as refused,
    ):
        client.CoreV1Api(stranger).list_node()
    assert refused.value.status == 401
    assert status_of(refused.value) == failure(401, "Unauthorized", "Unauthorized")


def test_anonymous_requests_on_a_real_server_are_forbidden() -> None:
    with (
        ApiServer.start(Registry(), authenticator=Authenticator(anonymous=ANONYMOUS)) as server,
        client.ApiClient(client.Configuration(host=server.url)) as anonymous,
    ):
        assert client.VersionApi(anonymous).get_code().git_version.startswith("v1.")
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(anonymous).list_node()
        assert refused.value.status == 403
        assert status_of(refused.value)["message"] == (
            'nodes is forbidden: User "system:anonymous" cannot list resource "nodes" in API '
            'group "" at the cluster scope'
        )
        assert status_of(refused.value)["details"] == {"kind": "nodes"}
        with pytest.raises(urllib.error.HTTPError) as discovery:
            get_raw(server.url, "/api")
        assert json.loads(discovery.value.read())["message"] == (
            'forbidden: User "system:anonymous" cannot get path "/api"'
        )


def test_a_service_account_token_is_held_to_its_roles(
    api: client.ApiClient, core: client.CoreV1Api, api_url: str
) -> None:
    make_node(core, "n1")
    make_pod(core, "web-0", {"app": "web"}, node="n1")
    run_pod(core, "web-0")
    core.create_namespaced_service_account("default", {"metadata": {"name": "rollout"}})
    issued = core.create_namespaced_service_account_token(
        "rollout", "default", {"spec": {"expirationSeconds": 3600}}
    )
    user = "system:serviceaccount:default:rollout"
    with client_with_token(api_url, issued.status.token) as as_rollout:
        sa_core = client.CoreV1Api(as_rollout)
        with pytest.raises(ApiException) as refused:
            sa_core.patch_node("n1", {"spec": {"unschedulable": True}})
        assert status_of(refused.value)["message"] == (
            f'nodes "n1" is forbidden: User "{user}" cannot patch resource "nodes" in API '
            'group "" at the cluster scope'
        )
        assert status_of(refused.value)["details"] == {"name": "n1", "kind": "nodes"}
        bind(
            api,
            "ClusterRole",
            "nodes",
            [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
        )
        sa_core.patch_node("n1", {"spec": {"unschedulable": True}})
        with pytest.raises(ApiException) as listing:
            sa_core.list_node()
        assert "cannot list resource" in status_of(listing.value)["message"]
        with pytest.raises(ApiException) as evicting:
            evict(sa_core, "web-0")
        assert status_of(evicting.value)["message"] == (
            f'pods "web-0" is forbidden: User "{user}" cannot create resource "pods/eviction" '
            'in API group "" in the namespace "default"'
        )
        bind(
            api,
            "Role",
            "evict",
            [
                {
                    "apiGroups": [""],
                    "resources": ["pods/eviction"],
                    "verbs": ["create"],
                    "resourceNames": ["web-0"],
                }
            ],
        )
        evict(sa_core, "web-0")
        review = client.AuthorizationV1Api(as_rollout).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"verb": "delete", "resource": "nodes"}}}
        )
        assert review.status.allowed is False
        core.delete_namespaced_service_account("rollout", "default")
        with pytest.raises(ApiException) as gone:
            sa_core.read_node("n1")
        assert gone.value.status == 401


def test_token_lifetimes_under_ten_minutes_are_invalid(core: client.CoreV1Api) -> None:
    core.create_namespaced_service_account("default", {"metadata": {"name": "rollout"}})
    with pytest.raises(ApiException) as invalid:
        core.create_namespaced_service_account_token(
            "rollout", "default", {"spec": {"expirationSeconds": 60}}
        )
    assert status_of(invalid.value)["message"] == (
        'TokenRequest.authentication.k8s.io "rollout" is invalid: spec.expirationSeconds: '
        "Invalid value: 60: may not specify a duration less than 10 minutes"
    )


@pytest.mark.parametrize("asked", [None, []])
def test_a_token_asked_for_no_audience_gets_the_servers(
    core: client.CoreV1Api, asked: list[str] | None
) -> None:
    core.create_namespaced_service_account("default", {"metadata": {"name": "rollout"}})
    spec = {} if asked is None else {"audiences": asked}
    granted = core.create_namespaced_service_account_token("rollout", "default", {"spec": spec})
    assert granted.spec.audiences == ["https://kubernetes.default.svc"]


def test_static_tokens_name_their_user(api: client.ApiClient) -> None:
    authenticator = Authenticator({"alice-token": UserInfo("alice", ("gpu-admins",))})
    with (
        ApiServer.start(Registry(), authenticator=authenticator) as server,
        client_with_token(server.url, "alice-token") as as_alice,
    ):
        review = client.AuthorizationV1Api(as_alice).create_self_subject_access_review(
            {"spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}}
        )
        assert review.status.allowed is False
        with pytest.raises(ApiException) as refused:
            client.CoreV1Api(as_alice).list_namespaced_pod("default")
        assert status_of(refused.value)["message"] == (
            'pods is forbidden: User "alice" cannot list resource "pods" in API group "" in '
            'the namespace "default"'
        )


def test_self_reviews_say_who_the_caller_is_and_what_it_may_do(
    api: client.ApiClient, core: client.CoreV1Api, api_url: str
) -> None:
    core.create_namespaced_service_account("default", {"metadata": {"name": "rollout"}})
    token = core.create_namespaced_service_account_token("rollout", "default", {}).status.token
    bind(api, "Role", "reader", [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}])
    with client_with_token(api_url, token) as as_rollout:
        who = client.AuthenticationV1Api(as_rollout).create_self_subject_review({})
        assert who.status.user_info.username == "system:serviceaccount:default:rollout"
        rules = client.AuthorizationV1Api(as_rollout).create_self_subject_rules_review(
            {"spec": {"namespace": "default"}}
        )
        assert {"list"} in [
            set(r.verbs) for r in rules.status.resource_rules if r.resources == ["pods"]
        ]
        elsewhere = client.AuthorizationV1Api(as_rollout).create_self_subject_rules_review(
            {"spec": {"namespace": "kube-system"}}
        )
        assert not [r for r in elsewhere.status.resource_rules if r.resources == ["pods"]]
