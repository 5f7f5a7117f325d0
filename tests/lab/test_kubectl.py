"""Conformance of the API emulator with real kubectl: Debian's package, fetched by
scripts/fetch-kubectl, never whatever kubectl is on PATH."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.containerd.binaries import cache_dir
from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.apiserver.authentication import LAB_ADMIN, Authenticator
from rollout.lab.apiserver.rbac import ANONYMOUS
from rollout.lab.apiserver.resources import (
    CLUSTERROLES,
    CONFIGMAPS,
    DAEMONSETS,
    EVENTS,
    NODES,
    PODDISRUPTIONBUDGETS,
    PODS,
    ROLEBINDINGS,
    ROLES,
)
from rollout.lab.description import LabDescription
from rollout.lab.simulation.bootstrap import seed_cluster
from rollout.lab.simulation.podservice import LabCertificate
from tests.conftest import require
from tests.kubeconfigs import write_kubeconfig

FETCH_COMMAND = "scripts/fetch-kubectl"
ADMIN_TOKEN = "lab-admin-token"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def kubectl_binary() -> Path:
    """Debian's kubectl in the rollout cache (fail in CI, skip elsewhere when missing)."""
    path = cache_dir() / "kubectl" / "usr" / "bin" / "kubectl"
    if not (path.is_file() and os.access(path, os.X_OK)):
        require(f"kubectl not found at {path}; run {FETCH_COMMAND} to fetch it")
    return path


@pytest.fixture()
def registry() -> Registry:
    return Registry()


@pytest.fixture()
def kubectl(registry: Registry, tmp_path: Path) -> Iterator[Kubectl]:
    """Run kubectl against a fresh emulator through a kubeconfig, as a user would. The server
    speaks TLS: kubectl sends bearer tokens (`--token`) only over TLS."""
    binary = kubectl_binary()
    certificate = LabCertificate.for_address("127.0.0.1")
    # As a real server: credential-less requests are anonymous; the kubeconfig's token is an
    # administrator's (kubectl would prompt for a password on TLS without a credential).
    authenticator = Authenticator({ADMIN_TOKEN: LAB_ADMIN}, anonymous=ANONYMOUS)
    with ApiServer.start(registry, authenticator=authenticator, tls=certificate.context) as server:
        config = write_kubeconfig(
            tmp_path / "kubeconfig",
            server.url,
            token=ADMIN_TOKEN,
            ca_pem=certificate.ca_pem,
            namespace="default",
        )
        # No cache of discovery between tests: each emulator is new.
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(config)}

        def run(*args: str, check: bool = True, stdin: str | None = None) -> Any:
            done = subprocess.run(
                [str(binary), *args],
                env=env,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=60,
            )
            if check and done.returncode != 0:
                pytest.fail(
                    f"kubectl {' '.join(args)} exited {done.returncode}:\n"
                    f"{done.stdout}\n{done.stderr}",
                    pytrace=False,
                )
            return done

        yield run


def table(output: str) -> list[dict[str, str]]:
    """kubectl's column output as rows keyed by header (headers are split on 2+ spaces)."""
    lines = output.rstrip("\n").splitlines()
    header = lines[0]
    starts = [0] + [i for i in range(1, len(header)) if header[i - 1] == " " != header[i]]
    starts = [s for s in starts if s == 0 or header[s - 2 : s] == "  "]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return [
        {
            name: line[a:b].strip()
            for name, a, b in zip(names, starts, [*starts[1:], None], strict=True)
        }
        for line in lines[1:]
    ]


def add_node(registry: Registry, name: str, *, role: str = "gpu", gpus: int = 4) -> None:
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    registry.create(
        NODES,
        None,
        {
            "metadata": {"name": name, "labels": {f"node-role.kubernetes.io/{role}": ""}},
            "status": {
                "capacity": resources,
                "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.58.2"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "kubeletVersion": "v1.31.0",
                    "osImage": "Debian GNU/Linux 12 (bookworm)",
                    "kernelVersion": "6.1.0-lab",
                    "containerRuntimeVersion": "containerd://1.7.24",
                },
            },
        },
    )


