"""The Kubernetes client never imports the official client's generated API classes.

kubernetes imports an API module with every model it names and builds its validators
(CoreV1Api 0.4 s, AppsV1Api 0.3 s here); KubeClient sends its requests over the client's
generic HTTP path instead, so neither `plan -i`'s reads nor `apply`'s writes load one.
Checked in a fresh interpreter, against the lab's API emulator; never timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def modules_after(steps: str) -> dict[str, list[str]]:
    """The kubernetes.client.api and .models modules imported after constructing a client,
    and after `steps` (which use `kube`, on an emulator serving a node n1 and a pod p)."""
    script = textwrap.dedent(
        f"""
        import json, sys
        from rollout.lab.apiserver import ApiServer, Registry
        from rollout.lab.apiserver.resources import NODES
        from rollout.transports.kube import KubeClient

        def loaded():
            return sorted(m for m in sys.modules if m.startswith(
                ("kubernetes.client.api.", "kubernetes.client.models.")))

        registry = Registry()
        for namespace in ("default", "kube-system"):
            registry.ensure_namespace(namespace)
        registry.create(NODES, None, {{"metadata": {{"name": "n1"}}}})
        with ApiServer.start(registry) as server, KubeClient.from_url(server.url) as kube:
            constructed = loaded()
            {steps}
            print(json.dumps({{"constructed": constructed, "after": loaded()}}))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    found: dict[str, list[str]] = json.loads(result.stdout.splitlines()[-1])
    return found


def test_plans_reads_load_no_api_class_and_no_model() -> None:
    steps = (
        "kube.list_nodes(); kube.get_node('n1'); kube.list_pods(field_selector='spec.nodeName=n1');"
        " kube.list_pdbs(); kube.list_daemonsets(); kube.list_runtime_classes()"
    )
    assert modules_after(steps) == {"constructed": [], "after": []}


def test_applys_writes_load_no_api_class() -> None:
    steps = (
        "from rollout.transports.kube import ConfigMap, Lease;"
        " kube.set_unschedulable('n1', True); kube.patch_node_labels('n1', {'a': 'b'});"
        " kube.create_event('default', 'n1', 'Cordoned', 'by rollout');"
        " kube.create_configmap(ConfigMap('default', 'c', {'k': 'v'}));"
        " kube.create_lease(Lease('kube-system', 'rollout', holder_identity='r'))"
    )
    assert modules_after(steps)["after"] == []


def test_only_a_pod_manifest_is_checked_against_the_clients_model() -> None:
    steps = (
        "kube.create_pod('default', {'metadata': {'name': 'p'}, 'spec': {'nodeName': 'n1',"
        " 'containers': [{'name': 'c', 'image': 'i'}]}})"
    )
    found = modules_after(steps)["after"]
    assert "kubernetes.client.models.v1_pod" in found
    assert not [m for m in found if m.startswith("kubernetes.client.api.")]
