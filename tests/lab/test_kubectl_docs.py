"""Every kubectl command rollout's docs and outputs tell a user to run, run as written (names
substituted) by real kubectl 1.36 with its default flags against a fresh emulator, each
under kubectl's time limit so a hang fails; each asserts what the command is said to do.

Where rollout builds the command (a hint, a message, the schedule's header), the test takes
it from that code, so the test follows the text a user reads."""

from __future__ import annotations

import base64
import json
import shlex
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rollout.changes.driver.operatorplan import AUTO_UPGRADE_PATCH, release_command
from rollout.deviceprofiles import DEVICE_PLUGIN_CONFIG_LABEL
from rollout.driver.operator import DriverSource
from rollout.lab.apiserver import ApiServer, Registry
from rollout.lab.apiserver.resources import (
    CLUSTERPOLICIES,
    CONFIGMAPS,
    NAMESPACES,
    NODES,
    NVIDIADRIVERS,
    PODS,
    RUNTIMECLASSES,
    SECRETS,
)
from rollout.steps.nodemarks import LEFT_CORDONED_ANNOTATION
from tests.lab.test_kubectl import (  # noqa: F401 (fixtures)
    Kubectl,
    add_node,
    add_plugin_daemonset,
    add_pod,
    kubectl,
    registry,
    table,
)

SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"


def run_said(kubectl: Kubectl, command: str) -> str:  # noqa: F811
    """Run one `kubectl ...` command as a shell would split it; its output."""
    argv = shlex.split(command)
    assert argv[0] == "kubectl", command
    return str(kubectl(*argv[1:]).stdout)


def test_patch_the_clusterpolicy_version_and_auto_upgrade(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
) -> None:
    """docs/drivers-operator.md and the driver steps: `kubectl patch clusterpolicy NAME
    --type merge -p ...` sets the version back, and turns autoUpgrade on; the rest stays."""
    policy = {
        "metadata": {"name": "cluster-policy"},
        "spec": {
            "driver": {
                "version": "550.127.05",
                "repository": "nvcr.io/nvidia",
                "upgradePolicy": {"autoUpgrade": False, "maxParallelUpgrades": 1},
            },
            "devicePlugin": {"config": {"name": "time-slicing"}},
        },
    }
    registry.create(CLUSTERPOLICIES, None, policy)
    said = DriverSource(None).version_command("535.183.01", "cluster-policy")
    assert run_said(kubectl, said) == "clusterpolicy.nvidia.com/cluster-policy patched\n"
    turn_on = f"kubectl patch clusterpolicy cluster-policy --type merge -p '{AUTO_UPGRADE_PATCH}'"
    run_said(kubectl, turn_on)
    spec = registry.get(CLUSTERPOLICIES, None, "cluster-policy")["spec"]
    assert spec == {
        "driver": {
            "version": "535.183.01",
            "repository": "nvcr.io/nvidia",
            "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1},
        },
        "devicePlugin": {"config": {"name": "time-slicing"}},
    }


def test_patch_an_nvidiadriver_version(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
) -> None:
    registry.create(
        NVIDIADRIVERS,
        None,
        {
            "metadata": {"name": "a100-pool"},
            "spec": {"version": "550.127.05", "driverType": "gpu"},
        },
    )
    listed = table(run_said(kubectl, "kubectl get nvidiadrivers"))
    assert [r["NAME"] for r in listed] == ["a100-pool"]
    said = DriverSource("a100-pool").version_command("535.183.01")
    assert run_said(kubectl, said) == "nvidiadriver.nvidia.com/a100-pool patched\n"
    assert registry.get(NVIDIADRIVERS, None, "a100-pool")["spec"] == {
        "version": "535.183.01",
        "driverType": "gpu",
    }


def label_node(registry: Registry, name: str, labels: dict[str, str]) -> None:  # noqa: F811
    registry.mutate(NODES, None, name, lambda n: n["metadata"]["labels"].update(labels))