def add_plugin_daemonset(registry: Registry) -> dict[str, Any]:
    """DaemonSet default/plugin, its pods labelled app=plugin."""
    return registry.create(
        DAEMONSETS,
        "default",
        {
            "metadata": {"name": "plugin"},
            "spec": {
                "selector": {"matchLabels": {"app": "plugin"}},
                "template": {
                    "metadata": {"labels": {"app": "plugin"}},
                    "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
                },
            },
        },
    )


def add_pod(
    registry: Registry,
    name: str,
    node: str,
    *,
    labels: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    gpus: int = 0,
    running: bool = True,
) -> None:
    container: dict[str, Any] = {"name": "main", "image": "busybox:1.36"}
    if gpus:
        container["resources"] = {
            "limits": {"nvidia.com/gpu": str(gpus)},
            "requests": {"cpu": "500m", "memory": "1Gi"},
        }
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}}
    if owner:
        metadata["ownerReferences"] = [{**owner, "controller": True}]
    registry.create(
        PODS,
        "default",
        {"metadata": metadata, "spec": {"nodeName": node, "containers": [container]}},
    )
    if running:
        registry.mutate(
            PODS,
            "default",
            name,
            lambda pod: pod["status"].update(
                phase="Running",
                podIP="10.0.0.7",
                conditions=[{"type": "Ready", "status": "True"}],
                containerStatuses=[
                    {
                        "name": "main",
                        "image": "busybox:1.36",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 2,
                        "state": {"running": {}},
                    }
                ],
            ),
        )


# ------------------------------------------------------------------------ get


