"""Smoke pods through each lab node's real containerd CRI and the lab's real registry.

One lab of its own (the apply test breaks a node's mirror and rolls it back): a pod sandbox
with the RuntimeClass's handler, the image through the mirror, the container started by runc
through the `nvidia` handler's stand-in runtime, its log from containerd's log file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from rollout.cli import main
from rollout.lab.cluster import Lab
from rollout.lab.controlplane_process import LOG_FILE
from rollout.lab.nodes import NodeSpec
from rollout.lab.registry import REGISTRY_PORT, registry_host
from rollout.lab.registryimages import PULL_ONLY_SMOKE_IMAGE, SMOKE_IMAGE
from rollout.run import list_runs, read_run
from rollout.steps.gpu_smoke import SMOKE_CONTAINER, smoke_pod_manifest
from rollout.transports.kube import KubeClient, Pod
from rollout.transports.kube.cluster_state import Event
from tests.lab.converged import dump_of
from tests.lab.labapi import apply_args
from tests.lab.test_cluster_shared import own_lab, ssh_check

pytestmark = [pytest.mark.lab, pytest.mark.own_lab]

SMOKE_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    with own_lab(tmp_path_factory.mktemp("cri") / "lab", ("1.6", "2.1"), gpus=2) as built:
        yield built


def run_smoke_pod(
    kube: KubeClient, node: str, name: str, **spec: Any
) -> tuple[Pod, str, list[Event]]:
    """Create a smoke pod pinned to node; wait until it ends or a warning says why it cannot
    start. Returns the pod, its log and its warnings; the pod is deleted."""
    manifest = smoke_pod_manifest(name, node, "run-cri", SMOKE_IMAGE)
    manifest["spec"].update(spec)
    kube.create_pod("default", manifest)
    try:
        deadline = time.monotonic() + SMOKE_TIMEOUT_S
        while True:
            pod = kube.get_pod("default", name)
            warnings = [
                e
                for e in kube.list_events("default")
                if e.involved_name == name and e.event_type == "Warning"
            ]
            if pod.phase in ("Succeeded", "Failed") or warnings:
                break
            assert time.monotonic() < deadline, f"{name} still {pod.phase}"
            time.sleep(0.2)
        ran = pod.phase in ("Succeeded", "Failed")
        log = kube.read_pod_log("default", name, SMOKE_CONTAINER) if ran else ""
        return pod, log, warnings
    finally:
        kube.delete_pod("default", name, grace_period_s=0, missing_ok=True)


def node_uuids(lab: Lab, name: str) -> set[str]:
    return {gpu.uuid for gpu in lab.find_node(name).gpus}


def test_smoke_pod_runs_through_the_cri_and_logs_its_gpus(lab: Lab, kube: KubeClient) -> None:
    for spec in lab.nodes:
        pod, log, _ = run_smoke_pod(kube, spec.name, f"cri-smoke-{spec.name}")
        assert pod.phase == "Succeeded", (spec.name, pod)
        lines = log.splitlines()
        assert lines[0].startswith("GPU 0: ") and lines[-1] == spec.driver_version, log
        uuid = lines[0].rsplit("UUID: ", 1)[1].rstrip(")")
        assert uuid in node_uuids(lab, spec.name)
        # the container ran in the node's containerd: its sandbox goes with the pod
        assert_no_containers_left(lab, spec)


def assert_no_containers_left(lab: Lab, spec: NodeSpec) -> None:
    """Within 30 s, the node's containerd holds no sandbox nor container of a deleted pod (a
    removal that met containerd restarting, as in a rollback, is tried again)."""
    containers = ssh_check(lab, spec, ["ctr", "-n", "k8s.io", "containers", "ls", "-q"])
    deadline = time.monotonic() + 30
    while containers.strip() and time.monotonic() < deadline:
        time.sleep(0.2)
        containers = ssh_check(lab, spec, ["ctr", "-n", "k8s.io", "containers", "ls", "-q"])
    assert not containers.strip(), "the deleted pod's sandbox and container are removed"


def test_missing_handler_fails_as_containerd_reports_it(lab: Lab, kube: KubeClient) -> None:
    """A RuntimeClass whose handler no node's containerd has: the sandbox cannot be made."""
    create_runtime_class(lab, "nvidia-absent", "nvidia-absent")
    for spec in lab.nodes:
        pod, _, warnings = run_smoke_pod(
            kube, spec.name, f"cri-nohandler-{spec.name}", runtimeClassName="nvidia-absent"
        )
        assert pod.phase == "Pending" and "ContainerCreating" in pod.container_reasons
        (warning,) = warnings
        assert warning.reason == "FailedCreatePodSandBox"
        # containerd's own words (1.x and 2.x put it differently)
        assert warning.message.startswith("Failed to create pod sandbox: rpc error: code = ")
        assert 'no runtime for "nvidia-absent" is configured' in warning.message