def test_label_removal_releases_pinned_nodes_and_drops_a_profile(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
) -> None:
    """`kubectl label node A B nvidia.com/gpu-driver-upgrade.skip-` (the release hint) takes
    the label off each node named; the profile hint drops the device-plugin label."""
    for name in ("gpu-1", "gpu-2", "gpu-3"):
        add_node(registry, name)
        label_node(registry, name, {SKIP_LABEL: "true", DEVICE_PLUGIN_CONFIG_LABEL: "x4"})
    out = run_said(kubectl, release_command(["gpu-1", "gpu-2"]))
    assert out == "node/gpu-1 unlabeled\nnode/gpu-2 unlabeled\n"
    labels = {n: registry.get(NODES, None, n)["metadata"]["labels"] for n in ("gpu-1", "gpu-3")}
    assert SKIP_LABEL not in labels["gpu-1"]
    assert labels["gpu-1"][DEVICE_PLUGIN_CONFIG_LABEL] == "x4"
    assert labels["gpu-3"][SKIP_LABEL] == "true"
    run_said(kubectl, f"kubectl label node gpu-3 {DEVICE_PLUGIN_CONFIG_LABEL}-")
    labels = registry.get(NODES, None, "gpu-3")["metadata"]["labels"]
    assert DEVICE_PLUGIN_CONFIG_LABEL not in labels
    assert labels["node-role.kubernetes.io/gpu"] == ""


def test_a_node_left_cordoned_is_returned_as_its_hint_says(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
) -> None:
    """The left-cordoned hint (steps/nodemarks.py): `kubectl uncordon NODE` and `kubectl
    annotate node NODE rollout.dev/left-cordoned-`."""
    add_node(registry, "gpu-1")

    def left(node: dict[str, Any]) -> None:
        node.setdefault("spec", {})["unschedulable"] = True
        node["metadata"].setdefault("annotations", {})[LEFT_CORDONED_ANNOTATION] = "gpu.wait"

    registry.mutate(NODES, None, "gpu-1", left)
    assert run_said(kubectl, "kubectl uncordon gpu-1") == "node/gpu-1 uncordoned\n"
    said = f"kubectl annotate node gpu-1 {LEFT_CORDONED_ANNOTATION}-"
    assert run_said(kubectl, said) == "node/gpu-1 annotated\n"
    node = registry.get(NODES, None, "gpu-1")
    assert not node["spec"].get("unschedulable")
    assert LEFT_CORDONED_ANNOTATION not in (node["metadata"].get("annotations") or {})


def test_the_kept_run_read_and_abandoned_as_the_docs_say(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
) -> None:
    """docs/schedule.md: `kubectl get secret -n rollout rollout-<plan>-run -o json`; the
    changed-plan refusal (cli/schedule.py): `-o jsonpath='{.data.invocation\\.json}' |
    base64 -d` and `kubectl delete secret -n rollout NAME` (default flags: it waits)."""
    registry.create(NAMESPACES, None, {"metadata": {"name": "rollout"}})
    invocation = json.dumps({"spec_text": "metadata: {name: mirror}\n"}).encode()
    data = {"invocation.json": invocation, "journal.jsonl": b'{"kind":"run-started"}\n'}
    registry.create(
        SECRETS,
        "rollout",
        {
            "metadata": {"name": "rollout-mirror-run"},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        },
    )
    listed = json.loads(
        run_said(kubectl, "kubectl get secret -n rollout rollout-mirror-run -o json")
    )
    assert {k: base64.b64decode(v) for k, v in listed["data"].items()} == data
    read = run_said(
        kubectl,
        "kubectl get secret -n rollout rollout-mirror-run -o jsonpath='{.data.invocation\\.json}'",
    )
    assert base64.b64decode(read) == invocation
    deleted = run_said(kubectl, "kubectl delete secret -n rollout rollout-mirror-run")
    assert deleted == 'secret "rollout-mirror-run" deleted from rollout namespace\n'
    assert registry.list_objects(SECRETS, "rollout") == []