def test_get_nodes_shows_the_server_side_columns(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_node(registry, "cpu-1", role="worker", gpus=0)
    rows = table(kubectl("get", "nodes").stdout)
    assert [r["NAME"] for r in rows] == ["cpu-1", "gpu-1"]
    assert set(rows[0]) == {"NAME", "STATUS", "ROLES", "AGE", "VERSION"}
    assert rows[1] == {
        "NAME": "gpu-1",
        "STATUS": "Ready",
        "ROLES": "gpu",
        "AGE": rows[1]["AGE"],
        "VERSION": "v1.31.0",
    }
    assert rows[1]["AGE"].endswith("s")
    wide = table(kubectl("get", "node", "gpu-1", "-o", "wide").stdout)
    assert wide == [
        {
            **rows[1],
            "AGE": wide[0]["AGE"],
            "INTERNAL-IP": "127.0.58.2",
            "EXTERNAL-IP": "<none>",
            "OS-IMAGE": "Debian GNU/Linux 12 (bookworm)",
            "KERNEL-VERSION": "6.1.0-lab",
            "CONTAINER-RUNTIME": "containerd://1.7.24",
        }
    ]


def test_get_with_label_selectors_and_json(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_node(registry, "cpu-1", role="worker", gpus=0)
    selected = table(kubectl("get", "nodes", "-l", "node-role.kubernetes.io/gpu").stdout)
    assert [r["NAME"] for r in selected] == ["gpu-1"]
    none = kubectl("get", "nodes", "-l", "node-role.kubernetes.io/gpu,!node-role.kubernetes.io/gpu")
    assert none.stdout == "" and "No resources found" in none.stderr
    shown = table(
        kubectl("get", "nodes", "--show-labels", "-l", "node-role.kubernetes.io/worker").stdout
    )
    assert shown[0]["LABELS"] == "node-role.kubernetes.io/worker="
    listed = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    assert listed["kind"] == "List"
    assert [n["metadata"]["name"] for n in listed["items"]] == ["cpu-1", "gpu-1"]
    assert listed["items"][0]["kind"] == "Node"
    one = json.loads(kubectl("get", "node", "gpu-1", "-o", "json").stdout)
    assert one["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    name = kubectl("get", "node", "gpu-1", "-o", "jsonpath={.status.nodeInfo.kubeletVersion}")
    assert name.stdout == "v1.31.0"
    missing = kubectl("get", "node", "gpu-9", check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip() == 'Error from server (NotFound): nodes "gpu-9" not found'


def test_get_pods_ready_status_restarts_and_wide(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1", labels={"app": "smoke"}, gpus=1)
    add_pod(registry, "waiting", "gpu-1", labels={"app": "web"}, running=False)
    rows = table(kubectl("get", "pods").stdout)
    assert [(r["NAME"], r["READY"], r["STATUS"], r["RESTARTS"]) for r in rows] == [
        ("smoke", "1/1", "Running", "2"),
        ("waiting", "0/1", "Pending", "0"),
    ]
    wide = table(kubectl("get", "pods", "-o", "wide", "-l", "app=smoke").stdout)
    assert (wide[0]["IP"], wide[0]["NODE"], wide[0]["NOMINATED NODE"]) == (
        "10.0.0.7",
        "gpu-1",
        "<none>",
    )
    by_field = table(kubectl("get", "pods", "--field-selector", "status.phase=Pending").stdout)
    assert [r["NAME"] for r in by_field] == ["waiting"]
    everywhere = table(kubectl("get", "pods", "-A").stdout)
    assert everywhere[0]["NAMESPACE"] == "default"


def test_other_kinds_have_their_columns_or_name_and_age(
    kubectl: Kubectl, registry: Registry
) -> None:
    registry.create(
        PODDISRUPTIONBUDGETS,
        "default",
        {"metadata": {"name": "web"}, "spec": {"minAvailable": 1, "selector": {}}},
    )
    add_plugin_daemonset(registry)
    budgets = table(kubectl("get", "pdb").stdout)
    assert budgets[0]["MIN AVAILABLE"] == "1"
    assert budgets[0]["MAX UNAVAILABLE"] == "N/A"
    namespaces = {r["NAME"]: r["STATUS"] for r in table(kubectl("get", "ns").stdout)}
    assert namespaces["default"] == "Active"
    registry.mutate(
        DAEMONSETS,
        "default",
        "plugin",
        lambda ds: ds.update(
            status={"desiredNumberScheduled": 2, "currentNumberScheduled": 2, "numberReady": 1}
        ),
    )
    daemonsets = table(kubectl("get", "ds", "-o", "wide").stdout)
    assert {k: v for k, v in daemonsets[0].items() if k != "AGE"} == {
        "NAME": "plugin",
        "DESIRED": "2",
        "CURRENT": "2",
        "READY": "1",
        "UP-TO-DATE": "0",
        "AVAILABLE": "0",
        "NODE SELECTOR": "<none>",
        "CONTAINERS": "main",
        "IMAGES": "busybox:1.36",
        "SELECTOR": "app=plugin",
    }
    roles = table(kubectl("get", "clusterroles").stdout)
    assert set(roles[0]) == {"NAME", "CREATED AT"}
    assert "cluster-admin" in [r["NAME"] for r in roles]
    bindings = table(kubectl("get", "clusterrolebinding", "cluster-admin", "-o", "wide").stdout)
    assert (bindings[0]["ROLE"], bindings[0]["GROUPS"]) == (
        "ClusterRole/cluster-admin",
        "system:masters",
    )


def test_get_watch_prints_rows_in_the_same_columns(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")

    def cordon(node: dict[str, Any]) -> None:
        node.setdefault("spec", {})["unschedulable"] = True

    timer = threading.Timer(1.0, lambda: registry.mutate(NODES, None, "gpu-1", cordon))
    timer.start()
    try:
        watched = kubectl("get", "nodes", "-w", "--request-timeout=3s", check=False)
    finally:
        timer.cancel()
    # Rows after the first are not realigned, as with a real server: split on blanks.
    header, *rows = (line.split() for line in watched.stdout.splitlines())
    assert header == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]
    assert [(r[0], r[1], r[4]) for r in rows] == [
        ("gpu-1", "Ready", "v1.31.0"),
        ("gpu-1", "Ready,SchedulingDisabled", "v1.31.0"),
    ]


def test_label_annotate_taint_and_patch_a_node(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    assert kubectl("label", "node", "gpu-1", "pool=a").stdout == "node/gpu-1 labeled\n"
    assert kubectl("annotate", "node", "gpu-1", "note=x").stdout == "node/gpu-1 annotated\n"
    tainted = kubectl("taint", "node", "gpu-1", "gpu=true:NoSchedule")
    assert tainted.stdout == "node/gpu-1 tainted\n"
    kubectl("patch", "node", "gpu-1", "-p", '{"metadata":{"labels":{"zone":"z1"}}}')
    shown = table(kubectl("get", "nodes", "-L", "pool,zone").stdout)
    assert (shown[0]["POOL"], shown[0]["ZONE"]) == ("a", "z1")
    assert kubectl("get", "nodes", "-l", "pool=a", "-o", "name").stdout == "node/gpu-1\n"
    node = registry.get(NODES, None, "gpu-1")
    assert node["metadata"]["annotations"]["note"] == "x"
    assert node["spec"]["taints"] == [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]


def test_get_events_as_kubectl_prints_them(kubectl: Kubectl, registry: Registry) -> None:
    registry.create(
        EVENTS,
        "default",
        {
            "metadata": {"name": "smoke.1"},
            "involvedObject": {"kind": "Pod", "name": "smoke", "namespace": "default"},
            "reason": "FailedCreatePodSandBox",
            "type": "Warning",
            "message": 'no runtime for "nvidia" is configured',
            "source": {"component": "kubelet", "host": "gpu-1"},
            "count": 3,
            "firstTimestamp": "2020-01-01T00:00:00Z",
            "lastTimestamp": "2020-01-01T00:00:00Z",
        },
    )
    rows = table(kubectl("get", "events").stdout)
    assert {k: v for k, v in rows[0].items() if k != "LAST SEEN"} == {
        "TYPE": "Warning",
        "REASON": "FailedCreatePodSandBox",
        "OBJECT": "pod/smoke",
        "MESSAGE": 'no runtime for "nvidia" is configured',
    }
    assert re.fullmatch(r"\d+y(\d+d)?", rows[0]["LAST SEEN"])
    wide = table(kubectl("get", "events", "-o", "wide").stdout)
    assert (wide[0]["SOURCE"], wide[0]["COUNT"], wide[0]["NAME"]) == (
        "kubelet, gpu-1",
        "3",
        "smoke.1",
    )


# ------------------------------------------------------------------- describe


def test_describe_node_shows_allocated_resources(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1", gpus=1)
    described = kubectl("describe", "node", "gpu-1").stdout
    assert "Roles:              gpu" in described
    assert "Kubelet Version:            v1.31.0" in described
    assert "Non-terminated Pods:          (1 in total)" in described
    allocated = described.split("Allocated resources:")[1].split("Events:")[0]
    lines = {line.split()[0]: line.split()[1:] for line in allocated.splitlines()[3:] if line}
    assert lines["cpu"] == ["500m", "(6%)", "0", "(0%)"]
    assert lines["memory"] == ["1Gi", "(3%)", "0", "(0%)"]
    assert lines["nvidia.com/gpu"] == ["1", "1"]


# ----------------------------------------------------- cordon, drain, delete


def test_cordon_and_uncordon(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    assert kubectl("cordon", "gpu-1").stdout == "node/gpu-1 cordoned\n"
    assert table(kubectl("get", "nodes").stdout)[0]["STATUS"] == "Ready,SchedulingDisabled"
    assert kubectl("cordon", "gpu-1").stdout == "node/gpu-1 already cordoned\n"
    assert kubectl("uncordon", "gpu-1").stdout == "node/gpu-1 uncordoned\n"
    assert registry.get(NODES, None, "gpu-1")["spec"].get("unschedulable") in (None, False)


def test_drain_honours_budgets_and_leaves_daemonset_pods(
    kubectl: Kubectl, registry: Registry
) -> None:
    add_node(registry, "gpu-1")
    plugin = add_plugin_daemonset(registry)
    ds_owner = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "name": "plugin",
        "uid": plugin["metadata"]["uid"],
    }
    rs_owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u-1"}
    add_pod(registry, "plugin-x", "gpu-1", labels={"app": "plugin"}, owner=ds_owner)
    add_pod(registry, "web-1", "gpu-1", labels={"app": "web"}, owner=rs_owner)
    registry.create(
        PODDISRUPTIONBUDGETS,
        "default",
        {
            "metadata": {"name": "web"},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}},
        },
    )
    refused = kubectl("drain", "gpu-1", "--ignore-daemonsets", "--timeout=3s", check=False)
    assert refused.returncode == 1
    assert "Cannot evict pod as it would violate the pod's disruption budget." in refused.stderr
    assert "Warning: ignoring DaemonSet-managed Pods: default/plugin-x" in refused.stderr
    assert registry.get(NODES, None, "gpu-1")["spec"]["unschedulable"] is True
    bare = kubectl("drain", "gpu-1", check=False)
    assert bare.returncode == 1
    assert "cannot delete DaemonSet-managed Pods (use --ignore-daemonsets to ignore)" in bare.stderr
    kubectl("delete", "pdb", "web")
    drained = kubectl("drain", "gpu-1", "--ignore-daemonsets", "--timeout=10s")
    assert "pod/web-1 evicted" in drained.stdout
    assert "node/gpu-1 drained" in drained.stdout
    assert [r["NAME"] for r in table(kubectl("get", "pods").stdout)] == ["plugin-x"]


def test_delete_pod(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1")
    assert (
        kubectl("delete", "pod", "smoke").stdout == 'pod "smoke" deleted from default namespace\n'
    )
    gone = kubectl("delete", "pod", "smoke", check=False)
    assert gone.stderr.strip() == 'Error from server (NotFound): pods "smoke" not found'
    assert kubectl("delete", "pod", "smoke", "--ignore-not-found").stdout == ""


# ------------------------------------------------------------ logs, apply, auth


def test_logs(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1")
    registry.write_log("default", "smoke", "main", "GPU 0: NVIDIA A100\nGPU 1: NVIDIA A100\n")
    assert kubectl("logs", "smoke").stdout == "GPU 0: NVIDIA A100\nGPU 1: NVIDIA A100\n"
    assert kubectl("logs", "smoke", "--tail=1", "-c", "main").stdout == "GPU 1: NVIDIA A100\n"
    add_pod(registry, "pending", "gpu-1", running=False)
    waiting = kubectl("logs", "pending", check=False)
    assert waiting.returncode == 1
    assert 'container "main" in pod "pending" is waiting to start' in waiting.stderr


def test_logs_follow_until_the_container_ends(kubectl: Kubectl, registry: Registry) -> None:
    add_node(registry, "gpu-1")
    add_pod(registry, "smoke", "gpu-1")
    registry.write_log("default", "smoke", "main", "GPU 0: NVIDIA A100\n")

    def finish(pod: dict[str, Any]) -> None:
        pod["status"]["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": 0, "reason": "Completed"}
        }
        pod["status"]["phase"] = "Succeeded"

    def later() -> None:
        registry.write_log("default", "smoke", "main", "GPU 1: NVIDIA A100\n")
        registry.mutate(PODS, "default", "smoke", finish)

    timer = threading.Timer(1.0, later)
    timer.start()
    try:
        followed = kubectl("logs", "-f", "smoke", "--request-timeout=10s")
    finally:
        timer.cancel()
    assert followed.stdout == "GPU 0: NVIDIA A100\nGPU 1: NVIDIA A100\n"


def test_apply_a_configmap(kubectl: Kubectl, registry: Registry) -> None:
    manifest = yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "time-slicing"},
            "data": {"any": "version: v1\n"},
        }
    )
    created = kubectl("apply", "-f", "-", stdin=manifest)
    assert created.stdout == "configmap/time-slicing created\n"
    assert (
        kubectl("apply", "-f", "-", stdin=manifest).stdout == "configmap/time-slicing unchanged\n"
    )
    changed = manifest.replace("version: v1", "version: v2")
    assert (
        kubectl("apply", "-f", "-", stdin=changed).stdout == "configmap/time-slicing configured\n"
    )
    stored = json.loads(kubectl("get", "cm", "time-slicing", "-o", "json").stdout)
    assert stored["data"] == {"any": "version: v2\n"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in stored["metadata"]["annotations"]
    assert table(kubectl("get", "cm", "time-slicing").stdout)[0]["DATA"] == "1"


def test_the_seeded_runtime_class_and_admission(kubectl: Kubectl, registry: Registry) -> None:
    seed_cluster(
        registry,
        LabDescription.from_dict(
            {
                "api": {"host": "127.0.0.1", "port": 0},
                "nodes": [{"name": "gpu-1", "address": "127.0.58.2", "containerd": "1.7"}],
            }
        ),
    )
    classes = table(kubectl("get", "runtimeclasses").stdout)
    assert [(r["NAME"], r["HANDLER"]) for r in classes] == [("nvidia", "nvidia")]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "smoke"},
        "spec": {
            "runtimeClassName": "nvidia-cdi",
            "containers": [{"name": "c", "image": "cuda:12.4"}],
        },
    }
    refused = kubectl("create", "-f", "-", stdin=json.dumps(pod), check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        'Error from server (Forbidden): error when creating "STDIN": pods "smoke" is forbidden: '
        'pod rejected: RuntimeClass "nvidia-cdi" not found'
    )
    pod["spec"]["runtimeClassName"] = "nvidia"
    assert kubectl("create", "-f", "-", stdin=json.dumps(pod)).stdout == "pod/smoke created\n"


def test_imperative_create_generators(kubectl: Kubectl, registry: Registry) -> None:
    """kubectl sends these as protobuf; the lab reads them into the same objects as JSON."""
    kubectl("create", "namespace", "gpu-operator-test")
    kubectl("create", "configmap", "slicing", "--from-literal=any=v1", "-n", "gpu-operator-test")
    kubectl("create", "serviceaccount", "rollout")
    kubectl("create", "clusterrole", "nodes", "--verb=get,patch", "--resource=nodes,pods/eviction")
    kubectl("create", "role", "one", "--verb=get", "--resource=pods", "--resource-name=p1")
    kubectl("create", "rolebinding", "one", "--role=one", "--serviceaccount=default:rollout")
    kubectl("create", "clusterrolebinding", "nodes", "--clusterrole=nodes", "--group=ops")
    configmap = registry.get(CONFIGMAPS, "gpu-operator-test", "slicing")
    assert configmap["data"] == {"any": "v1"}
    assert registry.get(CLUSTERROLES, None, "nodes")["rules"] == [
        {"verbs": ["get", "patch"], "apiGroups": [""], "resources": ["nodes", "pods/eviction"]}
    ]
    assert registry.get(ROLES, "default", "one")["rules"][0]["resourceNames"] == ["p1"]
    binding = registry.get(ROLEBINDINGS, "default", "one")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rollout", "namespace": "default"}
    ]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "one",
    }
    token = kubectl("create", "token", "rollout").stdout.strip()
    assert kubectl("--token", token, "auth", "can-i", "get", "pods/p1").stdout == "yes\n"
    assert kubectl("--token", token, "auth", "can-i", "get", "pods/p2", check=False).stdout == (
        "no\n"
    )


