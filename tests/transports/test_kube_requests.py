"""What KubeClient sends on the wire: each operation's method, path, query, Content-Type,
body, headers and timeout, as the official client's generated methods sent them.

The client's connection pool is replaced by a recorder that answers every request with 200
and one JSON object, so these check the requests alone, with no server.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
import urllib3

from rollout.transports.kube import ConfigMap, KubeClient, Lease, Secret

ANSWER = {
    "metadata": {"name": "x", "namespace": "ns", "resourceVersion": "1", "uid": "u"},
    "items": [],
}
NOW = datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p"},
    "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]},
}


@dataclass(frozen=True)
class Sent:
    method: str
    url: str
    headers: dict[str, str]
    body: Any
    timeout_s: tuple[float | None, float | None]


@pytest.fixture()
def wire() -> Iterator[tuple[KubeClient, list[Sent]]]:
    sent: list[Sent] = []

    def record(method: str, url: str, **kw: Any) -> urllib3.HTTPResponse:
        body = kw.get("body")
        timeout = kw["timeout"]
        sent.append(
            Sent(
                method,
                url.removeprefix("http://api.test"),
                dict(kw["headers"]),
                json.loads(body) if body else None,
                (timeout.connect_timeout, timeout.read_timeout),
            )
        )
        return urllib3.HTTPResponse(
            body=json.dumps(ANSWER).encode(), status=200, preload_content=False
        )

    with KubeClient.from_url("http://api.test") as kube:
        kube._api.configuration.api_key = {"BearerToken": "t0ken"}
        kube._api.configuration.api_key_prefix = {"BearerToken": "Bearer"}
        kube._api.rest_client.pool_manager.request = record
        yield kube, sent


Call = Callable[[KubeClient], object]

# (operation, the requests it sends: method and path with query, the Content-Type if any)
CASES: list[tuple[str, Call, list[tuple[str, str | None]]]] = [
    ("get node", lambda k: k.get_node("n1"), [("GET /api/v1/nodes/n1", None)]),
    (
        "list nodes",
        lambda k: k.list_nodes("a=b"),
        [("GET /api/v1/nodes?labelSelector=a%3Db", None)],
    ),
    (
        "cordon",
        lambda k: k.set_unschedulable("n1", True),
        [("PATCH /api/v1/nodes/n1", "application/merge-patch+json")],
    ),
    (
        "list pods",
        lambda k: k.list_pods("ns", "a=b", "f=1"),
        [("GET /api/v1/namespaces/ns/pods?fieldSelector=f%3D1&labelSelector=a%3Db", None)],
    ),
    (
        "list pods everywhere",
        lambda k: k.list_pods(None, None, "spec.nodeName=n1"),
        [("GET /api/v1/pods?fieldSelector=spec.nodeName%3Dn1", None)],
    ),
    ("create pod", lambda k: k.create_pod("ns", POD), [("POST /api/v1/namespaces/ns/pods", None)]),
    (
        "delete pod",
        lambda k: k.delete_pod("ns", "p", 5),
        [("DELETE /api/v1/namespaces/ns/pods/p?gracePeriodSeconds=5", None)],
    ),
    (
        "pod log",
        lambda k: k.read_pod_log("ns", "p", "c", 10),
        [("GET /api/v1/namespaces/ns/pods/p/log?container=c&tailLines=10", None)],
    ),
    (
        "evict",
        lambda k: k.evict_pod("ns", "p", 3),
        [
            ("GET /api/v1/namespaces/ns/pods/p", None),
            ("POST /api/v1/namespaces/ns/pods/p/eviction", None),
        ],
    ),
    ("pdbs", lambda k: k.list_pdbs(), [("GET /apis/policy/v1/poddisruptionbudgets", None)]),
    (
        "daemonsets",
        lambda k: k.list_daemonsets("ns", "app=x"),
        [("GET /apis/apps/v1/namespaces/ns/daemonsets?labelSelector=app%3Dx", None)],
    ),
    (
        "runtimeclasses",
        lambda k: k.list_runtime_classes(),
        [("GET /apis/node.k8s.io/v1/runtimeclasses", None)],
    ),
    (
        "replace configmap",
        lambda k: k.replace_configmap(ConfigMap("ns", "x", {"k": "v"}, resource_version="1")),
        [("PUT /api/v1/namespaces/ns/configmaps/x", None)],
    ),
    (
        "create secret",
        lambda k: k.create_secret(Secret("ns", "x", {"k": "v"})),
        [("POST /api/v1/namespaces/ns/secrets", None)],
    ),
    (
        "patch clusterpolicy",
        lambda k: k.patch_cluster_policy("cp", {"spec": {"a": None}}),
        [("PATCH /apis/nvidia.com/v1/clusterpolicies/cp", "application/merge-patch+json")],
    ),
    (
        "nvidiadrivers",
        lambda k: k.list_nvidia_drivers(),
        [("GET /apis/nvidia.com/v1alpha1/nvidiadrivers", None)],
    ),
    (
        "event",
        lambda k: k.create_event("default", "n1", "R", "msg"),
        [("POST /api/v1/namespaces/default/events", None)],
    ),
    (
        "events",
        lambda k: k.list_events("ns", "involvedObject.name=n1"),
        [("GET /api/v1/namespaces/ns/events?fieldSelector=involvedObject.name%3Dn1", None)],
    ),
    (
        "create lease",
        lambda k: k.create_lease(Lease("ns", "x", holder_identity="h", renew_time=NOW)),
        [("POST /apis/coordination.k8s.io/v1/namespaces/ns/leases", None)],
    ),
]


@pytest.mark.parametrize(("call", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_operation_sends_what_the_generated_methods_sent(
    wire: tuple[KubeClient, list[Sent]], call: Call, expected: list[tuple[str, str | None]]
) -> None:
    kube, sent = wire
    call(kube)
    assert [(f"{s.method} {s.url}", s.headers.get("Content-Type")) for s in sent] == expected
    for request in sent:
        assert request.headers["Accept"] == "application/json"
        assert request.headers["authorization"] == "Bearer t0ken"
        assert request.headers["User-Agent"].startswith("OpenAPI-Generator/")
        assert request.timeout_s == (5.0, 30.0)


def test_bodies_are_rollouts_json_as_is(wire: tuple[KubeClient, list[Sent]]) -> None:
    kube, sent = wire
    kube.patch_node_labels("n1", {"a": "b", "c": None})
    kube.evict_pod("ns", "p", 3)
    kube.create_lease(Lease("ns", "x", holder_identity="h", renew_time=NOW))
    assert sent[0].body == {"metadata": {"labels": {"a": "b", "c": None}}}
    assert sent[2].body == {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": "p", "namespace": "ns"},
        "deleteOptions": {"gracePeriodSeconds": 3},
    }
    assert sent[3].body["spec"]["renewTime"] == "2024-05-01T10:00:00.123456Z"
