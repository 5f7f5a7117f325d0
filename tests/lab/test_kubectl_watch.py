"""Real kubectl 1.36 (Debian's) with its default flags on the commands that wait: it reads
through informers that ask for streaming lists (WatchListClient: `sendInitialEvents=true`,
waiting for the bookmark that ends the initial events), so each of these hung against a server
without them. Every kubectl call has a time limit: a hang fails the test. Also the same
protocol as client-go's reflector speaks it, from Python."""

from __future__ import annotations

import http.client
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.apiserver.registry import DeleteOptions
from rollout.lab.apiserver.resources import CONFIGMAPS, DAEMONSETS, NAMESPACES, PODS, SECRETS
from tests.lab import test_kubectl
from tests.lab.test_kubectl import Kubectl, add_node, add_plugin_daemonset, add_pod, kubectl_binary

# The kubelet's part: a deleted running pod stays Terminating this long before it goes.
TERMINATION_S = 2.0
# A hang shows as a failure after this long, never as a stuck suite.
LIMIT_S = 60


@pytest.fixture()
def registry() -> Registry:
    return Registry(pod_termination_s=TERMINATION_S)


# test_kubectl's kubectl fixture, over this module's registry
kubectl = test_kubectl.kubectl


def later(delay_s: float, action: Callable[[], Any]) -> threading.Timer:
    timer = threading.Timer(delay_s, action)
    timer.start()
    return timer