def test_auth_can_i(kubectl: Kubectl) -> None:
    assert kubectl("auth", "can-i", "patch", "nodes").stdout == "yes\n"
    assert (
        kubectl("auth", "can-i", "create", "pods/eviction", "-n", "kube-system").stdout == "yes\n"
    )


def test_a_service_account_token_is_held_to_its_rbac_roles(
    kubectl: Kubectl, registry: Registry
) -> None:
    add_node(registry, "gpu-1")
    kubectl("apply", "-f", "-", stdin=manifest("v1", "ServiceAccount", "rollout"))
    token = kubectl("create", "token", "rollout").stdout.strip()
    user = "system:serviceaccount:default:rollout"
    assert kubectl("--token", token, "auth", "can-i", "list", "nodes", check=False).stdout == (
        "no\n"
    )
    refused = kubectl("--token", token, "get", "nodes", check=False)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f'Error from server (Forbidden): nodes is forbidden: User "{user}" cannot list '
        'resource "nodes" in API group "" at the cluster scope'
    )
    nodes_rule = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch"]}
    kubectl("apply", "-f", "-", stdin=manifest(RBAC, "ClusterRole", "nodes", rules=[nodes_rule]))
    kubectl("apply", "-f", "-", stdin=binding("ClusterRoleBinding", "ClusterRole", "nodes"))
    assert table(kubectl("--token", token, "get", "nodes").stdout)[0]["NAME"] == "gpu-1"
    assert kubectl("--token", token, "cordon", "gpu-1").stdout == "node/gpu-1 cordoned\n"
    denied = kubectl("--token", token, "delete", "node", "gpu-1", check=False)
    assert denied.stderr.strip() == (
        f'Error from server (Forbidden): nodes "gpu-1" is forbidden: User "{user}" cannot '
        'delete resource "nodes" in API group "" at the cluster scope'
    )
    assert kubectl("--token", token, "auth", "can-i", "patch", "nodes").stdout == "yes\n"
    # TYPE/NAME: `pods/eviction` would ask about a pod named "eviction", as on a real cluster.
    evict = (
        "--token",
        token,
        "auth",
        "can-i",
        "create",
        "pods",
        "--subresource=eviction",
        "-n",
        "default",
    )
    assert kubectl(*evict, check=False).stdout == "no\n"
    evict_rule = {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}
    kubectl("apply", "-f", "-", stdin=manifest(RBAC, "Role", "evict", rules=[evict_rule]))
    kubectl("apply", "-f", "-", stdin=binding("RoleBinding", "Role", "evict"))
    assert kubectl(*evict).stdout == "yes\n"
    whoami = kubectl("--token", token, "auth", "whoami").stdout
    assert f"Username    {user}\n" in whoami
    assert "[system:serviceaccounts system:serviceaccounts:default system:authenticated]" in whoami
    rules = kubectl("--token", token, "auth", "can-i", "--list", "-n", "default").stdout
    assert [line.split() for line in rules.splitlines() if line.startswith("pods/eviction")] == [
        ["pods/eviction", "[]", "[]", "[create]"]
    ]
    assert "nodes " in rules
    named = ("--token", token, "auth", "can-i", "create", "pods/eviction", "-n", "default")
    assert kubectl(*named, check=False).stdout == "no\n"
    assert kubectl(*evict[:-1], "kube-system", check=False).stdout == "no\n"
    kubectl("delete", "serviceaccount", "rollout")
    gone = kubectl("--token", token, "get", "nodes", check=False)
    assert "error: You must be logged in to the server (Unauthorized)" in gone.stderr


RBAC = "rbac.authorization.k8s.io/v1"


def manifest(api_version: str, kind: str, name: str, **fields: Any) -> str:
    return yaml.safe_dump(
        {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}, **fields}
    )


def binding(kind: str, role_kind: str, name: str) -> str:
    """A binding of the ServiceAccount default/rollout to the role `name`."""
    return manifest(
        RBAC,
        kind,
        name,
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        subjects=[{"kind": "ServiceAccount", "name": "rollout", "namespace": "default"}],
    )