def test_broken_mirror_port_fails_the_smoke_pod_and_rolls_back(
    lab: Lab, kube: KubeClient, tmp_path: Path
) -> None:
    """The plan mirrors nvcr.io to the lab registry; the smoke image is one no node has, so
    gpu.smoke pulls it through the plan's hosts.toml: a wrong port fails the pull and the node
    is rolled back; the right port pulls it and the node converges."""
    node = lab.nodes[0]
    registry = registry_host(node.address)
    wrong = registry.replace(f":{REGISTRY_PORT}", f":{REGISTRY_PORT + 1}")
    before = dump_of(lab, node.name)

    broken = mirror_plan(tmp_path / "broken.yaml", node.name, wrong)
    assert main(apply_args(lab, broken, tmp_path / "state-broken")) == 1
    (run,) = list_runs(tmp_path / "state-broken")
    state = read_run(tmp_path / "state-broken", run.run_id).node(node.name)
    assert state.outcome is not None and state.outcome.value == "rolled-back", state
    assert "gpu.smoke" in state.outcome_reason and "ErrImagePull" in state.outcome_reason
    # containerd's own words, as the kubelet put them in the container's waiting state
    assert f'failed to pull and unpack image "{PULL_ONLY_SMOKE_IMAGE}"' in state.outcome_reason
    assert dump_of(lab, node.name) == before
    assert_no_containers_left(lab, node)  # the sandbox the pulls were tried in went too

    good = mirror_plan(tmp_path / "good.yaml", node.name, registry)
    assert main(apply_args(lab, good, tmp_path / "state-good")) == 0
    images = ssh_check(lab, node, ["ctr", "-n", "k8s.io", "images", "ls", "-q"])
    assert PULL_ONLY_SMOKE_IMAGE in images.split(), "pulled through the plan's mirror"


def test_gpu_smoke_quotes_the_warning_that_keeps_its_pod_from_starting(
    lab: Lab, tmp_path: Path
) -> None:
    """The `nvidia` RuntimeClass names a handler no node's containerd has: the smoke pod's
    sandbox cannot be made, and gpu.smoke's failure quotes the kubelet's Warning event, in
    containerd's words, and blames that handler, not the node's `nvidia` one nor a log."""
    node = lab.nodes[1]  # the mirror test converges the first node: this plan would be a no-op
    replace_runtime_class(lab, "nvidia", "nvidia-absent")
    try:
        plan = mirror_plan(tmp_path / "plan.yaml", node.name, registry_host(node.address))
        # under rollout's least-privilege role: it may read the smoke pod's events
        assert main(apply_args(lab, plan, tmp_path / "state", lab.rollout_kubeconfig)) == 1
    finally:
        replace_runtime_class(lab, "nvidia", "nvidia")
    (run,) = list_runs(tmp_path / "state")
    state = read_run(tmp_path / "state", run.run_id).node(node.name)
    assert state.outcome is not None and state.outcome.value == "rolled-back", state
    said = state.outcome_reason
    assert "containers: ContainerCreating: not finished after" in said, said
    assert "\n  warning events, latest first:\n    Warning FailedCreatePodSandBox: Failed to " \
        "create pod sandbox: rpc error: code = " in said, said  # fmt: skip
    assert 'no runtime for "nvidia-absent" is configured' in said
    assert said.endswith(
        "  containerd on the node has no `nvidia-absent` runtime handler (the pod's "
        "RuntimeClass names it): check what containerd loads (rollout diagnose)"
    ), said
    assert "no log" not in said
    # the control plane's log says it too, where `rollout lab status` finds it
    logged = (lab.lab_dir / LOG_FILE).read_text()
    assert f"kubelet {node.name}: pod default/rollout-smoke-{node.name}-" in logged
    assert "FailedCreatePodSandBox: Failed to create pod sandbox: rpc error" in logged


def replace_runtime_class(lab: Lab, name: str, handler: str) -> None:
    """RuntimeClass.handler cannot change: the class is deleted and made again."""
    with config.new_client_from_config(str(lab.kubeconfig)) as api:
        client.NodeV1Api(api).delete_runtime_class(name)
    create_runtime_class(lab, name, handler)


def mirror_plan(path: Path, node: str, mirror: str) -> Path:
    path.write_text(
        f"""apiVersion: rollout/v1
kind: Plan
metadata:
  name: nvcr-mirror
targets:
  nodes: [{node}]
changes:
  - registry:
      host: nvcr.io
      server: https://nvcr.io
      endpoints:
        - url: http://{mirror}
          capabilities: [pull, resolve]
policy:
  waves: [1]
  max_unavailable: 1
  on_failure: rollback
  verify:
    smoke_image: {PULL_ONLY_SMOKE_IMAGE}
    smoke_timeout_s: 20
"""
    )
    return path


def create_runtime_class(lab: Lab, name: str, handler: str) -> None:
    body = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass"}
    body |= {"metadata": {"name": name}, "handler": handler}
    with config.new_client_from_config(str(lab.kubeconfig)) as api:
        client.NodeV1Api(api).create_runtime_class(body)