def test_the_least_privilege_kubeconfig_of_docs_permissions(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
    tmp_path: Path,
) -> None:
    """docs/permissions.md's five commands: apply rbac.yaml, create a token, set-credentials,
    set-context; the context then speaks as the ServiceAccount, held to its role."""
    add_node(registry, "gpu-1")
    registry.create(NAMESPACES, None, {"metadata": {"name": "gpu-operator"}})
    rbac = Path(__file__).parents[2] / "rollout" / "lab" / "data" / "rbac.yaml"
    kubectl("apply", "-f", str(rbac))
    token = run_said(kubectl, "kubectl create token rollout -n kube-system --duration=24h")
    run_said(kubectl, f'kubectl config set-credentials rollout --token="{token.strip()}"')
    cluster = run_said(kubectl, "kubectl config view --minify -o jsonpath='{.clusters[0].name}'")
    run_said(kubectl, f'kubectl config set-context rollout --cluster="{cluster}" --user=rollout')
    whoami = table(kubectl("--context", "rollout", "auth", "whoami").stdout)
    assert whoami[0] == {
        "ATTRIBUTE": "Username",
        "VALUE": "system:serviceaccount:kube-system:rollout",
    }
    assert table(kubectl("--context", "rollout", "get", "nodes").stdout)[0]["NAME"] == "gpu-1"
    refused = kubectl("--context", "rollout", "delete", "node", "gpu-1", check=False)
    assert refused.returncode == 1
    assert 'cannot delete resource "nodes"' in refused.stderr
    said = "kubectl auth can-i create pods --subresource=eviction -n default"
    assert kubectl("--context", "rollout", *shlex.split(said)[1:]).stdout == "yes\n"


def test_the_diagnose_commands(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
) -> None:
    """The commands diagnose's findings name (rollout/diagnose), on the objects they read."""
    add_node(registry, "gpu-1")
    label_node(registry, "gpu-1", {STATE_LABEL: "upgrade-required"})
    registry.mutate(
        NODES,
        None,
        "gpu-1",
        lambda n: n.setdefault("spec", {}).update(taints=[{"key": "gpu", "effect": "NoSchedule"}]),
    )
    add_plugin_daemonset(registry)
    add_pod(registry, "plugin-x", "gpu-1", labels={"app": "plugin"}, gpus=1)
    registry.create(
        CONFIGMAPS, "default", {"metadata": {"name": "time-slicing"}, "data": {"x4": "v1"}}
    )
    pods = table(run_said(kubectl, "kubectl get pods -A --field-selector spec.nodeName=gpu-1"))
    assert [(p["NAMESPACE"], p["NAME"]) for p in pods] == [("default", "plugin-x")]
    taints = run_said(kubectl, "kubectl get node gpu-1 -o jsonpath='{.spec.taints}'")
    assert json.loads(taints) == [{"effect": "NoSchedule", "key": "gpu"}]
    tolerations = run_said(
        kubectl,
        "kubectl get daemonset -n default plugin -o jsonpath='{.spec.template.spec.tolerations}'",
    )
    assert tolerations == ""
    wide = run_said(
        kubectl, "kubectl get pods -n default -o wide --field-selector spec.nodeName=gpu-1"
    )
    assert table(wide)[0]["NODE"] == "gpu-1"
    assert "Selector:" in run_said(kubectl, "kubectl describe daemonset -n default plugin")
    (row,) = table(run_said(kubectl, f"kubectl get node gpu-1 -L {STATE_LABEL}"))
    assert row["GPU-DRIVER-UPGRADE-STATE"] == "upgrade-required"
    shown = table(run_said(kubectl, "kubectl get node gpu-1 --show-labels"))[0]["LABELS"]
    assert f"{STATE_LABEL}=upgrade-required" in shown.split(",")
    configmap = run_said(kubectl, "kubectl get configmap -n default time-slicing -o yaml")
    assert "x4: v1" in configmap
    registry.create(RUNTIMECLASSES, None, {"metadata": {"name": "nvidia"}, "handler": "nvidia"})
    classes = table(run_said(kubectl, "kubectl get runtimeclass"))
    assert [(c["NAME"], c["HANDLER"]) for c in classes] == [("nvidia", "nvidia")]
    assert "Node:" in run_said(kubectl, "kubectl describe pod -n default plugin-x")
    assert "nodeName: gpu-1" in run_said(kubectl, "kubectl get pod -n default plugin-x -o yaml")
    assert "Events:" in run_said(kubectl, "kubectl describe daemonset -n default plugin")
    registry.write_log("default", "plugin-x", "main", "one\ntwo\n")
    logs = run_said(kubectl, "kubectl logs -n default plugin-x --all-containers --tail 20")
    assert logs == "one\ntwo\n"
    assert "Taints:             gpu:NoSchedule" in run_said(kubectl, "kubectl describe node gpu-1")