def test_delete_pod_waits_until_the_pod_is_gone(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1")
    deleted = kubectl("delete", "pod", "smoke")
    assert deleted.stdout == 'pod "smoke" deleted from default namespace\n'
    assert registry.find(PODS, "default", "smoke") is None


def test_delete_other_kinds(kubectl: Kubectl, registry: Registry) -> None:
    add_plugin_daemonset(registry)
    kubectl("create", "namespace", "scratch")
    kubectl("create", "configmap", "slicing", "--from-literal=any=v1")
    kubectl("create", "secret", "generic", "ssh", "--from-literal=key=v")
    for args, said in (
        (("daemonset", "plugin"), 'daemonset.apps "plugin" deleted from default namespace\n'),
        (("configmap", "slicing"), 'configmap "slicing" deleted from default namespace\n'),
        (("secret", "ssh"), 'secret "ssh" deleted from default namespace\n'),
        (("namespace", "scratch"), 'namespace "scratch" deleted\n'),
    ):
        assert kubectl("delete", *args).stdout == said
    assert registry.find(DAEMONSETS, "default", "plugin") is None
    assert registry.find(CONFIGMAPS, "default", "slicing") is None
    assert registry.find(SECRETS, "default", "ssh") is None
    assert registry.find(NAMESPACES, None, "scratch") is None


def test_wait_for_delete(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1")
    registry.delete(PODS, "default", "smoke", DeleteOptions())
    assert registry.get(PODS, "default", "smoke")["metadata"].get("deletionTimestamp")
    waited = kubectl("wait", "--for=delete", "pod/smoke", "--timeout=30s")
    assert waited.stdout == "pod/smoke condition met\n"
    assert registry.find(PODS, "default", "smoke") is None


def test_wait_for_condition_ready(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1", running=False)

    def ready(pod: dict[str, Any]) -> None:
        pod["status"].update(phase="Running", conditions=[{"type": "Ready", "status": "True"}])

    timer = later(1.0, lambda: registry.mutate(PODS, "default", "smoke", ready))
    try:
        waited = kubectl("wait", "--for=condition=Ready", "pod/smoke", "--timeout=30s")
    finally:
        timer.cancel()
    assert waited.stdout == "pod/smoke condition met\n"


def test_get_watch_reads_the_state_then_a_change(
    registry: Registry, kubectl: Kubectl, tmp_path: Path
) -> None:
    """`get -w` with no time limit of its own, stopped by the test once it printed both."""
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1")
    # the fixture's kubeconfig, in its HOME
    config = tmp_path / "kubeconfig"
    out = tmp_path / "watch.out"
    with out.open("w") as sink:
        watching = subprocess.Popen(
            [str(kubectl_binary()), "get", "pods", "-w"],
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(config)},
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            _wait_for_lines(out, 2)
            registry.mutate(
                PODS, "default", "smoke", lambda pod: pod["metadata"]["labels"].update(x="1")
            )
            registry.delete(PODS, "default", "smoke", DeleteOptions())
            lines = _wait_for_lines(out, 4)
        finally:
            watching.terminate()
            watching.wait(timeout=LIMIT_S)
    rows = [line.split() for line in lines]
    assert rows[0] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert [row[:3] for row in rows[1:4]] == [
        ["smoke", "1/1", "Running"],
        ["smoke", "1/1", "Running"],
        ["smoke", "1/1", "Terminating"],
    ]


def test_rollout_status_of_a_daemonset(kubectl: Kubectl, registry: Registry) -> None:
    add_plugin_daemonset(registry)

    def rolled(daemonset: dict[str, Any]) -> None:
        generation = daemonset["metadata"].get("generation", 1)
        daemonset["status"] = {
            "observedGeneration": generation,
            "desiredNumberScheduled": 2,
            "currentNumberScheduled": 2,
            "updatedNumberScheduled": 2,
            "numberAvailable": 2,
            "numberReady": 2,
        }

    def half(daemonset: dict[str, Any]) -> None:
        rolled(daemonset)
        daemonset["status"].update(updatedNumberScheduled=1, numberAvailable=1)

    registry.mutate(DAEMONSETS, "default", "plugin", half)
    timer = later(1.0, lambda: registry.mutate(DAEMONSETS, "default", "plugin", rolled))
    try:
        status = kubectl("rollout", "status", "daemonset/plugin", "--timeout=30s")
    finally:
        timer.cancel()
    assert status.stdout.splitlines() == [
        'Waiting for daemon set "plugin" rollout to finish: 1 out of 2 new pods have been '
        "updated...",
        'daemon set "plugin" successfully rolled out',
    ]


# ---------------------------------------------------------------- client-go's protocol


@pytest.fixture()
def server(registry: Registry) -> Iterator[ApiServer]:
    with ApiServer.start(registry, bookmark_interval_s=0.5) as started:
        yield started


def watch_events(
    server: ApiServer, path: str, until: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The events of a watch at `path`, read until `until` holds of them (or the time limit)."""
    connection = http.client.HTTPConnection(server.host, server.port, timeout=LIMIT_S)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        if response.status != 200:
            return [{"type": "HTTP", "code": response.status, "object": json.load(response)}]
        events: list[dict[str, Any]] = []
        deadline = time.monotonic() + LIMIT_S
        while not until(events) and time.monotonic() < deadline:
            line = response.readline()
            if not line:
                break
            events.append(json.loads(line))
        return events
    finally:
        connection.close()


def test_a_reflector_lists_then_watches_with_bookmarks(
    server: ApiServer, registry: Registry
) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "a", "gpu-1")
    listed = registry.list_collection(PODS, "default")
    revision = listed["metadata"]["resourceVersion"]
    timer = later(0.2, lambda: add_pod(registry, "b", "gpu-1", running=False))
    try:
        events = watch_events(
            server,
            f"/api/v1/namespaces/default/pods?watch=1&resourceVersion={revision}"
            "&allowWatchBookmarks=true&timeoutSeconds=30",
            lambda seen: any(e["type"] == "BOOKMARK" for e in seen),
        )
    finally:
        timer.cancel()
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"]["metadata"]["name"] == "b"
    bookmark = events[1]["object"]
    assert bookmark == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(registry.store.revision), "creationTimestamp": None},
    }


def test_a_streaming_list_ends_its_initial_events_with_a_bookmark(
    server: ApiServer, registry: Registry
) -> None:
    add_node(registry, "gpu-1")
    for name in ("a", "b", "c"):
        add_pod(registry, name, "gpu-1")
    revision = registry.store.revision
    events = watch_events(
        server,
        "/api/v1/pods?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
        "&resourceVersion=&allowWatchBookmarks=true",
        lambda seen: any(e["type"] == "BOOKMARK" for e in seen),
    )
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events] == [
        ("ADDED", "a"),
        ("ADDED", "b"),
        ("ADDED", "c"),
        ("BOOKMARK", None),
    ]
    assert events[-1]["object"]["metadata"] == {
        "resourceVersion": str(revision),
        "creationTimestamp": None,
        "annotations": {"k8s.io/initial-events-end": "true"},
    }


def test_a_streaming_list_then_follows_changes(server: ApiServer, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "a", "gpu-1")
    timer = later(0.3, lambda: add_pod(registry, "b", "gpu-1", running=False))
    try:
        events = watch_events(
            server,
            "/api/v1/namespaces/default/pods?watch=1&sendInitialEvents=true"
            "&resourceVersionMatch=NotOlderThan&resourceVersion=0&allowWatchBookmarks=true",
            lambda seen: any(e["object"]["metadata"].get("name") == "b" for e in seen),
        )
    finally:
        timer.cancel()
    assert [(e["type"], e["object"]["metadata"].get("name")) for e in events][:3] == [
        ("ADDED", "a"),
        ("BOOKMARK", None),
        ("ADDED", "b"),
    ]


def test_streaming_list_options_are_validated_as_the_real_server_does(
    server: ApiServer,
) -> None:
    refused = watch_events(
        server, "/api/v1/pods?watch=1&sendInitialEvents=true&allowWatchBookmarks=true", bool
    )
    assert refused[0]["code"] == 422
    assert refused[0]["object"]["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
    )
    unsupported = watch_events(
        server, "/api/v1/pods?watch=1&sendInitialEvents=false&resourceVersionMatch=Exact", bool
    )
    assert unsupported[0]["object"]["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: [resourceVersionMatch: Forbidden: '
        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, "
        'resourceVersionMatch: Unsupported value: "Exact": supported values: "NotOlderThan"]'
    )


def _wait_for_lines(path: Path, count: int) -> list[str]:
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline:
        lines = path.read_text().splitlines()
        if len(lines) >= count:
            return lines
        time.sleep(0.1)
    pytest.fail(f"kubectl printed {path.read_text()!r}, not {count} lines", pytrace=False)