def test_apply_server_side_creates_merges_by_field_and_drops_what_it_gave_up(
    kubectl: Kubectl,  # noqa: F811
    registry: Registry,  # noqa: F811
) -> None:
    """`kubectl apply --server-side` (a PATCH of application/apply-patch+yaml with
    fieldManager=kubectl): created when absent; then the applied fields win, fields another
    writer set stay, and a field this manager applied before and leaves out goes."""

    def configmap(data: dict[str, str]) -> str:
        return json.dumps(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "time-slicing", "labels": {"app": "gpu"}},
                "data": data,
            }
        )

    first = kubectl("apply", "--server-side", "-f", "-", stdin=configmap({"a": "1", "b": "2"}))
    assert first.stdout == "configmap/time-slicing serverside-applied\n"
    stored = registry.get(CONFIGMAPS, "default", "time-slicing")
    assert stored["data"] == {"a": "1", "b": "2"}
    (entry,) = stored["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("kubectl", "Apply")
    assert entry["fieldsV1"] == {
        "f:data": {"f:a": {}, "f:b": {}},
        "f:metadata": {"f:labels": {"f:app": {}}},
    }
    kubectl("label", "configmap", "time-slicing", "owner=ops")
    again = kubectl("apply", "--server-side", "-f", "-", stdin=configmap({"a": "3"}))
    assert again.stdout == "configmap/time-slicing serverside-applied\n"
    stored = registry.get(CONFIGMAPS, "default", "time-slicing")
    assert stored["data"] == {"a": "3"}
    assert stored["metadata"]["labels"] == {"app": "gpu", "owner": "ops"}
    shown = json.loads(kubectl("get", "cm", "time-slicing", "-o", "json").stdout)
    assert "managedFields" not in shown["metadata"]  # kubectl hides them by default
    a_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "smoke"},
        "spec": {
            "nodeName": "gpu-1",
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    }
    add_node(registry, "gpu-1")
    kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(a_pod))
    a_pod["spec"]["containers"] = [{"name": "main", "image": "busybox:1.37"}]
    kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(a_pod))
    (container,) = registry.get(PODS, "default", "smoke")["spec"]["containers"]
    assert (container["name"], container["image"]) == ("main", "busybox:1.37")


def test_an_apply_without_a_field_manager_is_refused(registry: Registry) -> None:  # noqa: F811
    """kube-apiserver: 400 "fieldManager is required for apply requests"."""
    with ApiServer.start(registry) as server:
        request = urllib.request.Request(
            f"{server.url}/api/v1/namespaces/default/configmaps/x",
            data=b'{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"x"}}',
            method="PATCH",
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        # the body is read while the server still runs: stopping it first races the read
        body = json.loads(refused.value.read())
    assert refused.value.code == 400
    assert body["message"] == "fieldManager is required for apply requests"
    assert registry.list_objects(CONFIGMAPS, "default") == []
